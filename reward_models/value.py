"""Train a value critic: V(history) at every step of a trajectory, regressed on discounted returns.

A one-output regression head on any causal LM or encoder directory, read at the token that ends each step (the
same step reading as the process reward model; see `reward_models.steps`), trained with squared error to
``G_t = sum_k gamma^k r_{t+k}`` through the transformers `Trainer`.

``values()[t]`` is read at the end of step ``t``, after its decision, and estimates ``G_t``, the return from step
``t`` on, reward ``r_t`` included: in RL terms the value of decision ``t`` given the history before it, so it also
ranks candidate decisions for the same history (best-of-N).

To continue training it (the policy issue's PPO), load the directory with
``AutoModelForTokenClassification.from_pretrained`` (``num_labels`` is 1), read ``logits[..., 0]`` at the positions
`reward_models.steps.step_windows` gives, and save it again with ``save_pretrained``: the step settings travel in
its ``config.json``.

The data is the `returns` export: ``prompt``, ``completions`` (one piece per step: text, or message lists with the
row's ``tools`` in the stepwise export's conversational layout; see `reward_models.steps`) and ``rewards`` (the
environment's per-step rewards). Rows whose ``rewards`` is null get rewards from judge models instead: the reward model
in `reward_model` scores the whole trajectory and its score becomes the last step's reward, and the process reward
model in `prm` adds ``P(good) - 0.5`` to each step's. Each judge reads the trajectory as it was trained to:
conversational rows through its chat template with the row's tools (or as their transcript, for a judge trained on text
rows); text rows only reach judges trained on text, since nothing can render a transcript back into the chat template a
judge trained on conversations reads. Whole tasks are held out; on their steps the run reports the explained variance
``1 - Var(G - V) / Var(G)`` and the mean squared error, beside the baseline that predicts the training split's mean
return at each step index.

    python -m reward_models.value --data_path returns.jsonl --base_model var/policies/bootstrap \\
        --output_dir var/models/value --gamma 0.99 --max_steps 200
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, require
from reward_models.common.data import bad_rows, row_tools, rows_style, split_by_task
from reward_models.common.judge_config import start_judge
from reward_models.common.reporting import Reporter
from reward_models.conversation import Message
from reward_models.step_scorer import StepScorer
from reward_models.step_training import finish_step_head, fit_step_head
from reward_models.steps import StepHeadConfig, load_step_model, pieces_problem, regression_loss

if TYPE_CHECKING:
    import torch

KIND = "value_critic"
ID2LABEL = {0: "value"}


@dataclass
class ValueConfig(StepHeadConfig):
    output_dir: str = field(default="var/models/value", metadata={"help": "Where checkpoints and the model go."})
    gamma: float = field(default=0.99, metadata={"help": "Discount of the returns the critic regresses on."})
    reward_model: str = field(
        default="",
        metadata={"help": "A reward model directory; scores trajectories without rewards (the last step's reward)."},
    )
    prm: str = field(
        default="",
        metadata={"help": "A process reward model directory; adds P(good) - 0.5 to each step of such trajectories."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 <= self.gamma <= 1.0, "gamma", "must be between 0 and 1")


class ValueCritic(StepScorer):
    """The value of a trajectory's history at each of its steps.

    >>> critic = load_value_critic("var/models/value")  # doctest: +SKIP
    >>> critic.values("System: reach the goal G\\nUser: A G\\nAssistant:", [" goal is right 1 ; action right"])
    [0.96]
    """

    def from_outputs(self, outputs: torch.Tensor) -> list[float]:
        """V: the one-output head's value."""
        return outputs[:, 0].tolist()

    # V at the end of each step: of one trajectory (the returns export's `prompt`, `completions` and `tools`), of
    # many, and after every assistant turn of trajectory conversations.
    values = StepScorer.score_trajectory
    batch_values = StepScorer.score_trajectories
    conversation_values = StepScorer.score_conversations


