"""The API's settings come from the environment; a bad throttle rate stops start-up naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys


def _settings_value(expression: str, **env: str) -> subprocess.CompletedProcess:
    code = f"import django; django.setup(); from django.conf import settings; print({expression})"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "feedback_app.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_bad_throttle_rate_stops_start_up_naming_the_variable():
    result = _settings_value("settings.TANDEM_API_THROTTLE_RATES", TANDEM_API_THROTTLE_USER="lots")
    assert result.returncode != 0
    assert "TANDEM_API_THROTTLE_USER must look like 100/hour, got 'lots'" in result.stderr


def test_api_limits_are_read_from_the_environment():
    result = _settings_value(
        "settings.REST_FRAMEWORK['DEFAULT_THROTTLE_RATES']['imports'], settings.TANDEM_IMPORT_MAX_BYTES",
        TANDEM_API_THROTTLE_IMPORTS="5/minute",
        TANDEM_IMPORT_MAX_BYTES="2048",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "5/minute 2048"
