"""Simulated annotators: B-Pref's scripted teacher, labelling through the REST API and the same queue as people.

A simulated annotator is an API client like any other. It leases the next item with
``POST /api/projects/<id>/assignments/next/``, reads the trajectories and their task over the API, asks the
environment's hidden oracle what is true, and answers the way a teacher with the B-Pref parameters would (Lee et
al. 2021, "B-Pref: benchmarking preference-based reinforcement learning"):

- per-step reward r_t: the oracle's graded return after step t minus before it (``progress_return`` where the oracle
  has one, so two failures are ordered by how close they got; else ``true_return``);
- myopic return R = sum_t gamma^(T-1-t) r_t (gamma < 1 weighs the last steps most);
- skip when max(R_A, R_B) < skip_threshold; tie when |R_A - R_B| <= equal_threshold;
- else P(A > B) = sigmoid(beta * (R_A - R_B)) (beta = inf: always the better one), then a mistake flips the choice
  with probability epsilon.

Step labels are +1 where the oracle calls a step correct and -1 elsewhere (flipped with probability epsilon), or, with
``first_error_marks``, PRM800K's shortcut: the first step the teacher calls wrong is -1, the steps before it +1;
critiques name the first wrong step and the better action in the words of the simulated training data
(``simulation.episodes``); an intervention puts the oracle's best action at the first wrong step. With the mistake
rate, a critique or an intervention misplaces the error: it lands on another step, or on none. Where the environment's
actions are assistant messages (the tool shop), each step's action is read from its message as the agent wrote it, a
critique writes calls as ``name(arguments)``, and the correction is the oracle's message. The labels go through the
API's own endpoints with the assignment, so they carry the item's query strategy and count towards the queue exactly as
a person's, and each records as its ``seconds_spent`` what the annotator-time model (`feedback_app.annotator_time`)
says a person would have taken over it.

No Django here: the loop benchmark runs crowds from a plain process against a real server.

>>> teacher = ScriptedTeacher(TeacherConfig(beta=math.inf))
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from feedback_app.annotator_time import AnnotatorTime
from reward_models.conversation import assistant_text
from reward_models.envs import Environment, Oracle, load_environment
from reward_models.envs.base import message_action

KINDS = ("comparison", "step_label")
COUNTS = ("items", "comparison", "step_label", "critique", "intervention", "skipped", "lost", "seconds")


# --- The teacher ----------------------------------------------------------------------------------------------------


@dataclass
class TeacherConfig:
    beta: float = field(
        default=math.inf,
        metadata={
            "help": "Rationality: P(A>B) = sigmoid(beta (R_A - R_B)); inf always picks the better, 0 at random."
        },
    )
    gamma: float = field(default=1.0, metadata={"help": "Myopia: step t of T weighs gamma^(T-1-t), in (0, 1]."})
    epsilon: float = field(default=0.0, metadata={"help": "Mistake rate: a choice or step label is flipped."})
    skip_threshold: float | None = field(
        default=None, metadata={"help": "Skip a pair when both myopic returns are below this (None: never skip)."}
    )
    equal_threshold: float = field(
        default=0.0, metadata={"help": "Call a tie when the myopic returns differ by at most this."}
    )
    seed: int = field(default=0, metadata={"help": "Seeds the teacher's random choices and mistakes."})
    step_labels: bool = field(default=True, metadata={"help": "Take step_label items (step labels of a trajectory)."})
    first_error_marks: bool = field(
        default=False,
        metadata={"help": "Mark each trajectory's first wrong step (those before it good) instead of every step."},
    )
    critiques: bool = field(default=True, metadata={"help": "Write a critique on each step_label item."})
    interventions: bool = field(
        default=True, metadata={"help": "Correct the first wrong step of a step_label item with the oracle's action."}
    )

    def __post_init__(self) -> None:
        for name in ("beta", "gamma", "epsilon", "equal_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise ValueError(f"{name}: expected a number, got {value!r}")
        if self.skip_threshold is not None and (
            isinstance(self.skip_threshold, bool) or not isinstance(self.skip_threshold, int | float)
        ):
            raise ValueError(f"skip_threshold: expected a number or null, got {self.skip_threshold!r}")
        if self.beta < 0:
            raise ValueError(f"beta: must be >= 0 (inf for a perfectly rational teacher), got {self.beta}")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma: must be in (0, 1], got {self.gamma}")
        if not 0 <= self.epsilon <= 1:
            raise ValueError(f"epsilon: must be in [0, 1], got {self.epsilon}")
        if self.equal_threshold < 0:
            raise ValueError(f"equal_threshold: must be >= 0, got {self.equal_threshold}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")
        for name in ("step_labels", "first_error_marks", "critiques", "interventions"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TeacherConfig:
        """Build from JSON-like values; beta may be "inf". Unknown keys and bad values raise ValueError naming them."""
        if not isinstance(values, dict):
            raise ValueError(f"a teacher config is a JSON object, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown teacher setting; known: {', '.join(sorted(known))}")
        values = dict(values)
        if isinstance(values.get("beta"), str):
            try:
                values["beta"] = float(values["beta"])
            except ValueError:
                raise ValueError(f"beta: expected a number or 'inf', got {values['beta']!r}") from None
        return cls(**values)


def step_rewards(oracle: Oracle, actions: Sequence[str]) -> list[float]:
    """r_t: the oracle's return after step t minus its return before it."""
    # progress_return is the gridworld oracle's graded return, beyond the Oracle protocol; an oracle without one is
    # judged on its true return, which orders successes against failures but not failures among themselves.
    score: Callable[[Sequence[str]], float] = getattr(oracle, "progress_return", oracle.true_return)
    values = [score(actions[:t]) for t in range(len(actions) + 1)]
    return [after - before for before, after in zip(values, values[1:], strict=False)]


