"""Active query selection: which pairs the queue asks about (random, ensemble disagreement, uncertainty, new against
parent), the strategy recorded on every item and label, and rollout runs that queue their own trajectories."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from feedback_app.labelling import submit_comparison
from feedback_app.models import Comparison, PolicyVersion, QueueItem, RegisteredModel, RunStatus, Step, TrainingRun
from feedback_app.models import Trajectory as TrajectoryRow
from feedback_app.queue import next_assignment
from tests.trajectories import save_steps
from training.rollouts import RolloutConfig, create_rollout_run, run_rollout
from training.runs import execute_run
from training.selection import (
    LOW_REWARD,
    SelectionOptions,
    candidate_pairs,
    member_rewards,
    newest_reward_model,
    queue_selection,
    queue_step_reviews,
    select_pairs,
)

pytestmark = pytest.mark.django_db


class StubEnsemble:
    """A reward-model ensemble with fixed member rewards per trajectory, found by the tag its steps carry: the
    scorer sees only what `member_rewards` hands it, the trajectories' conversations."""

    def __init__(self, rewards_by_tag: dict[str, list[float]]) -> None:
        self.rewards_by_tag = rewards_by_tag
        self.calls = 0

    def member_rewards(self, prompts, completions) -> list[list[float]]:
        self.calls += 1
        assert len(prompts) == len(completions)
        tags = [self._tag(prompt, completion) for prompt, completion in zip(prompts, completions, strict=True)]
        members = len(next(iter(self.rewards_by_tag.values())))
        return [[self.rewards_by_tag[tag][m] for tag in tags] for m in range(members)]

    def _tag(self, prompt, completion) -> str:
        text = " ".join(message["content"] for message in [*prompt, *completion])
        (tag,) = [tag for tag in self.rewards_by_tag if f"[{tag}]" in text]
        return tag


@pytest.fixture
def tagged(project, task, external_policy):
    """tagged(tag, task=..., policy=..., n_steps=3) -> a stored policy trajectory whose steps mention `[tag]`."""

    def make(tag: str, *, on_task=None, policy=None, n_steps: int = 3) -> TrajectoryRow:
        trajectory = TrajectoryRow.objects.create(
            project=project,
            task=on_task or task,
            policy_version=policy or external_policy,
            source="policy",
            num_steps=n_steps,
        )
        save_steps(
            trajectory,
            [
                Step(index=i, observation=f"obs {i}", reasoning=f"[{tag}] step {i}", action="up")
                for i in range(n_steps)
            ],
        )
        return trajectory

    return make


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def ids(pairs) -> list[tuple[int, int]]:
    return [tuple(sorted((a.pk, b.pk))) for a, b in pairs]


# --- disagreement and uncertainty ----------------------------------------------------------------------------------


def test_disagreement_picks_the_pair_the_ensemble_members_disagree_on_most(project, tagged):
    rewards = {
        "calm": [0.0, 0.0, 0.0],
        "up": [2.0, -2.0, 0.0],  # members split on it
        "down": [-2.0, 2.0, 0.0],  # split the other way: against "up" the members disagree the most
        "high": [3.0, 3.0, 3.0],  # far from "calm", but every member says so
    }
    t = {tag: tagged(tag) for tag in rewards}
    candidates = candidate_pairs(project, list(t.values()))
    assert len(candidates) == 6

    chosen = select_pairs(candidates, 2, "disagreement", scorer=StubEnsemble(rewards))

    assert ids(chosen[:1]) == ids([(t["up"], t["down"])])

    # The score is the members' standard deviation of P(A > B) = sigmoid(r_A - r_B).
    def spread(pair: tuple[str, str]) -> float:
        return statistics.pstdev(sigmoid(ra - rb) for ra, rb in zip(rewards[pair[0]], rewards[pair[1]], strict=True))

    runners_up = [("calm", "up"), ("calm", "down"), ("high", "up"), ("high", "down")]
    second = max(runners_up, key=spread)
    assert spread(("up", "down")) > spread(second) > spread(("high", "up"))
    expected_second = (t[second[0]], t[second[1]])
    assert ids(chosen[1:]) == ids([expected_second])
    everything = select_pairs(candidates, 6, "disagreement", scorer=StubEnsemble(rewards))
    assert ids(everything[-1:]) == ids([(t["calm"], t["high"])]), "members that agree give no reason to ask"


