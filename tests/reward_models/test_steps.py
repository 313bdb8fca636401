"""How the per-step heads (the process reward model and the value critic) fit a long trajectory into `max_length`
tokens: windows that read every step after as much of its past as fits, with a tiny untrained Llama on CPU."""

from __future__ import annotations

import pytest

from reward_models.prm import ProcessRewardModel
from reward_models.steps import prepare_tokenizer, step_windows
from reward_models.value import ValueCritic
from simulation.episodes import scripted_episodes
from simulation.oracle_data import returns_rows

# A 4x4 grid with an 8-step limit keeps a trajectory near 200 tokens, so 64 tokens hold a few of its steps.
SMALL_GRID = {"size": 4, "max_steps": 8}
MAX_LENGTH = 64


@pytest.fixture(scope="module")
def tokenizer(tiny_base_model):
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_base_model))


def longest_row(style: str) -> dict:
    """The returns row of the longest scripted gridworld trajectory, in `style`."""
    episodes = scripted_episodes(12, per_task=2, seed=0, env_config=SMALL_GRID)
    return max(returns_rows(episodes, style=style), key=lambda row: len(row["completions"]))


def untrained_head(base_model, tokenizer, head: type, num_labels: int, style: str, max_length: int):
    """A per-step head (`head`: the value critic or the PRM) on the untrained base model, reading rows of `style` in
    windows of `max_length` tokens."""
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(base_model, num_labels=num_labels)
    model.config.update(
        {
            "step_separator": "",
            "step_max_length": max_length,
            "step_style": style,
            "pad_token_id": tokenizer.pad_token_id,
        }
    )
    return head(model.eval(), tokenizer)


def read(head, row: dict, steps: int) -> list[float]:
    """What `head` says of each of the first `steps` steps of `row`: V, or P(good)."""
    completions = row["completions"][:steps]
    if isinstance(head, ValueCritic):
        return head.values(row["prompt"], completions)
    return head.step_scores(row["prompt"], completions)


@pytest.mark.parametrize("style", ["conversational", "text"])
def test_every_step_of_a_long_trajectory_is_read_after_as_much_of_its_past_as_fits(tokenizer, style):
    row = longest_row(style)
    [whole] = step_windows(tokenizer, row["prompt"], row["completions"], "", 4096)
    assert len(whole.input_ids) > 2 * MAX_LENGTH
    windows = step_windows(tokenizer, row["prompt"], row["completions"], "", MAX_LENGTH)
    assert [step for window in windows for step in window.steps] == list(range(len(row["completions"])))
    for window in windows:
        assert len(window.input_ids) <= MAX_LENGTH and window.input_ids[0] == tokenizer.bos_token_id
        for position, step in zip(window.positions, window.steps, strict=True):
            at = whole.positions[step]
            # <bos>, then the trajectory up to the step: all of it, or as much of its end as the window holds.
            assert position == min(at, MAX_LENGTH - 1), f"step {step} is read after {position - 1} of its tokens"
            assert window.input_ids[1 : position + 1] == whole.input_ids[at - position + 1 : at + 1]


@pytest.mark.parametrize(("head", "num_labels"), [(ValueCritic, 1), (ProcessRewardModel, 2)])
@pytest.mark.parametrize("style", ["conversational", "text"])
def test_a_step_is_scored_the_same_however_many_steps_follow_it(tiny_base_model, tokenizer, head, num_labels, style):
    row = longest_row(style)
    cut = untrained_head(tiny_base_model, tokenizer, head, num_labels, style, MAX_LENGTH)
    uncut = untrained_head(tiny_base_model, tokenizer, head, num_labels, style, 4096)
    steps = len(row["completions"])
    scores = read(cut, row, steps)
    # Each step read as the last of the trajectory so far, as an online trainer reads it mid-episode: a causal LM
    # that sees as much of the past as fits gives it the same score as in the whole trajectory.
    assert [read(cut, row, step + 1)[step] for step in range(steps)] == pytest.approx(scores, abs=1e-6)
    # The cut is real: the later steps, which lose the start of the trajectory, score otherwise without it.
    assert read(uncut, row, steps)[-1] != pytest.approx(scores[-1], abs=1e-6)
