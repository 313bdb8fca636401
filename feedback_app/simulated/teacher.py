"""B-Pref's scripted teacher: how a simulated annotator judges a pair, a step, a critique and a correction, from the
environment's oracle, with the teacher's rationality and mistake rate (see the package's docstring)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reward_models.conversation import assistant_text
from reward_models.envs import Oracle


def action_text(action: Any) -> str:
    """An action as a critique writes it: a move as it is, a message as its text and tool calls."""
    if isinstance(action, dict):
        return assistant_text(action)
    return str(action).strip()


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
