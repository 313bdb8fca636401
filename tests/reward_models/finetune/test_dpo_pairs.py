"""The preference pairs DPO trains on: per-action balancing (a maximal balanced subset, one-off answers kept), what
counts as an action, and the counts of pairs a run trains on and why the others do not."""

from __future__ import annotations

from reward_models.common.config import config_from_dict
from reward_models.envs.gridworld import GridWorld
from reward_models.finetune.dpo import DPOConfig, pair_counts
from reward_models.finetune.dpo_pairs import PreferencePair, action_counts, action_key, balance_by_action
from reward_models.policy.turns import TurnEncoding, format_decision
from tests.reward_models import tool_chat

SMALL_GRID = {"size": 4, "max_steps": 6}
GRID = GridWorld(**SMALL_GRID)


def _pair(chosen: str, rejected: str) -> PreferencePair:
    encoding = TurnEncoding([1], [2])
    return PreferencePair([encoding], [encoding], chosen, rejected)


def test_balancing_keeps_pairs_in_which_every_action_is_as_often_chosen_as_rejected():
    # Lopsided, as interventions on a policy that over-uses "down" are: down is rejected 6 times, chosen once.
    pairs = [_pair("up", "down")] * 4 + [_pair("left", "down")] * 2 + [_pair("down", "up")]
    pairs += [_pair("down", "left"), _pair("left", "right"), _pair("right", "up"), _pair("up", "left")]
    pairs += [_pair("up", "garbled text")]
    balanced = balance_by_action(pairs, seed=0)
    counts = action_counts(balanced)
    assert all(count["chosen"] == count["rejected"] for count in counts.values())
    # Cycles down>left>down, down>up>down and left>right>up>left: 7 pairs, of which only one of the 4 up>down.
    assert len(balanced) == 7
    assert sum((p.chosen_action, p.rejected_action) == ("up", "down") for p in balanced) == 1
    assert "garbled text" not in counts
    assert balance_by_action(balanced, seed=1) == balanced


def _dropped_hold_a_cycle(pairs: list[PreferencePair], kept: list[PreferencePair]) -> bool:
    """Whether the pairs balancing left out (counted by edge) still hold a cycle between actions seen more than once:
    a balanced subset that could have been larger."""
    seen = [action for pair in pairs for action in (pair.chosen_action, pair.rejected_action)]
    node = {action: (action if seen.count(action) > 1 else None) for action in seen}
    left = {}
    for pair in pairs:
        edge = (node[pair.chosen_action], node[pair.rejected_action])
        left[edge] = left.get(edge, 0) + 1
    for pair in kept:
        left[(node[pair.chosen_action], node[pair.rejected_action])] -= 1
    graph = {}
    for (a, b), count in left.items():
        if count:
            graph.setdefault(a, set()).add(b)
    # Kahn's algorithm: a graph is acyclic exactly when repeatedly removing sourceless nodes empties it.
    nodes = set(graph) | {b for targets in graph.values() for b in targets}
    indegree = {n: 0 for n in nodes}
    for targets in graph.values():
        for b in targets:
            indegree[b] += 1
    ready = [n for n in nodes if indegree[n] == 0]
    removed = 0
    while ready:
        n = ready.pop()
        removed += 1
        for b in graph.get(n, ()):
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    return removed < len(nodes)


def test_balancing_free_text_actions_keeps_a_maximal_balanced_subset():
    import random

    # 50 distinct free-text actions (tool calls with free arguments, say), chosen over one another at random and
    # lopsidedly: actions early in the list are mostly chosen, late ones mostly rejected.
    actions = [f'search({{"query": "item {index}"}})' for index in range(50)]
    rng = random.Random(7)
    pairs = []
    for _ in range(400):
        a, b = sorted(rng.sample(range(50), 2))
        chosen, rejected = (a, b) if rng.random() < 0.8 else (b, a)
        pairs.append(_pair(actions[chosen], actions[rejected]))
    kept = balance_by_action(pairs, seed=0)
    counts = action_counts(kept)
    assert len(kept) > 100
    # Every action kept is as often chosen as rejected: none is only ever chosen or only ever rejected.
    assert all(count["chosen"] == count["rejected"] > 0 for count in counts.values())
    assert not _dropped_hold_a_cycle(pairs, kept)
    assert balance_by_action(pairs, seed=0) == kept


def test_balancing_keeps_pairs_of_one_off_free_text_answers():
    # Every answer written once (typed commands, free-form replies): no answer is a habit to unlearn, so each pair
    # stands; the same answer chosen twice and never rejected is still balanced away.
    pairs = [_pair(f"answer {index}", f"reply {index}") for index in range(20)]
    assert balance_by_action(pairs, seed=3) == pairs
    lopsided = [_pair("always", "reply a"), _pair("always", "reply b")]
    assert balance_by_action(pairs + lopsided, seed=3) == pairs


def test_an_action_is_what_the_environment_plays_or_the_tool_calls_a_turn_makes():
    assert action_key(GRID, {"role": "assistant", "content": "goal is up 1 left 0 ; action up"}) == "up"
    field = tool_chat.field_call("add", {"item_id": "k7", "quantity": 2})
    markup = tool_chat.markup_call("add", {"quantity": 2, "item_id": "k7"}, thought="found it")
    # The same call, written as a field or as markup, with other reasoning around it, is the same action.
    assert action_key(GRID, field) == action_key(GRID, markup) != action_key(GRID, tool_chat.markup_call("add", {}))


def test_the_pair_counts_say_how_many_pairs_train_and_why_the_others_do_not(tiny_policy_dir):
    def row(chosen: str, rejected: str, **extra) -> dict:
        prompt = [{"role": "system", "content": "reach the goal"}, {"role": "user", "content": "A . G"}]
        sides = [[{"role": "assistant", "content": format_decision("go", action)}] for action in (chosen, rejected)]
        return {"prompt": prompt, "chosen": sides[0], "rejected": sides[1], **extra}

    # Seven intervention pairs, lopsided as on a policy that over-uses "down": balancing keeps one cycle of two.
    rows = [row("up", "down")] * 4 + [row("left", "down")] * 2 + [row("down", "up"), row("up", "left", tie=True)]
    config = config_from_dict(DPOConfig, {"policy_path": str(tiny_policy_dir), "data_path": "x", "batch_size": 16})
    counts = pair_counts(rows, config)
    assert counts == {"rows": 8, "ties": 1, "pairs": 7, "unbalanced": 5, "used": 2, "steps": 1}
    config.balance = "none"
    assert pair_counts(rows, config)["used"] == 7
