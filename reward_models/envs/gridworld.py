"""The built-in text gridworld: Tandem's default environment.

Each task seed generates a square map with walls, an agent ``A`` and a goal ``G``; the agent moves ``up``, ``down``,
``left`` or ``right`` and earns 1.0 on reaching the goal. Bumping a wall or the edge keeps the agent in place (legal,
but a wasted step). Any other action string (a policy's garbled output) is an invalid no-op that also costs a step and
is flagged in ``info["invalid"]``. The episode ends at the goal or after ``max_steps`` steps.

The observation is one token per cell, space-separated, rows joined by ``|``, so a word-level tokenizer reads it::

    . . # . . . | . A . . # . | ...

Seeds: ``eval_seeds()`` is ``range(1_000_000, 1_000_200)``, 200 held-out tasks. Training, demonstrations and
annotation tasks draw their seeds below 1_000_000 (``reward_models.envs.training_seeds`` skips the held-out range for
any environment).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reward_models.envs.base import StepResult

ACTIONS = ("up", "down", "left", "right")
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
WALL, FLOOR, AGENT, GOAL, ROW_SEPARATOR = "#", ".", "A", "G", "|"
INSTRUCTION = "reach the goal G"
EVAL_SEEDS = range(1_000_000, 1_000_200)

Position = tuple[int, int]


@dataclass(frozen=True)
class Layout:
    """A generated map: ``walls[r][c]`` is True for a wall."""

    walls: tuple[tuple[bool, ...], ...]
    start: Position
    goal: Position

    @property
    def size(self) -> int:
        return len(self.walls)

    def move(self, position: Position, action: str) -> Position:
        """Where ``action`` takes the agent; walls, edges and invalid actions leave it in place."""
        if action not in MOVES:
            return position
        row, col = position[0] + MOVES[action][0], position[1] + MOVES[action][1]
        if not (0 <= row < self.size and 0 <= col < self.size) or self.walls[row][col]:
            return position
        return row, col

    def distances_to_goal(self) -> dict[Position, int]:
        """Shortest-path length to the goal from every cell that can reach it (BFS from the goal)."""
        distances = {self.goal: 0}
        frontier = deque([self.goal])
        while frontier:
            cell = frontier.popleft()
            for action in ACTIONS:
                neighbour = self.move(cell, action)
                # Moves are symmetric on a grid, so stepping out of `cell` finds the cells that can step into it.
                if neighbour not in distances:
                    distances[neighbour] = distances[cell] + 1
                    frontier.append(neighbour)
        return distances

    def observation(self, agent: Position) -> str:
        rows = []
        for r, wall_row in enumerate(self.walls):
            cells = []
            for c, is_wall in enumerate(wall_row):
                if (r, c) == agent:
                    cells.append(AGENT)
                elif (r, c) == self.goal:
                    cells.append(GOAL)
                else:
                    cells.append(WALL if is_wall else FLOOR)
            rows.append(" ".join(cells))
        return f" {ROW_SEPARATOR} ".join(rows)

    @classmethod
    def from_rows(cls, rows: Sequence[str]) -> Layout:
        """A layout from a hand-drawn map such as ``["A.#", "..#", "#.G"]`` (one character per cell)."""
        size = len(rows)
        if size == 0 or any(len(row) != size for row in rows):
            raise ValueError(f"layout must be a non-empty square, got rows of lengths {[len(r) for r in rows]}")
        cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
        unknown = set(cells.values()) - {WALL, FLOOR, AGENT, GOAL}
        if unknown:
            raise ValueError(f"layout has unknown cell characters {sorted(unknown)}")
        agents = [pos for pos, ch in cells.items() if ch == AGENT]
        goals = [pos for pos, ch in cells.items() if ch == GOAL]
        if len(agents) != 1 or len(goals) != 1:
            raise ValueError(f"layout needs exactly one {AGENT} and one {GOAL}")
        walls = tuple(tuple(ch == WALL for ch in row) for row in rows)
        return cls(walls=walls, start=agents[0], goal=goals[0])


def parse_observation(observation: str) -> list[list[str]]:
    """The grid rows of an observation string."""
    return [row.split() for row in observation.split(ROW_SEPARATOR)]


class GridWorld:
    """A procedurally generated text gridworld (see the module docstring).

    >>> env = GridWorld(size=7)
    >>> observation = env.reset(env.make_task(seed=3))
    >>> env.step("right").done
    False
    """

    def __init__(self, size: int = 7, wall_prob: float = 0.2, max_steps: int = 15) -> None:
        if not 3 <= size <= 10:
            # Above 10 the policy's reasoning would need two-digit distances its tokenizer does not have.
            raise ValueError(f"size must be between 3 and 10, got {size}")
        if not 0.0 <= wall_prob <= 0.6:
            raise ValueError(f"wall_prob must be between 0 and 0.6, got {wall_prob}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.size = size
        self.wall_prob = wall_prob
        self.max_steps = max_steps
        self._layout: Layout | None = None
        self._agent: Position = (0, 0)
        self._steps = 0
        self._done = True

    def make_task(self, seed: int) -> dict[str, Any]:
        return {"seed": seed, "instruction": INSTRUCTION}

    def eval_seeds(self) -> range:
        return EVAL_SEEDS

    def layout(self, task: dict[str, Any]) -> Layout:
        """The task's map: the hand-drawn ``task["layout"]`` rows when given, else generated from ``task["seed"]``."""
        if "layout" in task:
            return Layout.from_rows(task["layout"])
        return self._generate(int(task["seed"]))

    def _generate(self, seed: int) -> Layout:
        # random.Random(int) is stable across Python versions and platforms, so a seed names the same map forever.
        rng = random.Random(seed)
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        while True:
            walls = tuple(tuple(rng.random() < self.wall_prob for _ in range(self.size)) for _ in range(self.size))
            free = [cell for cell in cells if not walls[cell[0]][cell[1]]]
            if len(free) < 2:
                continue
            start, goal = rng.sample(free, 2)
            layout = Layout(walls=walls, start=start, goal=goal)
            # Redraw until the goal is reachable within the step limit, so every task is solvable.
            if 0 < layout.distances_to_goal().get(start, self.max_steps + 1) <= self.max_steps:
                return layout

    def reset(self, task: dict[str, Any]) -> str:
        self._layout = self.layout(task)
        self._agent = self._layout.start
        self._steps = 0
        self._done = False
        return self._layout.observation(self._agent)

    def step(self, action: str) -> StepResult:
        if self._layout is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        move = action.strip().lower()
        self._agent = self._layout.move(self._agent, move)
        self._steps += 1
        reached = self._agent == self._layout.goal
        self._done = reached or self._steps >= self.max_steps
        info = {"invalid": move not in MOVES, "success": reached}
        return StepResult(self._layout.observation(self._agent), 1.0 if reached else 0.0, self._done, info)

    def legal_actions(self) -> list[str]:
        return list(ACTIONS)

    def action_from_message(self, message: dict[str, Any]) -> str:
        """The move an assistant turn makes. Gridworld policies write ``<reasoning> ; action <move>``
        (``reward_models.policy.turns.format_decision``); the move is what follows the last word ``action``."""
        return self.describe_message(message)[1]

    def message_for_action(self, action: str, reasoning: str = "") -> dict[str, Any]:
        """A move written the way gridworld policies write their turns."""
        from reward_models.policy.turns import format_decision

        return {"role": "assistant", "content": format_decision(reasoning, action)}

    def describe_message(self, message: dict[str, Any]) -> tuple[str, str]:
        """``(reasoning, move)`` of an assistant turn written ``<reasoning> ; action <move>``."""
        from reward_models.policy.turns import parse_decision

        return parse_decision(message.get("content") or "")

    def render(self, observation: str) -> dict[str, Any]:
        return {"kind": "grid", "rows": parse_observation(observation), "text": observation}

    def oracle(self, task: dict[str, Any]) -> GridOracle:
        return GridOracle(self.layout(task), self.max_steps)


