"""The B-Pref scripted teacher a simulated annotator answers with: rationality, myopia, mistakes, skips and ties,
and the step labels, critiques and corrections it writes from the environment's oracle."""

from __future__ import annotations

import math

import pytest

from feedback_app.simulated.teacher import ScriptedTeacher, TeacherConfig, myopic_return
from reward_models.envs import GridWorld

# A 5x5 map with the goal four steps right of the start; up and left at the start bump into the edge.
CORRIDOR = {"seed": 0, "instruction": "reach the goal G", "layout": ["A...G", ".....", ".....", ".....", "....."]}
BEST = ["right"] * 4


@pytest.fixture
def oracle():
    return GridWorld().oracle(CORRIDOR)


def binomial_bounds(n: int, p: float, sigmas: float = 4.0) -> tuple[float, float]:
    """Where a count of n draws at probability p lies but for a chance below `sigmas` standard deviations."""
    spread = sigmas * math.sqrt(n * p * (1 - p))
    return n * p - spread, n * p + spread


def test_a_perfectly_rational_teacher_always_prefers_the_higher_return(oracle):
    teacher = ScriptedTeacher(TeacherConfig())
    worse = ["right", "right", "down"]
    assert {teacher.compare(oracle, BEST, worse) for _ in range(50)} == {"a"}
    assert {teacher.compare(oracle, worse, BEST) for _ in range(50)} == {"b"}


def test_a_finite_beta_prefers_the_better_one_with_the_bradley_terry_probability(oracle):
    better, worse = ["right", "right"], ["right"]  # progress 0.25 against 0.125
    margin = myopic_return(oracle, better) - myopic_return(oracle, worse)
    assert margin == pytest.approx(0.125)
    beta = 1.0 / margin  # P(better) = sigmoid(1) = 0.731
    teacher = ScriptedTeacher(TeacherConfig(beta=beta, seed=3))
    n = 2000
    wins = sum(teacher.compare(oracle, better, worse) == "a" for _ in range(n))
    low, high = binomial_bounds(n, 1 / (1 + math.exp(-1)))
    assert low <= wins <= high
    coin = ScriptedTeacher(TeacherConfig(beta=0.0, seed=3))
    low, high = binomial_bounds(n, 0.5)
    assert low <= sum(coin.compare(oracle, better, worse) == "a" for _ in range(n)) <= high


def test_myopia_weighs_the_last_steps_most(oracle):
    # Both end three steps from the goal; one got there early and then stepped back, the other only at the end.
    early_then_back, late = ["right", "right", "left"], ["up", "up", "right"]
    assert ScriptedTeacher(TeacherConfig(gamma=1.0)).compare(oracle, early_then_back, late) == "tie"
    assert ScriptedTeacher(TeacherConfig(gamma=0.5)).compare(oracle, early_then_back, late) == "b"


def test_mistakes_flip_the_choice_at_the_configured_rate_but_never_a_tie(oracle):
    teacher = ScriptedTeacher(TeacherConfig(epsilon=0.25, seed=11))
    n = 2000
    flipped = sum(teacher.compare(oracle, BEST, ["down"]) == "b" for _ in range(n))
    low, high = binomial_bounds(n, 0.25)
    assert low <= flipped <= high
    always_wrong = ScriptedTeacher(TeacherConfig(epsilon=1.0))
    assert always_wrong.compare(oracle, BEST, ["down"]) == "b"
    assert always_wrong.compare(oracle, ["up"], ["left"]) == "tie"


def test_the_teacher_skips_pairs_where_neither_is_good_enough(oracle):
    teacher = ScriptedTeacher(TeacherConfig(skip_threshold=0.5))
    assert teacher.compare(oracle, ["right"], ["down"]) is None  # best return 0.125
    assert teacher.compare(oracle, BEST, ["down"]) == "a"  # a success scores above 1


def test_returns_within_the_equal_threshold_are_a_tie(oracle):
    teacher = ScriptedTeacher(TeacherConfig(equal_threshold=0.2))
    assert teacher.compare(oracle, ["right", "right"], ["right"]) == "tie"  # 0.125 apart
    assert teacher.compare(oracle, BEST, ["right"]) == "a"


def test_the_same_seed_gives_the_same_answers(oracle):
    def answers(seed: int) -> list:
        teacher = ScriptedTeacher(TeacherConfig(beta=4.0, epsilon=0.2, seed=seed))
        return [teacher.compare(oracle, ["right", "right"], ["right"]) for _ in range(40)]

    assert answers(5) == answers(5)
    assert answers(5) != answers(6)


def test_step_labels_follow_the_oracle_and_mistakes_flip_them(oracle):
    actions = ["right", "down", "up", "right"]
    assert oracle.step_correct(actions) == [True, False, True, True]
    assert ScriptedTeacher(TeacherConfig()).step_values(oracle, actions) == [1, -1, 1, 1]
    assert ScriptedTeacher(TeacherConfig(epsilon=1.0)).step_values(oracle, actions) == [-1, 1, -1, -1]


def test_the_critique_names_the_first_wrong_step_and_the_better_action(oracle):
    teacher = ScriptedTeacher(TeacherConfig())
    assert teacher.critique(oracle, ["right", "down", "up"]) == (
        "step 2 is wrong : down moves away from the goal ; right was better"
    )
    assert teacher.critique(oracle, BEST) == "every step moves toward the goal ; the agent reaches the goal"


def test_the_correction_is_the_oracles_best_action_at_the_first_wrong_step(oracle):
    teacher = ScriptedTeacher(TeacherConfig())
    assert teacher.correction(oracle, ["right", "right", "left", "right"]) == (2, "right")
    assert teacher.correction(oracle, BEST) is None


def test_mistakes_misplace_the_critique_s_and_the_correction_s_step_at_the_mistake_rate(oracle):
    actions = ["right", "right", "left", "right"]  # the third step is the first wrong one
    always = ScriptedTeacher(TeacherConfig(epsilon=1.0, seed=3))
    for _ in range(20):
        # Always mistaken: never the third step; a right step has no other best action here, so nothing is corrected.
        assert always.correction(oracle, actions) is None
        assert not always.critique(oracle, actions).startswith("step 3 is wrong")
    # A one-step trajectory has no other step: the mistake misses its error.
    assert always.critique(oracle, ["left"]).startswith("every step moves toward the goal")
    draws = 2000
    teacher = ScriptedTeacher(TeacherConfig(epsilon=0.2, seed=4))
    right = sum(teacher.correction(oracle, actions) == (2, "right") for _ in range(draws))
    low, high = binomial_bounds(draws, 0.8)
    assert low <= right <= high


def test_teacher_settings_from_json_name_the_bad_field():
    assert TeacherConfig.from_dict({"beta": "inf", "epsilon": 0.1}) == TeacherConfig(epsilon=0.1)
    with pytest.raises(ValueError, match="^gama: unknown teacher setting"):
        TeacherConfig.from_dict({"gama": 0.9})
    with pytest.raises(ValueError, match=r"^gamma: must be in \(0, 1\]"):
        TeacherConfig.from_dict({"gamma": 0})
    with pytest.raises(ValueError, match="^epsilon: expected a number"):
        TeacherConfig.from_dict({"epsilon": "often"})
    with pytest.raises(ValueError, match="^beta: expected a number or 'inf'"):
        TeacherConfig.from_dict({"beta": "rational"})
