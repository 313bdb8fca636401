"""One simulated annotator working the queue through the REST API, and `run_crowd` for a crowd of them at once."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from feedback_app.annotator_time import AnnotatorTime
from feedback_app.simulated.api_client import ApiClient
from feedback_app.simulated.teacher import ScriptedTeacher, TeacherConfig, first_wrong_step
from reward_models.envs import Environment, Oracle, load_environment
from reward_models.envs.base import message_action

KINDS = ("comparison", "step_label")
COUNTS = ("items", "comparison", "step_label", "critique", "intervention", "skipped", "lost", "seconds")


def task_spec(task: dict[str, Any]) -> dict[str, Any]:
    """The task dict the environment's reset() takes, from the API's task: as `Task.reset_spec`."""
    defaults: dict[str, Any] = {"instruction": task["instruction"]}
    if task.get("seed") is not None:
        defaults["seed"] = task["seed"]
    return {**defaults, **(task.get("spec") or {})}


@dataclass
class _Trajectory:
    task: int
    step_ids: list[int]
    actions: list[Any]  # what the environment was given: a move, or an assistant message


class SimulatedAnnotator:
    """One simulated annotator: leases items of `kinds` through the API until none is left or `max_labels` items
    are answered, and labels each with `teacher`.

    `environment` gives the oracle; None builds it from the project's environment spec (read from the API)."""

    def __init__(
        self,
        client: ApiClient,
        project_id: int,
        teacher: ScriptedTeacher,
        environment: Environment | None = None,
        time: AnnotatorTime | None = None,
    ) -> None:
        self.client = client
        self.project_id = project_id
        self.teacher = teacher
        self.environment = environment
        self.time = time or AnnotatorTime()
        self._trajectories: dict[int, _Trajectory] = {}
        self._tasks: dict[int, dict[str, Any]] = {}
        self._feedback_kinds: set[str] = set()

    @property
    def base(self) -> str:
        return f"/api/projects/{self.project_id}"

    def run(
        self,
        max_labels: int | None = None,
        kinds: Sequence[str] = KINDS,
        on_item: Callable[[dict[str, float]], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> dict[str, float]:
        """Label until the queue has nothing left for this annotator (or `max_labels` items are answered, or
        `stop()` says so before the next item).

        Returns counts: `items` answered, labels stored by kind (`comparison`, `step_label`, `critique`,
        `intervention`), `skipped` items, `lost` ones (the lease ran out and others had labelled the item), and
        `seconds`: the annotator time the stored labels record."""
        counts = dict.fromkeys(COUNTS, 0)
        for _ in self.items(counts, max_labels, kinds, stop):
            if on_item is not None:
                on_item(counts)
        return counts

    def items(
        self,
        counts: dict[str, float],
        max_labels: int | None = None,
        kinds: Sequence[str] = KINDS,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[None]:
        """As run(), one item at a time: each step leases and answers one item, adding to `counts`, and yields."""
        unknown = [kind for kind in kinds if kind not in KINDS]
        if unknown:
            raise ValueError(f"kinds: a simulated annotator labels {', '.join(KINDS)}, not {', '.join(unknown)}")
        project = self.client.get(self.base + "/")
        self._feedback_kinds = set(project["feedback_kinds"])
        if self.environment is None:
            spec = project["environment_spec"]
            self.environment = load_environment(spec["dotted_path"], spec["config"])
        wanted = [kind for kind in kinds if kind != "step_label" or self.teacher.config.step_labels]
        while wanted and (max_labels is None or counts["items"] < max_labels) and not (stop and stop()):
            # Round robin over the kinds, so a crowd limited by max_labels answers some of each.
            kind = wanted.pop(0)
            status, assignment = self.client.post(self.base + "/assignments/next/", {"kind": kind})
            if status == 204:
                continue
            wanted.append(kind)
            if kind == "comparison":
                self._compare(assignment, counts)
            else:
                self._review(assignment, counts)
            yield

    # One item of each kind.

    def _compare(self, assignment: dict[str, Any], counts: dict[str, float]) -> None:
        # A B-Pref teacher has no side bias: it judges the pair in the item's own order (the lower id first), so its
        # answers do not hang on which side each lease happens to show a trajectory; the label records the sides.
        shown, order = assignment["trajectories"], assignment["displayed_order"]
        first, second = shown if order == "ab" else shown[::-1]
        one, other = self._trajectory(first), self._trajectory(second)
        choice = self.teacher.compare(self._oracle(one.task), one.actions, other.actions)
        if choice is None:
            self._skip(assignment, "neither trajectory is good enough to tell apart", counts)
            return
        body = {
            "trajectory_a": first,
            "trajectory_b": second,
            "displayed_order": order,  # "ab": trajectory_a was shown on the left
            "choice": choice,
            "strength": 2,
        }
        if self._label("comparisons", assignment, body, self.time.comparison, counts):
            counts["comparison"] += 1
            counts["items"] += 1
        else:
            # The lease ran out and others filled the item, or this pair was already labelled through another item
            # (a gold copy of it): the API does not store a second current label, so give the item back.
            self._skip(assignment, "already labelled this pair, or the lease was lost", counts, lost=True)

    def _review(self, assignment: dict[str, Any], counts: dict[str, float]) -> None:
        (pk,) = assignment["trajectories"]
        trajectory = self._trajectory(pk)
        oracle = self._oracle(trajectory.task)
        if "step_label" not in self._feedback_kinds or not trajectory.actions:
            self._skip(assignment, "nothing to label", counts)
            return
        config = self.teacher.config
        values = self.teacher.step_values(oracle, trajectory.actions)
        seconds = [self.time.step_label] * len(values)
        if config.first_error_marks and -1 in values:
            # One mark: the steps before the first wrong one are good, the later ones stay unlabelled. Its time is
            # spread over the labels it stores, so that their sum is the mark's.
            values = [1] * values.index(-1) + [-1]
            seconds = [self.time.first_error / len(values)] * len(values)
        for step_id, value, spent in zip(trajectory.step_ids[: len(values)], values, seconds, strict=True):
            # False: this step already has a current label by this annotator (a gold copy of the item), which
            # finishing counts as it is.
            body = {"step": step_id, "value": value}
            counts["step_label"] += self._label("step-labels", assignment, body, spent, counts)
        critique = self.teacher.critique(oracle, trajectory.actions)
        if config.critiques and "critique" in self._feedback_kinds and critique is not None:
            error = first_wrong_step(oracle, trajectory.actions)
            body = {"trajectory": pk, "text": critique}
            if error is not None:
                body["step"] = trajectory.step_ids[error]
            counts["critique"] += self._label("critiques", assignment, body, self.time.critique, counts)
        correction = self.teacher.correction(oracle, trajectory.actions)
        if config.interventions and "intervention" in self._feedback_kinds and correction is not None:
            index, action = correction
            body = {
                "trajectory": pk,
                "step": trajectory.step_ids[index],
                # An action the environment plays is named; a message (text and tool calls) is the corrected turn.
                "corrected_message" if isinstance(action, dict) else "corrected_action": action,
                "reason": "this step moves away from the goal",
            }
            spent = self.time.intervention_seconds()
            counts["intervention"] += self._label("interventions", assignment, body, spent, counts)
        status, _ = self.client.post(self.base + f"/assignments/{assignment['id']}/finish/", {}, ok=(409,))
        if status == 409:
            counts["lost"] += 1
        else:
            counts["items"] += 1

    # Helpers.

    def _label(
        self, resource: str, assignment: dict[str, Any], body: dict[str, Any], seconds: float, counts: dict[str, Any]
    ) -> bool:
        """POST one label answering `assignment`, recording `seconds` of annotator time (added to `counts` once
        stored); False on 409 (a current label of the same thing exists, or the lease was lost). A retry after a
        dropped connection sends the same client_token, so it is stored once."""
        body = {**body, "assignment": assignment["id"], "client_token": str(uuid.uuid4()), "seconds_spent": seconds}
        status, _ = self.client.post(f"{self.base}/{resource}/", body, ok=(409,))
        if status != 409:
            counts["seconds"] += seconds
        return status != 409

    def _skip(self, assignment: dict[str, Any], reason: str, counts: dict[str, float], *, lost: bool = False) -> None:
        self.client.post(self.base + f"/assignments/{assignment['id']}/skip/", {"reason": reason}, ok=(409,))
        counts["lost" if lost else "skipped"] += 1

    def _trajectory(self, pk: int) -> _Trajectory:
        # Trajectories never change once stored, so each is read once.
        if pk not in self._trajectories:
            data = self.client.get(f"{self.base}/trajectories/{pk}/")
            steps = sorted(data["steps"], key=lambda step: step["index"])
            # What the environment played for each step: read from the turn as the agent wrote it where there is one
            # (a tool call's arguments, not their rendering), else the stored action.
            actions = [
                message_action(self.environment, s["message"]) if s.get("message") else s["action"] for s in steps
            ]
            self._trajectories[pk] = _Trajectory(task=data["task"], step_ids=[s["id"] for s in steps], actions=actions)
        return self._trajectories[pk]

    def _oracle(self, task_pk: int) -> Oracle:
        if task_pk not in self._tasks:
            self._tasks[task_pk] = task_spec(self.client.get(f"{self.base}/tasks/{task_pk}/"))
        oracle = self.environment.oracle(self._tasks[task_pk])
        if oracle is None:
            raise ValueError("environment: it has no oracle, so a simulated annotator cannot label it")
        return oracle


def run_crowd(
    base_url: str,
    project_id: int,
    members: list[tuple[str, TeacherConfig]],
    max_labels: int | None = None,
    environment: Environment | None = None,
    *,
    kinds: Sequence[str] = KINDS,
    on_progress: Callable[[dict[str, float]], None] | None = None,
    time_model: AnnotatorTime | None = None,
    max_seconds: float | None = None,
    in_turn: bool = False,
) -> dict[str, Any]:
    """Run one simulated annotator per (API token, teacher config), each in its own thread, until the queue has
    nothing left for them (or each has answered `max_labels` items, or the labels stored by all of them record
    `max_seconds` of annotator time: each member stops before its next item, so the crowd overshoots by at most one
    item each, and the rest stay queued).

    Returns {"members": [counts per member, in order], "total": summed counts, "seconds": wall time}; each member's
    `seconds` count is the annotator time its labels record, by `time_model` (the defaults when None).
    `on_progress(total)` is called after every item answered by anyone. A shared `environment` must have a
    thread-safe oracle() (the gridworld's is); None lets each annotator build its own from the project's spec.
    Raises RuntimeError after all threads end if any annotator failed.

    `in_turn`: the members take turns in this thread instead, one item each in order, until none has anything left
    (an annotator's error is raised as it happens). Which member answers which item then follows from the queue
    alone, not from which lease lands first, so the same queue and crowd give the same labels every time (what a
    benchmark comparing runs needs)."""
    results: list[dict[str, float] | None] = [None] * len(members)
    errors: list[BaseException | None] = [None] * len(members)
    totals: dict[str, float] = {}
    lock = threading.Lock()
    last_seen: list[dict[str, float]] = [{} for _ in members]

    def progress(index: int, counts: dict[str, float]) -> None:
        with lock:
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value - last_seen[index].get(key, 0)
            last_seen[index] = dict(counts)
            if on_progress is not None:
                on_progress(dict(totals))

    def spent() -> bool:
        with lock:
            return max_seconds is not None and totals.get("seconds", 0) >= max_seconds

    def annotator(token: str, config: TeacherConfig) -> SimulatedAnnotator:
        client = ApiClient(base_url, token)
        return SimulatedAnnotator(client, project_id, ScriptedTeacher(config), environment, time_model)

    def work(index: int, token: str, config: TeacherConfig) -> None:
        try:
            results[index] = annotator(token, config).run(
                max_labels, kinds, on_item=lambda counts: progress(index, counts), stop=spent
            )
        except BaseException as exc:  # reported after every thread has ended
            errors[index] = exc

    started = time.monotonic()
    if in_turn:
        _take_turns([annotator(*member) for member in members], max_labels, kinds, progress, spent, results)
        return _crowd_result(results, started)
    threads = [
        threading.Thread(target=work, args=(i, token, config), name=f"simulated-annotator-{i}", daemon=True)
        for i, (token, config) in enumerate(members)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [(i, exc) for i, exc in enumerate(errors) if exc is not None]
    if failed:
        index, exc = failed[0]
        raise RuntimeError(f"simulated annotator {index} failed ({len(failed)} of {len(members)} did): {exc}") from exc
    return _crowd_result(results, started)


def _take_turns(
    annotators: list[SimulatedAnnotator],
    max_labels: int | None,
    kinds: Sequence[str],
    progress: Callable[[int, dict[str, float]], None],
    stop: Callable[[], bool],
    results: list[dict[str, float] | None],
) -> None:
    """run_crowd's members, one item each in turn, in this thread; each one's counts go into `results`."""
    turns = []
    for index, annotator in enumerate(annotators):
        results[index] = dict.fromkeys(COUNTS, 0)
        turns.append((index, annotator.items(results[index], max_labels, kinds, stop)))
    while turns:
        for turn in list(turns):
            index, items = turn
            try:
                next(items)
            except StopIteration:
                turns.remove(turn)
            else:
                progress(index, results[index])


def _crowd_result(results: list[dict[str, float] | None], started: float) -> dict[str, Any]:
    counts = [result or {} for result in results]
    total = {key: sum(c.get(key, 0) for c in counts) for key in (counts[0] if counts else {})}
    return {"members": counts, "total": total, "seconds": round(time.monotonic() - started, 2)}
