"""MkDocs hooks: the pages that are generated at build time, so that they cannot drift from what they describe.

- ``reference/configuration.md``: every setting `feedback_app/settings.py` reads from the environment, through the
  typed helpers of `feedback_app/env.py`, with its type and default, and what `.env.example` says of it.
- ``benchmarks/<name>.md``: one page per result file in ``docs/benchmarks/results/``, which ``bench/publish.py``
  writes from a bench's own JSON output. The page shows the command that produced it, the machine and date of that
  run, its figures as tables and the plots it drew as SVG; nothing on it is typed by hand.

Neither imports Django or the product: the settings module is read as source, the results as JSON.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "feedback_app" / "settings.py"
ENV_EXAMPLE = ROOT / ".env.example"
RESULTS = ROOT / "docs" / "benchmarks" / "results"
# A bench's figures under this key are kept in its result file but not shown (each run's own records); a figure whose
# key (or a key above it) ends in SVG is a plot the bench drew, shown as it is.
RAW = "raw"
SVG = "_svg"
HELPERS = {
    "env_str": "text",
    "env_bool": "boolean",
    "env_int": "integer",
    "env_list": "comma-separated list",
    "env_path": "directory path",
    "env_path_list": "comma-separated absolute paths",
}


# --- configuration reference -----------------------------------------------------------------------------------------


def settings_read(source: str | None = None) -> list[dict[str, Any]]:
    """Each environment variable the settings module reads: name, type, default (as written in the source), the
    least value where there is one, and what it does: its comment in `.env.example`, written for operators, or else
    the comment right above it in the settings module."""
    source = SETTINGS.read_text() if source is None else source
    operator_notes = env_example()
    lines = source.splitlines()
    tree = ast.parse(source)
    found: dict[str, dict[str, Any]] = {}
    for statement in tree.body:
        for node in ast.walk(statement):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in HELPERS):
                continue
            if not node.args or not isinstance(node.args[0], ast.Constant):
                continue
            name = node.args[0].value
            if len(node.args) > 1:
                default = ast.unparse(node.args[1])
            else:  # env_str without a default is required; a list of paths defaults to none
                default = "none" if node.func.id == "env_path_list" else None
            minimum = next((ast.unparse(k.value) for k in node.keywords if k.arg == "minimum"), None)
            comment = operator_notes.get(name) or _comment_above(lines, node.lineno)
            found.setdefault(
                name,
                {
                    "name": name,
                    "type": HELPERS[node.func.id],
                    "default": default,
                    "minimum": minimum,
                    "help": comment,
                },
            )
    return list(found.values())


def env_example(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """Each variable `.env.example` sets, with the comment right above it (empty where there is none)."""
    notes: dict[str, str] = {}
    comment: list[str] = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            comment.append(text.lstrip("#").strip())
        elif "=" in text:
            notes[text.split("=", 1)[0].strip()] = " ".join(comment)
            comment = []
        else:
            comment = []
    return notes


def _comment_above(lines: list[str], lineno: int) -> str:
    """The block of ``#`` comment lines right above line `lineno` (1-based), joined; section rulers are not one."""
    block: list[str] = []
    index = lineno - 2
    while index >= 0:
        text = lines[index].strip()
        if not text.startswith("#") or text.startswith("# ---"):
            break
        block.insert(0, text.lstrip("#").strip())
        index -= 1
    return " ".join(block)


def configuration_page() -> str:
    rows = []
    for setting in settings_read():
        default = {None: "required", "none": "none"}.get(setting["default"]) or f"`{setting['default']}`"
        if setting["minimum"] is not None:
            default += f" (at least {setting['minimum']})"
        cells = [f"`{setting['name']}`", setting["type"], default, setting["help"]]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    read = {setting["name"] for setting in settings_read()}
    others = [f"- `{name}`: {note}" for name, note in env_example().items() if name not in read]
    if others:
        others = ["", "Also in `.env.example`, read by the libraries Tandem runs on:", "", *others]
    return "\n".join(
        [
            "# Configuration reference",
            "",
            "Every setting Tandem reads from the environment, generated from `feedback_app/settings.py` when these",
            "docs are built. `.env.example` lists the same settings with their defaults. A value that does not read",
            "as its type stops start-up with a message that names the variable.",
            "",
            "| Variable | Type | Default | What it does |",
            "| --- | --- | --- | --- |",
            *rows,
            *others,
            "",
        ]
    )


