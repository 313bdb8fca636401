"""Train a process reward model (PRM) on step labels: the probability that each step of a trajectory is good.

Token classification at step ends (see `reward_models.steps`), the design of TRL's former ``PRMTrainer``: a
two-way head (0 bad, 1 good) on any causal LM or encoder directory, trained with cross-entropy at the token that
ends each labelled step, through the transformers `Trainer`.

The data is the `stepwise` export: ``prompt``, ``completions`` (one piece per labelled step: message lists rendered
through the chat template with the row's ``tools``, or text pieces with ``style=text``; see `reward_models.steps`),
``labels`` (True for a good step) and ``source``: ``label`` rows come from annotators' step labels, ``intervention``
rows from interventions (as in RLIF, the steps before the intervened one count as accepted and the intervened one as
rejected); `use_intervention_labels` keeps or drops the latter. Whole tasks are held out for evaluation, on their
annotator-labelled rows: step-level precision, recall and F1 for finding bad steps, and first-error accuracy (does the
first step scored below `threshold` match the first step labelled bad, or do both say there is none?), each beside
trivial baselines. Rows that carry ``oracle_labels`` (the gridworld oracle's truth) are also scored against those.

    python -m reward_models.prm --data_path stepwise.jsonl --base_model var/policies/bootstrap \\
        --output_dir var/models/prm --max_steps 200
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_models.common.cli import cli
from reward_models.common.config import ConfigError, require
from reward_models.common.data import bad_rows, split_by_task
from reward_models.common.judge_config import start_judge
from reward_models.common.reporting import Reporter
from reward_models.step_scorer import StepScorer
from reward_models.step_training import finish_step_head, fit_step_head
from reward_models.steps import StepHeadConfig, load_step_model, pieces_problem

if TYPE_CHECKING:
    import torch

KIND = "process_reward_model"
ID2LABEL = {0: "bad", 1: "good"}


@dataclass
class PRMConfig(StepHeadConfig):
    output_dir: str = field(default="var/models/prm", metadata={"help": "Where checkpoints and the model go."})
    use_intervention_labels: bool = field(
        default=True,
        metadata={"help": "Train on intervention-derived labels too (steps before accepted, the step rejected)."},
    )
    threshold: float = field(
        default=0.5, metadata={"help": "A step scored below this probability of being good counts as an error."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0.0 < self.threshold < 1.0, "threshold", "must be between 0 and 1")


class ProcessRewardModel(StepScorer):
    """Scores each step of a trajectory with the probability that it is good.

    >>> prm = load_prm("var/models/prm")  # doctest: +SKIP
    >>> prm.step_scores("System: reach the goal G\\nUser: A . G\\nAssistant:", [" goal is right 2 ; action right"])
    [0.97]
    """

    def from_outputs(self, outputs: torch.Tensor) -> list[float]:
        """P(good) from the two-way head's logits (0 bad, 1 good)."""
        return outputs.softmax(-1)[:, 1].tolist()

    # P(good) for each step: of one trajectory (the stepwise export's `prompt`, `completions` and `tools`), of many,
    # and after every assistant turn of trajectory conversations.
    step_scores = StepScorer.score_trajectory
    batch_step_scores = StepScorer.score_trajectories
    conversation_scores = StepScorer.score_conversations


def load_prm(path: str | Path, device: str | None = None) -> ProcessRewardModel:
    """The process reward model in directory `path` (on CUDA when there is one, unless `device` says otherwise)."""
    model, tokenizer = load_step_model(path, device)
    return ProcessRewardModel(model, tokenizer)


# --- data --------------------------------------------------------------------------------------------------------


def row_problems(rows: Sequence[dict[str, Any]], config: PRMConfig) -> dict[int, str]:
    """The rows the PRM cannot learn from, by number, and why: stepwise rows must have a prompt (text, or a list of
    messages) and as many boolean labels as step pieces (text, or lists of messages, as the prompt is)."""
    return bad_rows(rows, _row_problem)


def _row_problem(row: dict[str, Any]) -> str | None:
    if problem := pieces_problem(row, "export stepwise rows"):
        return problem
    completions, labels = row["completions"], row.get("labels")
    if not isinstance(labels, list) or len(labels) != len(completions):
        return "labels must hold one true/false per completion"
    return None


def is_intervention(row: dict[str, Any]) -> bool:
    return row.get("source") == "intervention"


# --- evaluation --------------------------------------------------------------------------------------------------


def first_error(good: Sequence[bool]) -> int | None:
    """The index of the first bad step, or None when every step is good."""
    return next((index for index, ok in enumerate(good) if not ok), None)


def step_metrics(predicted: Sequence[Sequence[bool]], truth: Sequence[Sequence[bool]]) -> dict[str, float]:
    """Step accuracy, and precision, recall and F1 of finding bad steps (the positive class is *bad*), plus
    first-error accuracy over trajectories. `predicted` and `truth` hold True for a good step."""
    pairs = [(p, t) for ps, ts in zip(predicted, truth, strict=True) for p, t in zip(ps, ts, strict=True)]
    caught = sum(not p and not t for p, t in pairs)
    flagged = sum(not p for p, _ in pairs)
    bad = sum(not t for _, t in pairs)
    precision = caught / flagged if flagged else 0.0
    recall = caught / bad if bad else 0.0
    return {
        "bad_step_f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "first_error_accuracy": sum(first_error(p) == first_error(t) for p, t in zip(predicted, truth, strict=True))
        / len(truth),
        "step_accuracy": sum(p == t for p, t in pairs) / len(pairs),
        "bad_step_precision": precision,
        "bad_step_recall": recall,
    }