class GridOracle:
    """Ground truth for one gridworld task, by BFS distances to the goal."""

    def __init__(self, layout: Layout, max_steps: int) -> None:
        self.layout = layout
        self.max_steps = max_steps
        self.distances = layout.distances_to_goal()

    def shortest_path_length(self) -> int:
        return self.distances[self.layout.start]

    def _trace(self, actions: Sequence[str]) -> list[Position]:
        """Positions before each action and after the last one, stopping where the episode ends."""
        position = self.layout.start
        positions = [position]
        for action in actions[: self.max_steps]:
            if position == self.layout.goal:
                break
            position = self.layout.move(position, action.strip().lower())
            positions.append(position)
        return positions

    def true_return(self, actions: Sequence[str]) -> float:
        return 1.0 if self.success(actions) else 0.0

    def success(self, actions: Sequence[str]) -> bool:
        return self._trace(actions)[-1] == self.layout.goal

    def progress_return(self, actions: Sequence[str]) -> float:
        """A graded true return that also orders failures: a success scores 1 plus a bonus for the steps it left
        unused (up to 0.5), a failure ``0.5 * (1 - final distance / start distance)``, below every success and
        negative when the agent ended further away than it started. Simulated annotators and evaluation compare
        trajectories of one task with it, so two failures are not a tie when one got closer to the goal."""
        positions = self._trace(actions)
        if positions[-1] == self.layout.goal:
            return 1.0 + 0.5 * (self.max_steps - (len(positions) - 1)) / self.max_steps
        start = self.distances[self.layout.start]
        return 0.5 * (1.0 - self.distances[positions[-1]] / start)

    def step_correct(self, actions: Sequence[str]) -> list[bool]:
        positions = self._trace(actions)
        pairs = zip(positions, positions[1:], strict=False)
        return [self.distances[after] < self.distances[before] for before, after in pairs]

    def best_actions(self, actions_so_far: Sequence[str]) -> list[str]:
        positions = self._trace(actions_so_far)
        position = positions[-1]
        if position == self.layout.goal or len(positions) - 1 >= self.max_steps:
            return []
        return [a for a in ACTIONS if self.distances[self.layout.move(position, a)] < self.distances[position]]