def test_uncertainty_picks_the_pairs_whose_preference_is_nearest_a_coin_toss(project, tagged):
    rewards = {"a": [0.0, 0.0], "b": [0.1, 0.1], "c": [2.0, 2.0], "d": [-1.0, -1.0]}
    t = {tag: tagged(tag) for tag in rewards}

    chosen = select_pairs(candidate_pairs(project, list(t.values())), 3, "uncertainty", scorer=StubEnsemble(rewards))

    # |P - 1/2|: a-b 0.025, a-d 0.231, b-d 0.250, then a-c 0.381, b-c 0.370, c-d 0.453.
    assert ids(chosen) == ids([(t["a"], t["b"]), (t["a"], t["d"]), (t["b"], t["d"])])


def test_the_reward_model_strategies_need_a_scorer_and_disagreement_an_ensemble(project, tagged):
    candidates = candidate_pairs(project, [tagged("x"), tagged("y")])
    with pytest.raises(ValueError, match="scorer"):
        select_pairs(candidates, 1, "uncertainty")
    with pytest.raises(ValueError, match="at least two members"):
        select_pairs(candidates, 1, "disagreement", scorer=StubEnsemble({"x": [1.0], "y": [0.0]}))
    with pytest.raises(ValueError, match="strategy must be one of"):
        select_pairs(candidates, 1, "loudest")


def test_a_one_member_reward_model_ranks_disagreement_by_uncertainty_and_records_it(project, tagged):
    project.query_strategy = "disagreement"
    t = {tag: tagged(tag) for tag in ("x", "y", "z")}
    scorer = StubEnsemble({"x": [0.0], "y": [0.05], "z": [4.0]})

    result = queue_selection(project, list(t.values()), 1, SelectionOptions(scorer=scorer))

    assert [(i.trajectory_id, i.other_trajectory_id) for i in result.items] == ids([(t["x"], t["y"])])
    assert result.by_strategy() == {"uncertainty": 1}
    assert "one member" in result.notes[0]


# --- random ------------------------------------------------------------------------------------------------------


def test_random_selection_is_seeded_and_within_budget(project, tagged, task):
    from feedback_app.models import Task

    other_task = Task.objects.create(project=project, instruction="reach the goal", seed=8, spec={"seed": 8})
    trajectories = [tagged(f"r{i}") for i in range(5)] + [tagged(f"s{i}", on_task=other_task) for i in range(3)]
    candidates = candidate_pairs(project, trajectories)
    assert len(candidates) == 10 + 3  # pairs within each task only

    first = select_pairs(candidates, 4, "random", rng=random.Random(3))
    again = select_pairs(candidates, 4, "random", rng=random.Random(3))
    other = select_pairs(candidates, 4, "random", rng=random.Random(4))

    assert ids(first) == ids(again) and ids(first) != ids(other)
    assert len(first) == 4 and len(set(ids(first))) == 4 and set(ids(first)) <= set(ids(candidates))
    assert len(select_pairs(candidates, 100, "random", rng=random.Random(0))) == 13
    assert select_pairs(candidates, 0, "random") == []


def test_candidates_leave_out_pairs_already_queued_and_trajectories_without_steps(project, tagged):
    a, b, c = tagged("a"), tagged("b"), tagged("c")
    empty = tagged("e", n_steps=0)
    QueueItem.objects.enqueue_comparisons(project, [(b, a)])

    assert ids(candidate_pairs(project, [a, b, c, empty])) == ids([(a, c), (b, c)])


# --- new against parent ------------------------------------------------------------------------------------------


@pytest.fixture
def lineage(project):
    v1 = PolicyVersion.objects.create(project=project, name="v1", kind="external")
    v2 = PolicyVersion.objects.create(project=project, name="v2", kind="external", parent=v1)
    v3 = PolicyVersion.objects.create(project=project, name="v3", kind="external", parent=v2)
    return v1, v2, v3


