"""The packages' layering: no import circle among the project's modules (function-level and type-checking imports
count too, since they are the same dependency postponed); the web side reaches the training side through
`training.launch` alone, and the training side reads the web side's models and nothing else of it; and
`reward_models` stays free of Django and of the web and worker packages, so trainers run anywhere."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("feedback_app", "training", "reward_models")


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of `packages` under `root` by dotted name (a package by its own name), migrations left out."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `name` imports anywhere in its source: `from a.b import c` names a.b.c when that is a
    module, else a.b; a module's own parent packages are left out (importing them is Python's doing, not a choice)."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            candidates = [f"{module}.{alias.name}" for alias in node.names] + [module]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name and not name.startswith(candidate + "."):
                targets.add(candidate)
                break
    return targets


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, directly or through others (Tarjan's strongly connected
    components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_of_the_project_imports_itself_back_through_others():
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 100  # every package was read
    assert circles(graph) == []


def test_feedback_app_reaches_training_through_training_launch_only():
    graph = import_graph(ROOT, PACKAGES)
    crossings = {
        (name, target)
        for name, targets in graph.items()
        if name.startswith("feedback_app")
        for target in targets
        if target.startswith("training")
    }
    assert crossings  # the web side does launch runs
    assert {target for _, target in crossings} == {"training.launch"}, sorted(crossings)


def test_training_reads_feedback_app_s_models_and_nothing_else_of_it():
    graph = import_graph(ROOT, PACKAGES)
    reached = {
        target
        for name, targets in graph.items()
        if name.startswith("training")
        for target in targets
        if target.startswith("feedback_app")
    }
    assert "feedback_app.models" in reached  # the worker does read and write the rows
    assert {target for target in reached if not target.startswith("feedback_app.models")} == set()


def test_the_circle_check_finds_a_circle_made_of_function_level_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import f\n")
    (package / "b.py").write_text("def f():\n    from pkg import c\n")
    (package / "c.py").write_text("from . import a\n")
    (package / "d.py").write_text("import pkg.a\n")

    graph = import_graph(tmp_path, ["pkg"])

    assert graph["pkg.d"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_reward_models_imports_neither_django_nor_the_web_and_worker_packages():
    offenders = {}
    for name, path in modules(ROOT, ["reward_models"]).items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bad = [n for n in names if n.split(".")[0] in ("django", "rest_framework", "celery", *PACKAGES[:2])]
            if bad:
                offenders.setdefault(name, []).extend(bad)
    assert offenders == {}


def test_the_shipped_packages_never_import_the_simulated_data_of_tests_and_benches():
    offenders = {
        name: sorted(target for target in targets if target.split(".")[0] == "simulation")
        for name, targets in import_graph(ROOT, (*PACKAGES, "simulation")).items()
        if name.split(".")[0] in PACKAGES
    }
    assert {name: found for name, found in offenders.items() if found} == {}


# The modules that may send SQL of their own, each for a reason its docstring gives: the annotators' busiest request
# (the hot_path package), the bulk import's COPY and multi-row inserts, the agreement figures the database counts, the
# exports' id lists sent as one array on PostgreSQL, and the health check's SELECT 1. Everything else uses the ORM.
RAW_SQL_ALLOWED = (
    "feedback_app/hot_path/",
    "feedback_app/imports/bulk_sql.py",
    "feedback_app/agreement.py",
    "feedback_app/exports/conversation.py",
    "feedback_app/views/health.py",
)
RAW_SQL = re.compile(r"\.execute\(|\bRawSQL\(|\.raw\(|\.extra\(|connection\.cursor\(")


def raw_sql_modules(root: Path, packages: Iterable[str]) -> set[str]:
    """The modules of `packages` (migrations left out) whose source sends SQL of its own."""
    found = set()
    for package in packages:
        for path in (root / package).rglob("*.py"):
            if "migrations" not in path.parts and RAW_SQL.search(path.read_text()):
                found.add(path.relative_to(root).as_posix())
    return found


def test_raw_sql_lives_only_in_the_modules_that_say_why(tmp_path):
    outside = {name for name in raw_sql_modules(ROOT, PACKAGES) if not name.startswith(RAW_SQL_ALLOWED)}
    assert outside == set()
    # The check sees a cursor where one is added.
    (tmp_path / "feedback_app").mkdir()
    (tmp_path / "feedback_app" / "views.py").write_text("with connection.cursor() as c:\n    c.execute('SELECT 1')\n")
    assert raw_sql_modules(tmp_path, ["feedback_app"]) == {"feedback_app/views.py"}
