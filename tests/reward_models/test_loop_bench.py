"""The measuring code of bench/loop.py that needs no server: the reward model's accuracy on the oracle pairs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "loop.py"


@pytest.fixture(scope="module")
def loop():
    spec = importlib.util.spec_from_file_location("loop_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_oracle_pair_accuracy_is_split_by_pair_type(loop):
    won, lost = SimpleNamespace(success=True), SimpleNamespace(success=False)
    pairs = [(won, lost), (won, lost), (lost, lost), (lost, lost), (lost, lost), (won, won)]
    right = [True, True, True, False, False, True]
    shares = loop.accuracy_by_type(pairs, right)
    assert shares == {"all": 4 / 6, "one_succeeded": 1.0, "both_failed": 1 / 3, "both_succeeded": 1.0}
    assert loop.by_type_text({k: v for k, v in shares.items() if k != "all"}) == (
        "one succeeded 100%, both failed 33%, both succeeded 100%"
    )
    with pytest.raises(ValueError):  # one verdict per pair
        loop.accuracy_by_type(pairs, right[:-1])
