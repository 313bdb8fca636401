"""The WSGI module gunicorn serves: it loads every view before the first request and takes what it loaded out of the
garbage collector's full collections, which otherwise walk every one of those objects and hold the worker's threads
for tens of milliseconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, sys
import feedback_app.wsgi
print(json.dumps({
    "frozen": gc.get_freeze_count(),
    "collectable": len(gc.get_objects()),
    "views_loaded": "feedback_app.views.compare" in sys.modules,
    "callable": callable(feedback_app.wsgi.application),
}))
"""


def test_the_wsgi_module_loads_the_views_and_leaves_the_collector_only_what_requests_make(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "feedback_app.settings",
        "TANDEM_DATA_DIR": str(tmp_path),
        "SECRET_KEY": "a-key-for-this-test-only-" + "x" * 40,
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])

    assert figures["views_loaded"] and figures["callable"]
    # Django, the URL configuration and the views are tens of thousands of objects; all of them are frozen, and a
    # full collection then walks a small remainder.
    assert figures["frozen"] > 20_000
    assert figures["collectable"] < figures["frozen"] / 10