def test_new_vs_parent_picks_child_parent_pairs_newest_version_first_spread_over_tasks(project, tagged, task, lineage):
    from feedback_app.models import Task

    v1, v2, v3 = lineage
    task2 = Task.objects.create(project=project, instruction="reach the goal", seed=8, spec={"seed": 8})
    old = [tagged("v1a", policy=v1), tagged("v1b", policy=v1), tagged("v1c", policy=v1, on_task=task2)]
    mid = [tagged("v2a", policy=v2), tagged("v2b", policy=v2), tagged("v2c", policy=v2, on_task=task2)]
    new = [tagged("v3a", policy=v3)]

    chosen = select_pairs(candidate_pairs(project, [*old, *mid, *new]), 100, "new_vs_parent")

    # v3 against v2 first (v3 is newest), then v2 against v1 taking each task's first pair before any second one;
    # never a grandparent (v3 against v1) or a version against itself.
    assert [(child.pk, parent.pk) for child, parent in chosen[:2]] == [(new[0].pk, mid[0].pk), (new[0].pk, mid[1].pk)]
    assert [(child.pk, parent.pk) for child, parent in chosen[2:4]] == [(mid[0].pk, old[0].pk), (mid[2].pk, old[2].pk)]
    assert len(chosen) == 2 + 4 + 1
    assert all(child.policy_version.parent_id == parent.policy_version_id for child, parent in chosen)


def test_new_vs_parent_queues_against_the_parents_rollouts_and_fills_the_budget_with_random_pairs(
    project, tagged, lineage
):
    v1, v2, _ = lineage
    parents = [tagged("p1", policy=v1), tagged("p2", policy=v1)]
    fresh = [tagged("n1", policy=v2), tagged("n2", policy=v2)]
    project.query_strategy = "new_vs_parent"
    project.save()

    result = queue_selection(project, fresh, 6)

    assert result.by_strategy() == {"new_vs_parent": 4, "random": 1}  # 2 x 2 against the parent, then n1-n2
    fill = next(item for item in result.items if item.query_strategy == "random")
    assert {fill.trajectory_id, fill.other_trajectory_id} == {fresh[0].pk, fresh[1].pk}
    assert {i.other_trajectory_id for i in result.items if i.query_strategy == "new_vs_parent"} <= {
        p.pk for p in [*parents, *fresh]
    }
    assert "fill the budget" in result.notes[0]
    assert QueueItem.objects.filter(project=project).count() == 5


# --- the strategy on items and labels ----------------------------------------------------------------------------


def test_without_a_reward_model_disagreement_falls_back_to_random_and_says_so(project, tagged):
    project.query_strategy = "disagreement"
    project.save()
    lines = []
    failed = TrainingRun.objects.create(project=project, kind="reward_model", status=RunStatus.FAILED)
    RegisteredModel.objects.create(project=project, name="broken", kind="reward_model", path="/nowhere", run=failed)
    assert newest_reward_model(project) is None, "a registered model of a run that did not succeed is not used"

    trajectories = [tagged("a"), tagged("b"), tagged("c")]
    items = queue_selection(project, trajectories, 2, SelectionOptions(log=lines.append)).items

    assert len(items) == 2 and {item.query_strategy for item in items} == {"random"}
    assert lines == ["the project has no reward model yet: disagreement selection fell back to random"]


def test_a_label_on_a_disagreement_item_records_disagreement(project, tagged, annotator):
    project.query_strategy = "disagreement"
    project.overlap = 1
    project.gold_fraction = 0.0
    project.save()
    scorer = StubEnsemble({"a": [1.0, -1.0], "b": [0.0, 0.0]})
    (item,) = queue_selection(project, [tagged("a"), tagged("b")], 1, SelectionOptions(scorer=scorer)).items
    assert item.query_strategy == "disagreement"

    assignment = next_assignment(annotator, project)
    stored = submit_comparison(annotator, assignment, choice="a")

    assert assignment.item_id == item.pk
    assert Comparison.objects.get(pk=stored.label.pk).query_strategy == "disagreement"


def test_a_label_through_the_api_on_a_disagreement_item_records_disagreement(project, tagged, annotator):
    from rest_framework.test import APIClient

    project.overlap, project.gold_fraction = 1, 0.0
    project.save()
    scorer = StubEnsemble({"a": [1.0, -1.0], "b": [0.0, 0.0]})
    queue_selection(project, [tagged("a"), tagged("b")], 1, SelectionOptions(strategy="disagreement", scorer=scorer))
    assignment = next_assignment(annotator, project)
    client = APIClient()
    client.force_login(annotator)

    response = client.post(
        f"/api/projects/{project.pk}/comparisons/",
        {
            "assignment": assignment.pk,
            "trajectory_a": assignment.item.trajectory_id,
            "trajectory_b": assignment.item.other_trajectory_id,
            "choice": "b",
        },
        format="json",
    )

    assert response.status_code == 201, response.content
    assert response.json()["query_strategy"] == "disagreement"