def load_value_critic(path: str | Path, device: str | None = None) -> ValueCritic:
    """The value critic in directory `path` (on CUDA when there is one, unless `device` says otherwise)."""
    model, tokenizer = load_step_model(path, device)
    return ValueCritic(model, tokenizer)


# --- returns -----------------------------------------------------------------------------------------------------


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}`` for every step, the episode ending after the last."""
    returns, following = [], 0.0
    for reward in reversed(rewards):
        following = reward + gamma * following
        returns.append(following)
    return returns[::-1]


def row_problems(rows: Sequence[dict[str, Any]], config: ValueConfig) -> dict[int, str]:
    """The rows the critic cannot learn from, by number, and why: returns rows must have a prompt (text, or a list of
    messages), step pieces (text, or lists of messages, as the prompt is) and, unless null, one reward per piece."""
    return bad_rows(rows, _row_problem)


def _row_problem(row: dict[str, Any]) -> str | None:
    if problem := pieces_problem(row, "export the returns layout"):
        return problem
    completions, rewards = row["completions"], row.get("rewards")
    if rewards is not None and (not isinstance(rewards, list) or len(rewards) != len(completions)):
        return "rewards must be null or hold one number per completion"
    return None


def step_rewards(rows: Sequence[dict[str, Any]], config: ValueConfig, reporter: Reporter) -> list[list[float]]:
    """Each row's per-step rewards: the environment's, or for rows without them the judges' (see the module
    docstring). Rows without rewards and no judge configured are a `ConfigError` on `reward_model`."""
    for name in ("reward_model", "prm"):
        require(not getattr(config, name) or Path(getattr(config, name)).is_dir(), name, "no such model directory")
    unknown = [index for index, row in enumerate(rows) if row["rewards"] is None]
    rewards = [None if row["rewards"] is None else [float(r) for r in row["rewards"]] for row in rows]
    if not unknown:
        return rewards
    if not (config.reward_model or config.prm):
        raise ConfigError(
            "reward_model",
            f"{len(unknown)} of {len(rows)} trajectories have no rewards; give a reward_model (or prm) to score them",
        )
    reporter.log(f"scoring {len(unknown)} trajectories without rewards with the judge models")
    judged_rows = [rows[index] for index in unknown]
    judged = [[0.0] * len(row["completions"]) for row in judged_rows]
    tools = [row_tools(row) for row in judged_rows]
    text_rows = rows_style(judged_rows) == "text"
    if config.prm:
        from reward_models.prm import load_prm

        prm = load_prm(config.prm)
        prm.batch_size = config.batch_size
        if text_rows:
            _require_text_judge(prm.style, "prm")
            scored = prm.batch_step_scores([(row["prompt"], row["completions"]) for row in judged_rows])
        else:
            scored = prm.conversation_scores([_row_messages(row) for row in judged_rows], tools)
        for steps, scores in zip(judged, scored, strict=True):
            steps[:] = [score - 0.5 for score in scores]
    if config.reward_model:
        from reward_models.reward.model import load_reward_model

        reward_model = load_reward_model(config.reward_model)
        if text_rows:
            _require_text_judge(reward_model.style, "reward_model")
            completions = ["".join(row["completions"]) for row in judged_rows]
        else:
            completions = [[message for piece in row["completions"] for message in piece] for row in judged_rows]
        scores, _ = reward_model.score([row["prompt"] for row in judged_rows], completions, tools)
        for steps, score in zip(judged, scores, strict=True):
            steps[-1] += score
    for index, steps in zip(unknown, judged, strict=True):
        rewards[index] = steps
    return rewards


def _row_messages(row: dict[str, Any]) -> list[Message]:
    """A conversational returns row's trajectory: the prompt, then every piece's messages."""
    return [*row["prompt"], *(message for piece in row["completions"] for message in piece)]


def _require_text_judge(style: str, name: str) -> None:
    require(
        style == "text",
        name,
        "was trained on conversations and reads them through its chat template, but these returns rows are text; "
        "export the returns in the conversational style",
    )


# --- evaluation --------------------------------------------------------------------------------------------------


def explained_variance(targets: Sequence[float], predictions: Sequence[float]) -> float | None:
    """``1 - Var(G - V) / Var(G)``: 1 is perfect, 0 no better than a constant; None when the returns are constant."""
    n = len(targets)
    mean = sum(targets) / n
    variance = sum((g - mean) ** 2 for g in targets) / n
    if variance == 0:
        return None
    residuals = [g - v for g, v in zip(targets, predictions, strict=True)]
    residual_mean = sum(residuals) / n
    return 1.0 - sum((r - residual_mean) ** 2 for r in residuals) / n / variance


def evaluate(
    predicted: Sequence[Sequence[float]], returns: Sequence[Sequence[float]], train_returns: Sequence[Sequence[float]]
) -> dict[str, float]:
    """Held-out explained variance and mean squared error of `predicted` against `returns`, and the same for the
    baseline that predicts the training returns' mean at each step index (the overall mean past the longest)."""
    by_index: dict[int, list[float]] = defaultdict(list)
    for trajectory in train_returns:
        for index, value in enumerate(trajectory):
            by_index[index].append(value)
    overall = sum(sum(t) for t in train_returns) / sum(len(t) for t in train_returns)
    baseline = [
        [sum(by_index[i]) / len(by_index[i]) if i in by_index else overall for i in range(len(t))] for t in returns
    ]
    targets = [g for trajectory in returns for g in trajectory]
    metrics: dict[str, float] = {}
    for prefix, guesses in (("", predicted), ("baseline_step_mean_", baseline)):
        flat = [v for trajectory in guesses for v in trajectory]
        variance_explained = explained_variance(targets, flat)
        if variance_explained is not None:
            metrics[f"{prefix}explained_variance"] = variance_explained
        metrics[f"{prefix}mse"] = sum((g - v) ** 2 for g, v in zip(targets, flat, strict=True)) / len(targets)
    metrics.update(
        {
            "held_out_trajectories": len(returns),
            "held_out_steps": len(targets),
            "return_mean": sum(targets) / len(targets),
        }
    )
    return metrics


