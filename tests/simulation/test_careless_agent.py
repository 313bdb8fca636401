"""The careless tool agent the feedback benches start from: the shipped tool policy fine-tuned on demonstrations whose
mistakes are kept as training turns."""

from __future__ import annotations

import json

from safetensors.torch import load_file

from reward_models.policy.tool_bootstrap import SHIPPED_DIR
from reward_models.policy.turns import transcript
from simulation.careless_agent import ENVIRONMENT_CONFIG, build_careless_agent


def test_the_agent_learns_every_turn_of_demonstrations_that_slip_and_repair(tmp_path):
    policy = build_careless_agent(tmp_path / "careless", mistake_rate=0.5, episodes=6, steps=2)

    rows = [json.loads(line) for line in (tmp_path / "careless-demonstrations.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    # Whole demonstrations, every assistant turn imitated (no step_index), with the tools the shop offers.
    assert all(row["source"] == "demonstration" and row["step_index"] is None for row in rows)
    assert all({tool["function"]["name"] for tool in row["tools"]} >= {"search", "checkout"} for row in rows)
    replies = [m["content"] for row in rows for m in row["messages"] if m["role"] == "tool"]
    assert any('"error"' in reply for reply in replies), "no demonstration slipped"
    assert all('"order placed"' in transcript(row["messages"]) for row in rows), "a demonstration did not repair"

    assert ENVIRONMENT_CONFIG["difficulty"] == 1
    assert json.loads((policy / "tandem_policy.json").read_text())["max_new_tokens"] == 64
    trained, shipped = load_file(policy / "model.safetensors"), load_file(SHIPPED_DIR / "model.safetensors")
    assert trained.keys() == shipped.keys()
    assert any(not trained[name].equal(shipped[name]) for name in shipped)
