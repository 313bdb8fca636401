"""How long step DPO's per-action balancing (`reward_models.finetune.dpo_pairs.balance_by_action`) takes as the number
of distinct actions grows, and how many pairs it keeps. Prints one line per size and writes them as JSON.

    .venv/bin/python bench/dpo_balance.py                      # 10, 13 and 50 actions, 40 pairs per action
    .venv/bin/python bench/dpo_balance.py --actions 10 100 1000 --pairs_per_action 100

The pairs are drawn with a seed: each picks two distinct actions and prefers the one earlier in the list four times
out of five, so the pairs are lopsided, as interventions on a policy with habits are. The actions are free text
(tool calls with arguments), so none is one of a fixed action set. Times are the best of `--repeats` runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reward_models.finetune.dpo_pairs import PreferencePair, action_counts, balance_by_action  # noqa: E402
from reward_models.policy.turns import TurnEncoding  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actions", type=int, nargs="+", default=[10, 13, 50], help="Distinct actions per run.")
    parser.add_argument("--pairs_per_action", type=int, default=40, help="Pairs drawn per distinct action.")
    parser.add_argument("--repeats", type=int, default=5, help="Runs per size; the fastest is reported.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "dpo_balance.json"))
    return parser.parse_args(argv)


def lopsided_pairs(actions: int, count: int, seed: int) -> list[PreferencePair]:
    names = [f'search({{"query": "item {index}"}})' for index in range(actions)]
    rng = random.Random(seed)
    encoding = TurnEncoding([1], [2])
    pairs = []
    for _ in range(count):
        first, second = sorted(rng.sample(range(actions), 2))
        chosen, rejected = (first, second) if rng.random() < 0.8 else (second, first)
        pairs.append(PreferencePair([encoding], [encoding], names[chosen], names[rejected]))
    return pairs


def measure(actions: int, pairs_per_action: int, repeats: int, seed: int) -> dict[str, object]:
    pairs = lopsided_pairs(actions, actions * pairs_per_action, seed)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        kept = balance_by_action(pairs, seed)
        times.append(time.perf_counter() - started)
    counts = action_counts(kept)
    balanced = all(count["chosen"] == count["rejected"] for count in counts.values())
    return {
        "actions": actions,
        "pairs": len(pairs),
        "kept": len(kept),
        "actions_kept": len(counts),
        "balanced": balanced,
        "seconds": min(times),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    for actions in args.actions:
        result = measure(actions, args.pairs_per_action, args.repeats, args.seed)
        results.append(result)
        print(
            f"{result['actions']:>6} actions  {result['pairs']:>7} pairs  kept {result['kept']:>7} "
            f"({result['actions_kept']} actions, balanced: {result['balanced']})  {result['seconds'] * 1000:.2f} ms"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "bench": "dpo_balance",
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "pairs_per_action": args.pairs_per_action,
        "seed": args.seed,
        "results": results,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all(result["balanced"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