def myopic_return(oracle: Oracle, actions: Sequence[str], gamma: float = 1.0) -> float:
    """B-Pref's myopic return: sum_t gamma^(T-1-t) r_t, so with gamma < 1 the last steps count most."""
    rewards = step_rewards(oracle, actions)
    last = len(rewards) - 1
    return sum(gamma ** (last - t) * reward for t, reward in enumerate(rewards))


def first_wrong_step(oracle: Oracle, actions: Sequence[str]) -> int | None:
    correct = oracle.step_correct(actions)
    return next((index for index, ok in enumerate(correct) if not ok), None)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class ScriptedTeacher:
    """Answers for one simulated annotator. Deterministic given the config's seed and the sequence of questions.

    >>> from reward_models.envs import GridWorld
    >>> env = GridWorld()
    >>> oracle = env.oracle(env.make_task(3))
    >>> best = oracle.best_actions([])[0]
    >>> ScriptedTeacher(TeacherConfig()).compare(oracle, [best], ["up", "up"] if best != "up" else ["down"])
    'a'
    """

    def __init__(self, config: TeacherConfig | None = None) -> None:
        self.config = config or TeacherConfig()
        self.rng = random.Random(self.config.seed)

    def compare(self, oracle: Oracle, actions_a: Sequence[str], actions_b: Sequence[str]) -> str | None:
        """Which is better: "a", "b" or "tie"; None to skip the pair."""
        config = self.config
        return_a = myopic_return(oracle, actions_a, config.gamma)
        return_b = myopic_return(oracle, actions_b, config.gamma)
        if config.skip_threshold is not None and max(return_a, return_b) < config.skip_threshold:
            return None
        margin = return_a - return_b
        if abs(margin) <= config.equal_threshold:
            return "tie"
        if math.isinf(config.beta):
            choice = "a" if margin > 0 else "b"
        else:
            choice = "a" if self.rng.random() < _sigmoid(config.beta * margin) else "b"
        if self._mistake():
            choice = "b" if choice == "a" else "a"
        return choice

    def step_values(self, oracle: Oracle, actions: Sequence[str]) -> list[int]:
        """+1 for each step the oracle calls correct, -1 otherwise, each flipped with probability epsilon."""
        correct = oracle.step_correct(actions)
        # Steps the oracle does not trace (played after the episode had ended) cannot be right.
        correct = [*correct, *[False] * (len(actions) - len(correct))]
        return [(1 if ok else -1) * (-1 if self._mistake() else 1) for ok in correct[: len(actions)]]

    def critique(self, oracle: Oracle, actions: Sequence[str]) -> str | None:
        """The template critique of the simulated training data (`simulation.episodes.critique_text`): the first
        wrong step and what it should have done, or what went right. None for an empty trajectory."""
        if not actions:
            return None
        error = self._spotted(first_wrong_step(oracle, actions), len(actions))
        if error is None:
            if oracle.success(actions):
                return "every step moves toward the goal ; the agent reaches the goal"
            return "every step moves toward the goal but the agent runs out of steps"
        best = " or ".join(action_text(action) for action in oracle.best_actions(actions[:error]))
        return (
            f"step {error + 1} is wrong : {action_text(actions[error])} moves away from the goal ; {best} was better"
        )

    def correction(self, oracle: Oracle, actions: Sequence[Any]) -> tuple[int, Any] | None:
        """(index of the first wrong step, the oracle's best action there: a move, or an assistant message where the
        environment's actions are messages), or None when no step is wrong or nothing better exists. With the
        mistake rate, the teacher misplaces the error (`_spotted`): a right step "corrected" to another of the
        oracle's best actions there, or none when it has no other."""
        error = self._spotted(first_wrong_step(oracle, actions), len(actions))
        if error is None:
            return None
        taken = action_text(actions[error])
        best = [action for action in oracle.best_actions(actions[:error]) if action_text(action) != taken]
        return (error, best[0]) if best else None

    def _spotted(self, error: int | None, steps: int) -> int | None:
        """The step the teacher takes for the first wrong one: `error` (None: every step right), or with probability
        epsilon another step of the `steps`, or none at all when it has no other: a missed or misplaced error."""
        if steps == 0 or not self._mistake():
            return error
        others = [index for index in range(steps) if index != error]
        return self.rng.choice(others) if others else None

    def _mistake(self) -> bool:
        return self.config.epsilon > 0 and self.rng.random() < self.config.epsilon