def test_step_labels_go_to_the_lowest_scored_trajectories_under_a_reward_model_strategy(project, tagged):
    t = {tag: tagged(tag) for tag in ("good", "bad", "worse", "fine")}
    scorer = StubEnsemble({"good": [2.0, 2.2], "bad": [-1.0, -0.5], "worse": [-3.0, -2.0], "fine": [0.5, 0.4]})

    result = queue_step_reviews(project, list(t.values()), 2, SelectionOptions(strategy="uncertainty", scorer=scorer))

    assert {item.trajectory_id for item in result.items} == {t["bad"].pk, t["worse"].pk}
    assert result.by_strategy() == {LOW_REWARD: 2}
    again = queue_step_reviews(project, list(t.values()), 2, SelectionOptions(strategy="random"))
    assert {item.trajectory_id for item in again.items} == {t["good"].pk, t["fine"].pk}, "queued ones are skipped"
    assert again.by_strategy() == {"random": 2}


# --- rollout runs ------------------------------------------------------------------------------------------------


def test_a_rollout_run_queues_comparisons_and_step_labels_by_the_projects_strategy(project, tiny_policy, review_tasks):
    project.query_strategy = "uncertainty"  # no reward model yet: random, and the run says so
    project.save()
    config = RolloutConfig(num_tasks=3, samples_per_task=3, seed=2, queue_comparisons=4, queue_step_labels=2)
    run = create_rollout_run(project, tiny_policy, config)

    assert execute_run(run.pk, run_rollout) == RunStatus.SUCCEEDED

    run.refresh_from_db()
    pairs = QueueItem.objects.filter(project=project, kind="comparison").select_related(
        "trajectory", "other_trajectory"
    )
    assert pairs.count() == 4 and {item.query_strategy for item in pairs} == {"random"}
    for item in pairs:
        assert item.trajectory.rollout_run_id == item.other_trajectory.rollout_run_id == run.pk
        assert item.trajectory.task_id == item.other_trajectory.task_id
    singles = QueueItem.objects.filter(project=project, kind="step_label")
    assert singles.count() == 2 and {item.query_strategy for item in singles} == {"random"}
    queued = run.summary["queued"]
    assert queued["comparisons"] == 4 and queued["comparisons_by_strategy"] == {"random": 4}
    assert queued["step_labels"] == 2 and queued["project_strategy"] == "uncertainty"
    assert any("fell back to random" in note for note in queued["notes"])
    assert "fell back to random" in run.log and "queued 4 comparisons" in run.log

    # A worker that died after queueing but before marking the run done is taken up again: nothing is queued twice.
    TrainingRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    assert execute_run(run.pk, run_rollout) == RunStatus.SUCCEEDED
    assert QueueItem.objects.filter(project=project).count() == 6
    run.refresh_from_db()
    assert run.summary["queued"]["comparisons"] == 4


@pytest.mark.django_db(transaction=True)
def test_a_rollout_run_scores_its_trajectories_before_its_queueing_transaction(
    project, tiny_policy, review_tasks, monkeypatch
):
    # On SQLite a transaction holds the one write lock from its start: scoring inside it kept every label waiting.
    from django.db import connection

    from training import rollouts

    class Recording:
        """A two-member ensemble that notes whether a transaction was open each time it scored."""

        def __init__(self) -> None:
            self.in_transaction: list[bool] = []

        def member_rewards(self, prompts, completions):
            self.in_transaction.append(connection.in_atomic_block)
            first = [float(len(str(completion))) for completion in completions]
            return [first, [value * (-1) ** index for index, value in enumerate(first)]]

    scorer = Recording()
    monkeypatch.setattr(rollouts, "newest_reward_model", lambda project: scorer)
    project.query_strategy = "disagreement"
    project.save()
    config = RolloutConfig(num_tasks=3, samples_per_task=3, seed=2, queue_comparisons=4, queue_step_labels=2)
    run = create_rollout_run(project, tiny_policy, config)

    assert execute_run(run.pk, run_rollout) == RunStatus.SUCCEEDED

    assert scorer.in_transaction == [False], "scored once, before the transaction"
    strategies = QueueItem.objects.filter(project=project).values_list("kind", "query_strategy")
    assert sorted(set(strategies)) == [("comparison", "disagreement"), ("step_label", LOW_REWARD)]


def test_rollout_config_refuses_a_negative_queue_budget_naming_the_field():
    with pytest.raises(ValueError, match="queue_comparisons must be a whole number of at least 0"):
        RolloutConfig(queue_comparisons=-1)
    with pytest.raises(ValueError, match="queue_step_labels"):
        RolloutConfig.from_dict({"queue_step_labels": "3"})


