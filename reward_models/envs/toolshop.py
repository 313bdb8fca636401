"""The built-in tool-use environment: a small web shop driven through JSON-schema function calls.

Each task seed generates a catalogue (items named ``<colour> <product>``, e.g. ``red mug``, each with an id and a
price) and a shopping goal written as the user's instruction, e.g. ``Buy "red mug", quantity 3.`` The agent reaches the
goal through six tools (``TOOLS``, OpenAI-style schemas, also in every task under ``"tools"``):

- ``search(query)``: the items sharing a word with the query, shuffled, as a JSON list of ``{"name", "id", "price"}``;
- ``get_item(item_id)``: one item's details;
- ``add_to_cart(item_id, quantity)`` and ``remove_from_cart(item_id)``: change the cart and return it;
- ``view_cart()``: the cart and its total;
- ``checkout()``: places the order and ends the episode.

Ids are opaque (``kq48``) and differ per seed, so every task needs a lookup: search, read the id off the result whose
name matches, then act on it. The episode succeeds when the placed order holds exactly the goal's items and
quantities (reward 1.0 on that last step, 0.0 otherwise).

Actions are assistant messages in the OpenAI shape::

    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
        "function": {"name": "search", "arguments": "{\\"query\\": \\"red mug\\"}"}}]}

Parallel calls run in order. Each call is answered by one tool message ``{"role": "tool", "tool_call_id", "name",
"content"}`` in ``StepResult.info["messages"]``; a call that does not parse, names an unknown tool or breaks its
schema is answered by a tool message ``{"error": ...}``, as a real API answers, and costs the turn. An assistant
message without tool calls (or a plain string, which is taken as such a message) is the agent's final answer: it ends
the episode, a failure unless an order was placed before (checkout already ends it, so in practice a failure). The
episode also ends after ``max_turns`` assistant turns.

Difficulty (``difficulty``, 1 to 4) sets how much lookup a task needs; ``DIFFICULTIES`` holds the numbers:

1. four items with no word in common and one item to buy: a search returns only the target;
2. three products in two or three colours each, one item to buy: a search returns the target among 2 to 5 items
   sharing a word with it, so the id must be matched by name;
3. as 2 with two items to buy (five tool calls);
4. four products in three or four colours, one or two items, some goals ``the cheapest <product>`` (prices compared).

The default is 2, which the tool-use demo project runs: the built-in tiny policy
(``reward_models.policy.tool_bootstrap``), trained on level 1, succeeds there part of the time. A task records its
difficulty, and ``reset`` and ``oracle`` follow the task's rather than the environment's, so a stored task always
replays the same way.

Seeds: ``eval_seeds()`` is ``range(1_000_000, 1_000_200)``, 200 held-out tasks, as for the gridworld.

The tools, their checks and the messages that make calls are in `reward_models.envs.toolshop_tools`; the catalogue,
the difficulty levels and the task generation in `reward_models.envs.toolshop_catalogue`. Nothing here imports anything
heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reward_models.envs.base import StepResult
from reward_models.envs.toolshop_catalogue import DIFFICULTIES, GoalItem, Scenario, generate_scenario
from reward_models.envs.toolshop_tools import (
    MAX_QUANTITY,
    TOOLS,
    check_tool_call,
    message_calls,
    tool_call_message,
    tool_json,
)

EVAL_SEEDS = range(1_000_000, 1_000_200)
SYSTEM_PROMPT = "You are the shop's assistant. Place the customer's order with the tools."


@dataclass
class ShopState:
    """The mutable state of one episode, and the tool implementations."""

    scenario: Scenario
    cart: dict[str, int] = field(default_factory=dict)
    seen_ids: set[str] = field(default_factory=set)  # ids any tool result has shown the agent
    order: dict[str, int] | None = None
    turns: int = 0

    def call(self, name: str, arguments: str) -> tuple[str, bool]:
        """Run one tool call; returns the tool message content and whether the call was valid."""
        if self.order is not None:
            return _error("the order has already been placed"), False
        parsed, error = check_tool_call(name, arguments)
        if parsed is None:
            return _error(error), False
        return getattr(self, f"_tool_{name}")(**parsed)

    def _tool_search(self, query: str) -> tuple[str, bool]:
        found = self.scenario.search(query)
        self.seen_ids.update(item.item_id for item in found)
        return tool_json([item.summary() for item in found]), True

    def _tool_get_item(self, item_id: str) -> tuple[str, bool]:
        item = self.scenario.item(item_id)
        if item is None:
            return _error(f"no item with id {item_id!r}"), False
        self.seen_ids.add(item_id)
        return tool_json(item.details()), True

    def _tool_add_to_cart(self, item_id: str, quantity: int) -> tuple[str, bool]:
        if self.scenario.item(item_id) is None:
            return _error(f"no item with id {item_id!r}"), False
        if self.cart.get(item_id, 0) + quantity > MAX_QUANTITY:
            return _error(f"at most {MAX_QUANTITY} of one item per order"), False
        self.cart[item_id] = self.cart.get(item_id, 0) + int(quantity)
        return self._cart_content(), True

    def _tool_remove_from_cart(self, item_id: str) -> tuple[str, bool]:
        if item_id not in self.cart:
            return _error(f"{item_id!r} is not in the cart"), False
        del self.cart[item_id]
        return self._cart_content(), True

    def _tool_view_cart(self) -> tuple[str, bool]:
        return self._cart_content(total=True), True

    def _tool_checkout(self) -> tuple[str, bool]:
        if not self.cart:
            return _error("the cart is empty"), False
        self.order = dict(self.cart)
        total = sum(self.scenario.item(item_id).price * count for item_id, count in self.cart.items())
        return tool_json({"status": "order placed", "items": sum(self.cart.values()), "total": total}), True

    def _cart_content(self, total: bool = False) -> str:
        lines = []
        for item_id, quantity in self.cart.items():
            item = self.scenario.item(item_id)
            lines.append({"name": item.name, "id": item_id, "quantity": quantity})
        self.seen_ids.update(self.cart)
        payload: dict[str, Any] = {"cart": lines}
        if total:
            payload["total"] = sum(self.scenario.item(i).price * q for i, q in self.cart.items())
        return tool_json(payload)

    @property
    def success(self) -> bool:
        return self.order is not None and self.order == self.scenario.goal_cart()

    def known(self, line: GoalItem) -> bool:
        """Whether the agent has been shown what it needs to act on ``line``: its id, and for ``the cheapest`` the
        ids (with prices) of every variant of the product."""
        if line.cheapest:
            product = self.scenario.item(line.item_id).product
            return all(item.item_id in self.seen_ids for item in self.scenario.items if item.product == product)
        return line.item_id in self.seen_ids

    def calls_to_go(self) -> float:
        """The fewest tool calls that still reach the goal (0 once it is reached, infinity once the order is wrong)."""
        if self.order is not None:
            return 0.0 if self.success else float("inf")
        goal = self.scenario.goal_cart()
        calls = 1  # checkout
        calls += sum(1 for item_id in self.cart if item_id not in goal)
        for line in self.scenario.goal:
            have = self.cart.get(line.item_id, 0)
            if have != line.quantity:
                calls += (have > line.quantity) + 1  # remove first if there are too many, then add
                calls += 0 if self.known(line) else 1  # search
        return float(calls)


def _error(message: str) -> str:
    return tool_json({"error": message})


class ToolShop:
    """The tool-use shop (see the module docstring).

    >>> env = ToolShop()
    >>> task = env.make_task(seed=3)
    >>> env.reset(task) == task["instruction"]
    True
    >>> best = env.oracle(task).best_actions([])[0]
    >>> env.step(best).info["messages"][0]["role"]
    'tool'
    """

    def __init__(self, difficulty: int = 2, max_turns: int = 8) -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {sorted(DIFFICULTIES)}, got {difficulty}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.difficulty = difficulty
        self.max_turns = max_turns
        self._state: ShopState | None = None
        self._done = True

    def make_task(self, seed: int) -> dict[str, Any]:
        scenario = generate_scenario(seed, self.difficulty)
        return {"seed": seed, "instruction": scenario.instruction, "tools": TOOLS, "difficulty": self.difficulty}

    def eval_seeds(self) -> range:
        return EVAL_SEEDS

    def prompt_messages(self, task: dict[str, Any], first_observation: str) -> list[dict[str, Any]]:
        """A short system turn (the chat template adds the tools after it) and the customer's request."""
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": first_observation}]

    def scenario(self, task: dict[str, Any]) -> Scenario:
        """The task's catalogue and goal (hidden information: the oracle's, not the agent's)."""
        return generate_scenario(int(task["seed"]), int(task.get("difficulty", self.difficulty)))

    def reset(self, task: dict[str, Any]) -> str:
        self._state = ShopState(self.scenario(task))
        self._done = False
        return self._state.scenario.instruction

    def step(self, action: dict[str, Any] | str) -> StepResult:
        if self._state is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        state = self._state
        state.turns += 1
        calls = message_calls(action)
        messages = []
        invalid = 0
        for call_id, name, arguments in calls:
            content, valid = state.call(name, arguments)
            invalid += not valid
            messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": content})
        final_answer = not calls
        self._done = final_answer or state.order is not None or state.turns >= self.max_turns
        success = state.success
        info = {
            "messages": messages,
            "success": success,
            "calls": len(calls),
            "invalid_calls": invalid,
            "final_answer": final_answer,
            "order_placed": state.order is not None,
        }
        observation = "\n".join(message["content"] for message in messages)
        return StepResult(observation, 1.0 if success and self._done else 0.0, self._done, info)

    @property
    def state(self) -> ShopState:
        """The running episode's state: hidden information, for the oracle and scripted demonstrators."""
        if self._state is None:
            raise RuntimeError("no episode: call reset() first")
        return self._state

    def legal_actions(self) -> list[str]:
        # An open action space: any assistant message is an action.
        return []

    def action_from_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """The shop is given the assistant message itself, its tool calls read as a field."""
        return message

    def render(self, observation: str) -> dict[str, Any]:
        return {"kind": "text", "text": observation}

    def oracle(self, task: dict[str, Any]) -> ShopOracle:
        return ShopOracle(self.scenario(task), self.max_turns)