# --- HTTP -----------------------------------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        super().__init__(f"{method} {path} answered {status}: {body}")
        self.status = status
        self.body = body


class ApiClient:
    """A small JSON client of Tandem's REST API with a personal API token (stdlib only).

    Throttled requests (429) wait for Retry-After; connection errors are retried a few times, which is safe because
    every label carries a client_token and leasing resumes the caller's current lease.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0, retries: int = 4) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries

    def url(self, path: str) -> str:
        """`path` under the base URL; an absolute URL (a page's `next` link) as it is."""
        return path if path.startswith(("http://", "https://")) else self.base_url + path

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def post(self, path: str, body: dict[str, Any] | None = None, *, ok: Sequence[int] = ()) -> tuple[int, Any]:
        """POST JSON; returns (status, body). A status >= 400 raises ApiError unless it is in `ok`."""
        return self.request("POST", path, body, ok=ok)

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, ok: Sequence[int] = ()
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url(path), data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                    return response.status, json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                raw = exc.read()
                try:
                    payload = json.loads(raw) if raw else None
                except ValueError:
                    payload = raw.decode(errors="replace")[:500]
                if exc.code == 429 and attempt < self.retries:
                    time.sleep(float(exc.headers.get("Retry-After") or 1))
                    continue
                if exc.code in ok:
                    return exc.code, payload
                raise ApiError(method, path, exc.code, payload) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if attempt == self.retries:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


# --- The annotator --------------------------------------------------------------------------------------------------


def task_spec(task: dict[str, Any]) -> dict[str, Any]:
    """The task dict the environment's reset() takes, from the API's task: as feedback_app.corrections.task_spec."""
    defaults: dict[str, Any] = {"instruction": task["instruction"]}
    if task.get("seed") is not None:
        defaults["seed"] = task["seed"]
    return {**defaults, **(task.get("spec") or {})}


@dataclass
class _Trajectory:
    task: int
    step_ids: list[int]
    actions: list[Any]  # what the environment was given: a move, or an assistant message


def action_text(action: Any) -> str:
    """An action as a critique writes it: a move as it is, a message as its text and tool calls."""
    if isinstance(action, dict):
        return assistant_text(action)
    return str(action).strip()


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
        unknown = [kind for kind in kinds if kind not in KINDS]
        if unknown:
            raise ValueError(f"kinds: a simulated annotator labels {', '.join(KINDS)}, not {', '.join(unknown)}")
        project = self.client.get(self.base + "/")
        self._feedback_kinds = set(project["feedback_kinds"])
        if self.environment is None:
            spec = project["environment_spec"]
            self.environment = load_environment(spec["dotted_path"], spec["config"])
        counts = dict.fromkeys(COUNTS, 0)
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
            if on_item is not None:
                on_item(counts)
        return counts

    # One item of each kind.

    def _compare(self, assignment: dict[str, Any], counts: dict[str, float]) -> None:
        left, right = (self._trajectory(pk) for pk in assignment["trajectories"])
        choice = self.teacher.compare(self._oracle(left.task), left.actions, right.actions)
        if choice is None:
            self._skip(assignment, "neither trajectory is good enough to tell apart", counts)
            return
        body = {
            "trajectory_a": assignment["trajectories"][0],
            "trajectory_b": assignment["trajectories"][1],
            "displayed_order": "ab",  # trajectory_a as sent is the one shown on the left
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
) -> dict[str, Any]:
    """Run one simulated annotator per (API token, teacher config), each in its own thread, until the queue has
    nothing left for them (or each has answered `max_labels` items, or the labels stored by all of them record
    `max_seconds` of annotator time: each member stops before its next item, so the crowd overshoots by at most one
    item each, and the rest stay queued).

    Returns {"members": [counts per member, in order], "total": summed counts, "seconds": wall time}; each member's
    `seconds` count is the annotator time its labels record, by `time_model` (the defaults when None).
    `on_progress(total)` is called after every item answered by anyone. A shared `environment` must have a
    thread-safe oracle() (the gridworld's is); None lets each annotator build its own from the project's spec.
    Raises RuntimeError after all threads end if any annotator failed."""
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

    def work(index: int, token: str, config: TeacherConfig) -> None:
        client = ApiClient(base_url, token)
        annotator = SimulatedAnnotator(client, project_id, ScriptedTeacher(config), environment, time_model)
        try:
            results[index] = annotator.run(
                max_labels, kinds, on_item=lambda counts: progress(index, counts), stop=spent
            )
        except BaseException as exc:  # reported after every thread has ended
            errors[index] = exc

    started = time.monotonic()
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
    counts = [result or {} for result in results]
    total = {key: sum(c.get(key, 0) for c in counts) for key in (counts[0] if counts else {})}
    return {"members": counts, "total": total, "seconds": round(time.monotonic() - started, 2)}