def test_the_rollout_launch_api_takes_the_queue_settings(project, tiny_policy, review_tasks, researcher):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(researcher)
    url = f"/api/projects/{project.pk}/runs/"

    bad = client.post(url, {"policy_version": tiny_policy.pk, "config": {"queue_comparisons": -2}}, format="json")
    good = client.post(
        url,
        {"policy_version": tiny_policy.pk, "config": {"queue_comparisons": 5, "queue_step_labels": 1}},
        format="json",
    )

    assert bad.status_code == 400 and "queue_comparisons" in str(bad.json()["config"])
    assert good.status_code == 201, good.content
    run = TrainingRun.objects.get(pk=good.json()["id"])
    assert (run.config["queue_comparisons"], run.config["queue_step_labels"]) == (5, 1)


# --- a real reward-model ensemble --------------------------------------------------------------------------------


def test_a_trained_reward_model_ensemble_picks_the_pairs_its_members_disagree_on(
    project, tiny_policy, review_tasks, tiny_base_model, tmp_path, annotator
):
    from feedback_app.exports import ExportFilters, ExportKind, export_rows
    from feedback_app.exports.conversation import fetch_conversations
    from reward_models.reward.config import RewardConfig
    from reward_models.reward.model import load_reward_model
    from reward_models.reward.train import main as train_reward_model
    from simulation.episodes import scripted_episodes
    from simulation.oracle_data import preference_rows, write_jsonl

    # Two members, two steps each, no held-out split: seconds, and members that differ (each has its own seed).
    data = write_jsonl(preference_rows(scripted_episodes(4, per_task=3, seed=3)), tmp_path / "pairs.jsonl")
    config = RewardConfig(
        data_path=str(data),
        base_model=str(tiny_base_model),
        output_dir=str(tmp_path / "rm"),
        max_steps=2,
        eval_fraction=0.0,
        ensemble_size=2,
        ensemble_mode="bootstrap",
    )
    train_reward_model(config)
    rm_run = TrainingRun.objects.create(project=project, kind="reward_model", status=RunStatus.SUCCEEDED)
    RegisteredModel.objects.create(
        project=project, name="rm", kind="reward_model", path=config.output_dir, run=rm_run, base_model="tiny"
    )
    project.query_strategy, project.overlap, project.gold_fraction = "disagreement", 1, 0.0
    project.save()
    rollout = create_rollout_run(project, tiny_policy, RolloutConfig(num_tasks=2, samples_per_task=3, seed=1))
    assert execute_run(rollout.pk, run_rollout) == RunStatus.SUCCEEDED
    trajectories = list(TrajectoryRow.objects.filter(rollout_run=rollout).order_by("id"))

    items = queue_selection(project, trajectories, 2).items

    assert len(items) == 2 and {item.query_strategy for item in items} == {"disagreement"}
    # The expected pairs, from the model's own pairwise API: the members' spread of P(A > B).
    model = load_reward_model(config.output_dir)
    assert newest_reward_model(project) is newest_reward_model(project), "loaded once per directory"
    candidates = candidate_pairs(project, trajectories) + [(i.trajectory, i.other_trajectory) for i in items]
    conversations = fetch_conversations([t.pk for t in trajectories])
    messages = [(conversations[a.pk].messages, conversations[b.pk].messages) for a, b in candidates]
    _, spread = model.preference_probabilities(
        [m[:2] for m, _ in messages], [m[2:] for m, _ in messages], [n[2:] for _, n in messages]
    )
    assert max(spread) > 0, "the members differ"
    expected = sorted(range(len(candidates)), key=lambda i: -spread[i])[:2]
    assert {(i.trajectory_id, i.other_trajectory_id) for i in items} == set(ids([candidates[i] for i in expected]))

    # The reward model reads a trajectory the way it reads the preference export a label of it becomes.
    assignment = next_assignment(annotator, project)
    submit_comparison(annotator, assignment, choice="a")
    (row,) = [row.values for row in export_rows(project, ExportKind("preference"), ExportFilters())]
    chosen = TrajectoryRow.objects.get(pk=row["chosen_trajectory_id"])
    from_export = model.member_rewards([row["prompt"]], [row["chosen"]])
    from_selection = member_rewards([chosen], model)[chosen.pk]
    assert [member[0] for member in from_export] == pytest.approx(from_selection)