class ShopOracle:
    """Ground truth for one shop task. An action is an assistant message (or a plain string, a final answer)."""

    def __init__(self, scenario: Scenario, max_turns: int) -> None:
        self.scenario = scenario
        self.max_turns = max_turns

    def _trace(self, actions: Sequence[dict[str, Any] | str]) -> tuple[list[ShopState], bool]:
        """The state before each action and after the last one, stopping where the episode ends; and whether it
        has ended."""
        env = ToolShop(self.scenario.difficulty, self.max_turns)
        env.reset({"seed": self.scenario.seed, "difficulty": self.scenario.difficulty})
        states = [_snapshot(env._state)]
        for action in actions:
            if env._done:
                break
            env.step(action)
            states.append(_snapshot(env._state))
        return states, env._done

    def success(self, actions: Sequence[dict[str, Any] | str]) -> bool:
        return self._trace(actions)[0][-1].success

    def true_return(self, actions: Sequence[dict[str, Any] | str]) -> float:
        return 1.0 if self.success(actions) else 0.0

    def progress_return(self, actions: Sequence[dict[str, Any] | str]) -> float:
        """A graded return that also orders failures: a success scores 1 plus up to 0.5 for unused turns, a failure
        ``0.5 * (1 - calls still needed / calls needed at the start)``, negative when it ended further away than it
        started. A wrong order counts as one call worse than the cart it was placed with."""
        states, _ = self._trace(actions)
        final = states[-1]
        if final.success:
            return 1.0 + 0.5 * (self.max_turns - final.turns) / self.max_turns
        start = states[0].calls_to_go()
        remaining = final.calls_to_go()
        if remaining == float("inf"):
            before = _snapshot(final)
            before.cart, before.order = dict(final.order), None
            remaining = before.calls_to_go() + 1
        return 0.5 * (1.0 - remaining / start)

    def step_correct(self, actions: Sequence[dict[str, Any] | str]) -> list[bool]:
        """A step is correct when its calls bring the goal at least as many calls closer as they are (no error,
        nothing wasted); a search that happens to show two goal items' ids saves a later one."""
        states, _ = self._trace(actions)
        correct = []
        for action, before, after in zip(actions, states, states[1:], strict=False):
            calls = len(message_calls(action))
            correct.append(calls > 0 and after.calls_to_go() <= before.calls_to_go() - calls)
        return correct

    def best_actions(self, actions_so_far: Sequence[dict[str, Any] | str]) -> list[dict[str, Any]]:
        """The optimal next assistant messages, one tool call each, the canonical one first: wrong cart lines are
        removed, then the goal's lines are handled in the instruction's order (search, then add), then checkout."""
        states, done = self._trace(actions_so_far)
        return [] if done else self.best_actions_at(states[-1])

    def best_actions_at(self, state: ShopState) -> list[dict[str, Any]]:
        """``best_actions`` for a running episode's current state (``ToolShop.state``), without replaying it."""
        goal = self.scenario.goal_cart()
        calls: list[tuple[str, dict[str, Any]]] = [
            ("remove_from_cart", {"item_id": item_id}) for item_id in state.cart if item_id not in goal
        ]
        for line in self.scenario.goal:
            have = state.cart.get(line.item_id, 0)
            if have > line.quantity:
                calls.append(("remove_from_cart", {"item_id": line.item_id}))
            elif have < line.quantity:
                if state.known(line):
                    calls.append(("add_to_cart", {"item_id": line.item_id, "quantity": line.quantity - have}))
                else:
                    item = self.scenario.item(line.item_id)
                    query = item.product if line.cheapest else item.name
                    calls.append(("search", {"query": query}))
        if not calls:
            calls.append(("checkout", {}))
        return [tool_call_message([call]) for call in calls]


def _snapshot(state: ShopState) -> ShopState:
    return ShopState(
        state.scenario,
        dict(state.cart),
        set(state.seen_ids),
        None if state.order is None else dict(state.order),
        state.turns,
    )