# --- benchmark pages -----------------------------------------------------------------------------------------------


def benchmark_page(name: str, result: dict[str, Any]) -> str:
    run = result["run"]
    figures = result["figures"]
    out = [
        f"# {result['title']}",
        "",
        result["about"],
        "",
        "## Reproduce",
        "",
        "```bash",
        run["command"],
        "```",
        "",
        f"`{_publish_command(name, result)}` runs it again and rewrites this page's figures.",
        "",
        f"Run on {run['date']}, on {run['machine']}; commit `{run['commit']}`. "
        f"The figures below are read from `docs/benchmarks/results/{name}.json`, which `bench/publish.py` wrote "
        "from the bench's own output.",
        "",
    ]
    flat = {key: value for key, value in _flatten(figures).items() if key.split(".")[0] != RAW}
    plots = {key: value for key, value in flat.items() if any(part.endswith(SVG) for part in key.split("."))}
    scalars = {key: value for key, value in flat.items() if not isinstance(value, list) and key not in plots}
    tables = {key: value for key, value in flat.items() if _is_table(value)}
    if plots:
        out += ["## Plots", ""]
        out += [f'<div class="bench-plot">{svg}</div>\n' for svg in plots.values()]
    if scalars:
        out += ["## Figures", "", "| Figure | Value |", "| --- | --- |"]
        out += [f"| `{key}` | {_cell(value, key)} |" for key, value in scalars.items()]
        out.append("")
    for key, rows in tables.items():
        columns = list(dict.fromkeys(column for row in rows for column in row))
        out += [f"## `{key}`", "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
        out += ["| " + " | ".join(_cell(row.get(column, ""), column) for column in columns) + " |" for row in rows]
        out.append("")
    if RAW in figures:
        out += [f"Each run's own records are in the file's `figures.{RAW}`, and are not shown here.", ""]
    return "\n".join(out)


def benchmarks_index(results: dict[str, dict[str, Any]]) -> str:
    out = [
        "# Benchmarks",
        "",
        "Each page is generated from a result file that `bench/publish.py` wrote from one run of a bench: its",
        "command, the machine and date of that run, and its figures. `bench/publish.py <bench>` refreshes a page.",
        "",
        "| Benchmark | What it measures | Run on |",
        "| --- | --- | --- |",
    ]
    for name, result in sorted(results.items()):
        about = result["about"].split(". ")[0].rstrip(".") + "."
        out.append(f"| [{result['title']}]({name}.md) | {about} | {result['run']['date']} |")
    return "\n".join(out + [""])


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat |= _flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return flat
    return {prefix: value}


def _is_table(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def _publish_command(name: str, result: dict[str, Any]) -> str:
    """The `bench/publish.py` command that writes this result again: the same bench, variant and arguments."""
    bench = result.get("bench", name)
    variant = f"--variant {name[len(bench) + 1 :]} " if name != bench else ""
    arguments = result["run"]["command"].split(f"bench/{bench}.py", 1)[-1].strip()
    return f".venv/bin/python bench/publish.py {variant}{bench}" + (f" -- {arguments}" if arguments else "")


def _cell(value: Any, column: str = "") -> str:
    if column.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
        text = f"{value / 2**30:.2f} GiB"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def load_results() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}


# --- the hook ------------------------------------------------------------------------------------------------------


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "reference/configuration.md", content=configuration_page()))
    results = load_results()
    files.append(File.generated(config, "benchmarks/index.md", content=benchmarks_index(results)))
    for name, result in results.items():
        files.append(File.generated(config, f"benchmarks/{name}.md", content=benchmark_page(name, result)))
    return files
