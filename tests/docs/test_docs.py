"""The docs site's generated pages and its code: the configuration reference lists exactly what the settings read
and `.env.example` sets, every benchmark page renders from its result file, and the docs' Python examples run."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)


def test_the_configuration_reference_lists_every_setting_read_and_env_example_sets_each_one():
    read = {setting["name"]: setting for setting in hooks.settings_read()}
    example = hooks.env_example()
    assert set(read) - set(example) == set(), "settings read but missing from .env.example"
    assert set(example) - set(read) == {"HF_HUB_OFFLINE"}, "set in .env.example but read by nothing"
    assert read["TANDEM_RUN_STALE_SECONDS"] == {
        "name": "TANDEM_RUN_STALE_SECONDS",
        "type": "integer",
        "default": "300",
        "minimum": "10",
        "help": example["TANDEM_RUN_STALE_SECONDS"],
    }
    page = hooks.configuration_page()
    assert all(f"| `{name}` |" in page for name in read) and "`HF_HUB_OFFLINE`" in page
    assert all(setting["help"] for setting in read.values()), "every setting says what it does"


def test_a_new_setting_in_the_settings_module_shows_up_with_its_type_default_and_comment():
    source = '# How long to wait.\nWAIT = env_int("TANDEM_WAIT", 5, minimum=1)\nKEY = env_str("TANDEM_KEY")\n'
    wait, key = hooks.settings_read(source)
    assert wait == {
        "name": "TANDEM_WAIT",
        "type": "integer",
        "default": "5",
        "minimum": "1",
        "help": "How long to wait.",
    }
    assert key["default"] is None and key["help"] == ""


def test_every_benchmark_result_renders_as_a_page_that_names_its_file_command_machine_and_date():
    results = hooks.load_results()
    assert results, "no benchmark result is published"
    index = hooks.benchmarks_index(results)
    for name, result in results.items():
        page = hooks.benchmark_page(name, result)
        assert f"docs/benchmarks/results/{name}.json" in page and result["run"]["command"] in page
        assert result["run"]["machine"] in page and result["run"]["date"] in page
        assert f"({name}.md)" in index
        bench = result.get("bench", name)
        assert name == bench or name.startswith(f"{bench}-"), "a variant's file is named after its bench"
        assert result["run"]["command"].startswith(f".venv/bin/python bench/{bench}.py")


def test_a_result_s_nested_figures_become_rows_and_its_lists_of_records_tables():
    result = {
        "title": "T",
        "about": "Measures x. More.",
        "run": {"command": "c", "date": "d", "machine": "m", "commit": "abc"},
        "figures": {"speed": {"labels_per_s": 201.5}, "results": [{"actions": 50, "seconds": 0.0153}]},
    }
    page = hooks.benchmark_page("t", result)
    assert "| `speed.labels_per_s` | 201.5 |" in page
    assert "| actions | seconds |" in page and "| 50 | 0.0153 |" in page


def test_a_result_s_plots_are_drawn_and_its_raw_records_left_in_the_file():
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><polyline points="0,0 1,1"/></svg>'
    result = {
        "title": "T",
        "about": "Measures x.",
        "run": {"command": "c", "date": "d", "machine": "m", "commit": "abc"},
        "figures": {"plot_svg": {"sampled": svg}, "table": [{"arm": "mix"}], "raw": {"0": [{"per_task": [1, 0]}]}},
    }
    page = hooks.benchmark_page("t", result)
    assert f'<div class="bench-plot">{svg}</div>' in page and "`plot_svg.sampled`" not in page
    assert "| mix |" in page and "per_task" not in page and "`figures.raw`" in page


def test_a_variant_s_page_gives_the_command_that_publishes_it_again_and_bytes_in_gib():
    result = {
        "bench": "memory_bench",
        "title": "M (gpu)",
        "about": "Measures memory.",
        "run": {
            "command": ".venv/bin/python bench/memory_bench.py --device cuda",
            "date": "d",
            "machine": "m",
            "commit": "abc",
        },
        "figures": {"results": [{"phase": "dpo", "peak_bytes": 3 * 2**30}]},
    }
    page = hooks.benchmark_page("memory_bench-gpu", result)
    assert "`.venv/bin/python bench/publish.py --variant gpu memory_bench -- --device cuda` runs it again" in page
    assert "| dpo | 3.00 GiB |" in page


def test_the_bring_your_own_environment_example_loads_by_dotted_path_and_plays_an_episode(tmp_path, monkeypatch):
    [example] = python_blocks("environments.md")
    (tmp_path / "my_envs_counter.py").write_text(example)
    monkeypatch.syspath_prepend(str(tmp_path))
    from reward_models.envs.base import load_environment, replay

    env = load_environment("my_envs_counter.Counter", {"limit": 9})
    task = env.make_task(4)
    assert task["target"] == 7 and not set(env.eval_seeds()) & {4}
    first, results = replay(env, task, ["+2", "+2", "+2", "+1"])
    assert first == "value 0, target 7" and results[-1].done and results[-1].info["success"]
    assert env.render(results[-1].observation) == {"kind": "text", "text": "value 7, target 7"}
    sys.modules.pop("my_envs_counter", None)


@pytest.mark.parametrize("page", sorted(path.name for path in DOCS.glob("*.md")))
def test_every_python_block_of_the_docs_at_least_compiles(page):
    for block in python_blocks(page):
        compile(block, page, "exec")


def test_every_bench_that_can_be_published_writes_its_json_where_publish_tells_it():
    spec = importlib.util.spec_from_file_location("bench_publish", ROOT / "bench" / "publish.py")
    publish = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(publish)
    for bench in publish.TITLES:
        flag = publish.OUT_FLAGS.get(bench, "--out")
        assert f'"{flag}"' in (ROOT / "bench" / f"{bench}.py").read_text(), f"{bench} takes no {flag}"
        assert publish.about(bench), f"{bench} has no docstring to describe it"


def test_the_annotator_time_table_of_the_data_guide_gives_the_model_s_defaults():
    from feedback_app.annotator_time import AnnotatorTime

    rows = re.findall(r"^\| `(\w+)` \| (\d+(?:\.\d+)?) \| ", (DOCS / "data.md").read_text(), re.M)
    assert {kind: float(seconds) for kind, seconds in rows} == {
        kind: AnnotatorTime().seconds(kind) for kind in AnnotatorTime.kinds()
    }
