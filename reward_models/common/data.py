"""Reading a Tandem export: its rows (JSONL or Parquet), a trainer's row check and the error that names the bad
rows, the split by task into training and held-out rows (for comparisons, with their ties), and a row's tools and
transcript."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reward_models.common.config import ConfigError


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of an exported file, JSONL or Parquet. A missing file is a `ConfigError` on `data_path`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("data_path", f"no such file: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError("data_path", f"line {number} is not JSON: {exc.msg}") from None
    return rows


def bad_rows(rows: Sequence[dict[str, Any]], problem: Callable[[dict[str, Any]], str | None]) -> dict[int, str]:
    """The number (from 1) and reason of every row `problem` finds fault with: a trainer's own row check, which it
    runs when it loads its data and Tandem runs on a snapshot before it launches a run."""
    return {number: reason for number, row in enumerate(rows, start=1) if (reason := problem(row))}


def rows_error(problems: Mapping[int, str], total: int) -> ConfigError:
    """A `ConfigError` on `data_path` that names every bad row (`bad_rows`), grouped by reason.

    >>> str(rows_error({13: "no prompt", 20: "no prompt", 31: "empty"}, 40))
    'data_path: 3 of 40 rows cannot be used: rows 13, 20: no prompt; row 31: empty'
    """
    by_reason: dict[str, list[int]] = {}
    for number, reason in sorted(problems.items()):
        by_reason.setdefault(reason, []).append(number)
    parts = []
    for reason, numbers in by_reason.items():
        shown = ", ".join(str(number) for number in numbers[:10])
        more = f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
        parts.append(f"row{'s' if len(numbers) > 1 else ''} {shown}{more}: {reason}")
    return ConfigError("data_path", f"{len(problems)} of {total} rows cannot be used: {'; '.join(parts)}")


def split_by_task(
    rows: Sequence[dict[str, Any]], eval_fraction: float, seed: int, key: str = "task_id"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held out): whole tasks go to one side, so evaluation measures generalisation to unseen tasks. Rows
    without the key are split one by one. With `eval_fraction` 0 everything trains."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for index, row in enumerate(rows):
        group = row.get(key)
        groups.setdefault(("row", index) if group is None else ("task", group), []).append(row)
    names = sorted(groups, key=repr)
    random.Random(seed).shuffle(names)
    n_eval = round(len(names) * eval_fraction)
    if eval_fraction > 0 and len(names) > 1:
        n_eval = min(max(n_eval, 1), len(names) - 1)
    held_out = set(names[:n_eval])
    train = [row for name in names if name not in held_out for row in groups[name]]
    evaluation = [row for name in names if name in held_out for row in groups[name]]
    return train, evaluation


def split_comparisons(
    rows: Sequence[dict[str, Any]], config: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(train, held out, ties dropped) of a judge's comparison rows: whole tasks held out by `split_by_task` on
    `config.eval_fraction` and `config.seed`, and with ``config.ties == "drop"`` the tied pairs taken out of
    training (held-out ties stay, for the tie figures). A ConfigError on ``data_path`` when no comparison is left
    to train on."""
    train_rows, eval_rows = split_by_task(rows, config.eval_fraction, config.seed)
    dropped_ties = 0
    if config.ties == "drop":
        dropped_ties = sum(bool(row.get("tie")) for row in train_rows)
        train_rows = [row for row in train_rows if not row.get("tie")]
    if not train_rows:
        raise ConfigError("data_path", "leaves no comparisons to train on after the held-out split and dropped ties")
    return train_rows, eval_rows, dropped_ties


def row_tools(row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The tool schemas a conversational row offers the agent (its ``tools`` column: a list in JSONL, JSON text in
    Parquet), in the form ``apply_chat_template(..., tools=...)`` takes them: None when it offers none."""
    tools = row.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools) if tools else None
    return list(tools) if tools else None


def message_text(messages: str | Sequence[Mapping[str, str]]) -> str:
    """Conversational turns as the ``Role: content`` transcript (`reward_models.policy.turns.transcript`, the form of
    the exports' `text` style and of prompts for models without a chat template); plain text is returned as it is."""
    from reward_models.policy.turns import transcript

    return messages if isinstance(messages, str) else transcript(messages)


def rows_style(rows: Sequence[Mapping[str, Any]]) -> str:
    """``text`` when the rows' prompts are text, ``conversational`` when they are message lists (a mix is a
    `ConfigError` on ``data_path``)."""
    styles = {"text" if isinstance(row["prompt"], str) else "conversational" for row in rows}
    if len(styles) > 1:
        raise ConfigError("data_path", "mixes text rows and conversational rows")
    return styles.pop() if styles else "text"


def checked_rows(
    config: Any, problems: Callable[[list[dict[str, Any]], Any], Mapping[int, str]]
) -> list[dict[str, Any]]:
    """The rows of `config.data_path`, refused with a ConfigError on ``data_path`` when it holds none or when
    `problems(rows, config)` finds malformed ones."""
    rows = read_rows(config.data_path)
    if not rows:
        raise ConfigError("data_path", "holds no rows")
    if found := problems(rows, config):
        raise rows_error(found, len(rows))
    return rows
