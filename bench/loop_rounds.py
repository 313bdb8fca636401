"""The rounds of bench/loop.py through the REST API: each case rolls out, has the simulated crowd label the
queue, trains its reward model and PRM and then its policy, and records the round as a `Point`."""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from loop_oracle_pairs import by_type_text, oracle_accuracy
from loop_setup import ENVIRONMENTS

STRATEGY = {"random": "random", "active": "disagreement"}


@dataclass
class Point:
    round: int
    comparisons: int
    step_items: int
    greedy: float
    greedy_stderr: float
    sampled: float
    sampled_stderr: float
    policy_version: int
    seconds: float
    # The simulated annotators' time so far, by the annotator-time model (`feedback_app.annotator_time`).
    annotator_minutes: float = 0.0
    interventions: int = 0
    # Each held-out task's success, by decoding: what a comparison of two cases pairs.
    per_task: dict[str, list[float]] = field(default_factory=dict)
    strategies: dict[str, int] = field(default_factory=dict)
    judges: dict[str, Any] = field(default_factory=dict)
    # Gains over the base policy, paired over the same held-out tasks (`success_gain`: sampled_gain,
    # sampled_gain_stderr, ...).
    gains: dict[str, float] = field(default_factory=dict)


class Loop:
    """The cases' rounds against a running Tandem (`connect` gives its URL and the set-up's ids and keys)."""

    def __init__(self, args: argparse.Namespace, crowd: list[dict], test_pairs: list) -> None:
        self.args = args
        self.time_model = args.annotator_seconds
        self.crowd = crowd
        self.test_pairs = test_pairs
        # Cases run in threads of their own: each prints under its name, and one crowd labels at a time (the
        # embedded SQLite takes one writer).
        self.local = threading.local()
        self.labelling = threading.Lock()

    def connect(self, url: str, setup: dict[str, Any]) -> None:
        from feedback_app.simulated.api_client import ApiClient

        self.url = url
        self.setup = setup
        self.api = ApiClient(url, setup["researcher_key"])

    def say(self, text: str) -> None:
        print(f"[{getattr(self.local, 'case', '-')}] {text}", flush=True)

    # Runs

    def launch(self, project: int, body: dict[str, Any]) -> dict[str, Any]:
        run = self.api.post(f"/api/projects/{project}/runs/", body)[1]
        return self.wait(project, run["id"])

    def wait(self, project: int, run_id: int) -> dict[str, Any]:
        last = ""
        while True:
            run = self.api.get(f"/api/projects/{project}/runs/{run_id}/")
            line = f"    run {run_id} {run['kind']}: {run['status']} {run['progress_current']}/{run['progress_total']}"
            if line != last:
                self.say(line)
                last = line
            if run["status"] == "succeeded":
                return run
            if run["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"run {run_id} ({run['kind']}) {run['status']}:\n{run.get('error') or run['log']}")
            time.sleep(1)

    def round_seed(self, round_: int) -> int:
        """The seed of a round's rollout, judges and policy run: `--seed` picks the run, the round its part."""
        return self.args.seed * 100 + round_

    def overrides(self, kind: str) -> dict[str, Any]:
        return dict(self.args.settings.get(kind, {}))

    # Labels

    def labels(self, case: str) -> bool:
        """Whether the case's rounds roll out and label (the oracle's learn from the environment's reward alone)."""
        return case != "oracle"

    def label(self, project: int, case: str, round_: int, spent: float) -> dict[str, Any]:
        """The round's labels: the crowd labels the queue empty (`spent`: the case's annotator seconds so far)."""
        return self.run_crowd(project)

    def run_crowd(
        self, project: int, teacher: dict[str, Any] | None = None, budget: float | None = None
    ) -> dict[str, Any]:
        """The crowd labels the project's queue empty, each member with `teacher`'s settings over its own, or until
        their labels record `budget` seconds of annotator time. The members take turns, so a seed's run gets the same
        labels every time (with a thread each, who answers which item, and so with which mistakes, would follow the
        order leases land in)."""
        from feedback_app.simulated.annotator import run_crowd
        from feedback_app.simulated.teacher import TeacherConfig

        members = [
            (key, TeacherConfig.from_dict({k: v for k, v in {**member, **(teacher or {})}.items() if k != "name"}))
            for key, member in zip(self.setup["crowd_keys"], self.crowd, strict=True)
        ]
        with self.labelling:
            return run_crowd(self.url, project, members, time_model=self.time_model, max_seconds=budget, in_turn=True)

    def strategies(self, project: int) -> dict[str, int]:
        """How many current comparisons were asked under each query strategy (as recorded on the labels)."""
        tally: dict[str, int] = {}
        path = f"/api/projects/{project}/comparisons/?page_size=500"
        while path:
            page = self.api.get(path)
            for label in page["results"]:
                tally[label["query_strategy"] or "?"] = tally.get(label["query_strategy"] or "?", 0) + 1
            path = page["next"]
        return tally

    # Judges

    def snapshot(self, project: int, kind: str, name: str) -> int:
        return self.api.post(f"/api/projects/{project}/snapshots", {"name": name, "export_kind": kind})[1]["id"]

    def judges(self, project: int, round_: int, case: str) -> dict[str, Any]:
        """The round's reward model and PRM, trained on every label so far, and their figures."""
        rm, prm = self.reward_model(project, round_), self.prm(project, round_)
        figures: dict[str, Any] = {}
        if self.test_pairs:
            model = self.api.get(f"/api/projects/{project}/models/{rm['summary']['registered_model']}/")
            accuracy = oracle_accuracy(model["path"], self.test_pairs)
            figures = {"rm_oracle_accuracy": accuracy.pop("all"), "rm_oracle_accuracy_by_type": accuracy}
        return {
            **figures,
            "reward_model": rm["summary"]["registered_model"],
            "prm": prm["summary"]["registered_model"],
            "rm_own_heldout_accuracy": (rm["summary"].get("metrics") or {}).get("accuracy"),
            "rm_seconds": rm["summary"].get("train_seconds"),
            "prm_seconds": prm["summary"].get("train_seconds"),
        }

    def judge(
        self, project: int, round_: int, kind: str, snapshot: int, name: str, settings: dict[str, Any]
    ) -> dict[str, Any]:
        """A `kind` judge trained on the snapshot `snapshot` and registered as `name`-r<round>, with `settings`, the
        round's seed and the bench's overrides for `kind`; its finished run."""
        config = {"name": f"{name}-r{round_}", **settings, "seed": self.round_seed(round_), **self.overrides(kind)}
        return self.launch(project, {"kind": kind, "snapshot": snapshot, "config": config})

    def reward_model(self, project: int, round_: int) -> dict[str, Any]:
        """A reward-model ensemble trained on a snapshot of every comparison so far; its finished run."""
        layout = ENVIRONMENTS[self.args.env].reward_layout
        settings = {"ensemble_size": self.args.ensemble, **({"layout": layout} if layout else {}), "num_epochs": 3}
        # The tiny policy's recipe (bench/judge_oracle.py's); the pipeline's 1e-4 suits pretrained models and left the
        # reward model below "the shorter trajectory wins" (held out 0.52 against 0.71).
        settings["learning_rate"] = 1e-3
        snapshot = self.snapshot(project, "preference", f"preferences-r{round_}")
        return self.judge(project, round_, "reward_model", snapshot, "rm", settings)

    def prm(self, project: int, round_: int) -> dict[str, Any]:
        """A PRM trained on a snapshot of every step label so far; its finished run."""
        # bench/judge_oracle.py's recipe for a tiny model, as above.
        settings = {"learning_rate": 5e-3, "num_epochs": 5}
        snapshot = self.snapshot(project, "stepwise", f"steps-r{round_}")
        return self.judge(project, round_, "prm", snapshot, "prm", settings)

    # The policy

    def policy_run(self, method: str, policy: int, round_: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """A policy run's request body and config, before its judges or snapshot: evaluated on the held-out tasks
        (the base too in the first round; a later round starts from the last round's result, already evaluated)."""
        config: dict[str, Any] = {
            "seed": self.round_seed(round_),
            "eval_tasks": self.args.eval_tasks,
            "eval_samples": self.args.eval_samples,
            "eval_base": round_ == 0,
        }
        if method in ("ppo", "nash_md"):
            config.update(max_steps=self.args.iterations, save_steps=self.args.iterations)
        if method == "ppo":
            # No environment signal picks the checkpoint: the last iteration is the result.
            config.update(rollouts_per_step=self.args.episodes, selection_tasks=0)
        return {"kind": method, "base_policy": policy, "review": {"enabled": False}}, config

    def train_policy(
        self, project: int, policy: int, round_: int, judges: dict[str, Any] | None, case: str
    ) -> dict[str, Any]:
        method = "ppo" if judges is None else self.args.method
        body, config = self.policy_run(method, policy, round_)
        if method == "ppo":
            if judges is None:
                config["reward_source"] = "oracle"
            else:
                body["judges"] = {"reward_model_path": judges["reward_model"], "prm_path": judges["prm"]}
        elif method == "dpo":
            body["snapshot"] = self.snapshot(project, "step_preference", f"step-preferences-r{round_}")
        elif method == "dpo_trajectory":  # a preference snapshot makes the DPO run trajectory-level
            body["kind"] = "dpo"
            body["snapshot"] = self.snapshot(project, "preference", f"policy-preferences-r{round_}")
        else:  # Nash-MD against the reward model's P(a > b)
            config.update(batch_size=self.args.episodes)
            body["judges"] = {"preference_model_path": judges["reward_model"]}
        body["config"] = {**config, **self.overrides(method)}
        run = self.launch(project, body)
        return run["summary"]

    def rollout(self, project: int, policy: int, round_: int, case: str) -> dict[str, Any]:
        tasks = self.setup["projects"][case]["tasks"][round_ * self.args.tasks : (round_ + 1) * self.args.tasks]
        config = {
            "task_ids": tasks,
            "samples_per_task": self.args.samples,
            "seed": self.round_seed(round_),
            "queue_comparisons": self.args.active_comparisons if case == "active" else self.args.comparisons,
            "queue_step_labels": self.args.step_items,
        }
        return self.launch(project, {"kind": "rollout", "policy_version": policy, "config": config})["summary"]

    # A case

    def run_case(self, case: str) -> tuple[dict[str, Any], list[Point]]:
        from reward_models.finetune.evaluation import success_gain

        self.local.case = case
        info = self.setup["projects"][case]
        project, policy = info["id"], info["policy"]
        if case in STRATEGY:
            self.api.request("PATCH", f"/api/projects/{project}/", {"query_strategy": STRATEGY[case]})
        points: list[Point] = []
        base: dict[str, Any] = {}
        labelled = {"comparison": 0, "step_items": 0, "intervention": 0, "seconds": 0.0}
        for round_ in range(self.args.rounds):
            started = time.monotonic()
            self.say(f"round {round_ + 1}/{self.args.rounds}")
            judges = None
            if self.labels(case):
                summary = self.rollout(project, policy, round_, case)
                self.say(f"    rollout: {json.dumps(summary.get('queued', {}))}")
                crowd = self.label(project, case, round_, labelled["seconds"])
                self.say(f"    labelled in {crowd['seconds']:.0f} s: {json.dumps(crowd['total'])}")
                labelled["comparison"] += crowd["total"].get("comparison", 0)
                labelled["step_items"] += crowd["total"].get("items", 0) - crowd["total"].get("comparison", 0)
                labelled["intervention"] += crowd["total"].get("intervention", 0)
                labelled["seconds"] += crowd["total"].get("seconds", 0.0)
                judges = self.judges(project, round_, case)
            summary = self.train_policy(project, policy, round_, judges, case)
            metrics = summary.get("metrics") or {}
            base = base or metrics.get("base") or {}
            final = metrics.get("final") or {}
            policy = summary["policy_version"]
            points.append(
                Point(
                    round=round_ + 1,
                    comparisons=labelled["comparison"],
                    step_items=labelled["step_items"],
                    interventions=labelled["intervention"],
                    greedy=final.get("greedy_success", float("nan")),
                    greedy_stderr=final.get("greedy_stderr", float("nan")),
                    sampled=final.get("sampled_success", float("nan")),
                    sampled_stderr=final.get("sampled_stderr", float("nan")),
                    policy_version=policy,
                    seconds=time.monotonic() - started,
                    annotator_minutes=labelled["seconds"] / 60,
                    strategies=self.strategies(project) if self.labels(case) else {},
                    judges=judges or {},
                    gains=success_gain({"base": base, "final": final}),
                    per_task={
                        decoding: final[f"{decoding}_per_task"]
                        for decoding in ("greedy", "sampled")
                        if f"{decoding}_per_task" in final
                    },
                )
            )
            self.say(f"    -> {describe(points[-1])}")
        return base, points


def describe(point: Point) -> str:
    accuracy = point.judges.get("rm_oracle_accuracy")
    by_type = by_type_text(point.judges.get("rm_oracle_accuracy_by_type") or {})
    judged = (
        f"reward model agrees with the oracle on {accuracy:.1%} of test pairs ({by_type}); "
        if accuracy is not None
        else ""
    )
    gains = "".join(
        f", {decoding} gain {point.gains[f'{decoding}_gain']:+.1%} ± {point.gains[f'{decoding}_gain_stderr']:.1%}"
        for decoding in ("greedy", "sampled")
        if f"{decoding}_gain_stderr" in point.gains
    )
    return (
        f"{point.comparisons} comparisons, {point.step_items} step labels, {point.annotator_minutes:.0f} annotator "
        f"minutes: {judged}greedy {point.greedy:.1%} "
        f"± {point.greedy_stderr:.1%}, sampled {point.sampled:.1%} ± {point.sampled_stderr:.1%}{gains} "
        f"({point.seconds:.0f} s)"
    )