def bad_step_auroc(scores: Sequence[Sequence[float]], truth: Sequence[Sequence[bool]]) -> float:
    """The chance that a random bad step scores below a random good one (ties count half): 0.5 is chance, and
    0.5 too when the steps are all good or all bad."""
    good = sorted(s for ss, ts in zip(scores, truth, strict=True) for s, t in zip(ss, ts, strict=True) if t)
    bad = [s for ss, ts in zip(scores, truth, strict=True) for s, t in zip(ss, ts, strict=True) if not t]
    if not good or not bad:
        return 0.5
    wins = sum(
        len(good) - bisect_right(good, score) + 0.5 * (bisect_right(good, score) - bisect_left(good, score))
        for score in bad
    )
    return wins / (len(good) * len(bad))


def evaluate(
    scores: Sequence[Sequence[float]],
    rows: Sequence[dict[str, Any]],
    train_rows: Sequence[dict[str, Any]],
    threshold: float,
) -> dict[str, float]:
    """Held-out figures of `scores` (P(good) per step) against the rows' labels, and against their
    ``oracle_labels`` when every row has them (``oracle_`` prefix), each beside the trivial baselines: the
    training split's majority label, "every step is bad", "the first step is the first error", "never an error"
    and "the training split's most common first-error position"."""
    good_share = sum(sum(row["labels"]) for row in train_rows) / sum(len(row["labels"]) for row in train_rows)
    common = Counter(first_error(row["labels"]) for row in train_rows).most_common(1)[0][0]
    baselines = {  # name -> whether it calls step `index` good
        "majority": lambda index: good_share >= 0.5,
        "all_bad": lambda index: False,
        "first_step": lambda index: index != 0,
        "never": lambda index: True,
        "common": lambda index: common is None or index != common,
    }
    targets = [("", "labels")]
    if all("oracle_labels" in row for row in rows):
        targets.append(("oracle_", "oracle_labels"))
    metrics: dict[str, float] = {}
    for prefix, key in targets:
        truth = [[bool(label) for label in row[key]] for row in rows]
        predicted = [[score >= threshold for score in row_scores] for row_scores in scores]
        metrics.update({f"{prefix}{name}": value for name, value in step_metrics(predicted, truth).items()})
        metrics[f"{prefix}bad_step_auroc"] = bad_step_auroc(scores, truth)
        guessed = {
            name: step_metrics([[guess(index) for index in range(len(t))] for t in truth], truth)
            for name, guess in baselines.items()
        }
        metrics[f"{prefix}baseline_majority_step_accuracy"] = guessed["majority"]["step_accuracy"]
        metrics[f"{prefix}baseline_majority_bad_step_f1"] = guessed["majority"]["bad_step_f1"]
        metrics[f"{prefix}baseline_all_bad_step_f1"] = guessed["all_bad"]["bad_step_f1"]
        for name in ("first_step", "never", "common"):
            metrics[f"{prefix}baseline_{name}_first_error_accuracy"] = guessed[name]["first_error_accuracy"]
        metrics[f"{prefix}bad_step_share"] = 1 - sum(map(sum, truth)) / sum(map(len, truth))
    metrics.update(
        {
            "held_out_trajectories": len(rows),
            "held_out_steps": sum(len(row["labels"]) for row in rows),
            "threshold": threshold,
            "train_good_step_share": good_share,
            "train_common_first_error": -1 if common is None else common,
        }
    )
    return metrics


# --- training ----------------------------------------------------------------------------------------------------


def main(config: PRMConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Train, save and evaluate a PRM; returns the summary (also stored in the directory's manifest)."""
    start = start_judge(config, KIND, "process reward model", row_problems, reporter)
    if start.finished is not None:
        return start.finished
    reporter, local, rows = start.reporter, start.local, start.rows
    style = start.style
    # Split before filtering, so that the flag changes the training rows and never which tasks are held out.
    train_rows, held_out = split_by_task(rows, config.eval_fraction, config.seed)
    if not config.use_intervention_labels:
        train_rows = [row for row in train_rows if not is_intervention(row)]
    if not train_rows:
        raise ConfigError("data_path", "has no training rows (after the held-out split and the intervention filter)")
    # Evaluate on annotators' labels: an intervention row stops at the intervened step by construction.
    eval_rows = [row for row in held_out if not is_intervention(row)]
    prior_rows = [row for row in train_rows if not is_intervention(row)] or train_rows
    sources = Counter("intervention" if is_intervention(row) else "label" for row in train_rows)
    reporter.log(f"{len(train_rows)} training trajectories ({dict(sources)}), {len(eval_rows)} held out")

    labels = [[int(bool(label)) for label in row["labels"]] for row in train_rows]
    head = fit_step_head(local, train_rows, labels, id2label=ID2LABEL, style=style, reporter=reporter)

    metrics: dict[str, float] = {}
    if eval_rows:
        scores = ProcessRewardModel(head.model, head.tokenizer, config.batch_size).score_rows(eval_rows)
        metrics = evaluate(scores, eval_rows, prior_rows, config.threshold)
    return finish_step_head(
        head, config, KIND, metrics, reporter, train_rows_by_source=dict(sources), eval_samples=len(eval_rows)
    )


if __name__ == "__main__":
    cli(PRMConfig, main, __doc__)