# --- training ----------------------------------------------------------------------------------------------------


def main(config: ValueConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train, save and evaluate a value critic; returns the summary (also stored in the directory's manifest)."""
    start = start_judge(config, KIND, "value critic", row_problems, reporter)
    if start.finished is not None:
        return start.finished
    reporter, local, rows = start.reporter, start.local, start.rows
    style = start.style
    returns = [discounted_returns(rewards, config.gamma) for rewards in step_rewards(rows, config, reporter)]
    for row, row_returns in zip(rows, returns, strict=True):
        row["returns"] = row_returns
    train_rows, eval_rows = split_by_task(rows, config.eval_fraction, config.seed)
    if not train_rows:
        raise ConfigError("data_path", "has no training rows after the held-out split")
    reporter.log(f"{len(train_rows)} training trajectories, {len(eval_rows)} held out")

    head = fit_step_head(
        local,
        train_rows,
        [row["returns"] for row in train_rows],
        id2label=ID2LABEL,
        style=style,
        reporter=reporter,
        compute_loss_func=regression_loss,
    )

    metrics: dict[str, float] = {}
    if eval_rows:
        predicted = ValueCritic(head.model, head.tokenizer, config.batch_size).score_rows(eval_rows)
        metrics = evaluate(predicted, [row["returns"] for row in eval_rows], [row["returns"] for row in train_rows])
        metrics["held_out_trajectories_with_rewards"] = sum(row["rewards"] is not None for row in eval_rows)
    judged = sum(row["rewards"] is None for row in rows)
    return finish_step_head(
        head, config, KIND, metrics, reporter, judged_trajectories=judged, eval_samples=len(eval_rows)
    )


if __name__ == "__main__":
    cli(ValueConfig, main, __doc__)
