"""Settings come from the environment; a bad value stops start-up with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from feedback_app.env import env_bool, env_int, env_list, env_str


def test_helpers_name_the_variable_on_bad_values(monkeypatch):
    monkeypatch.setenv("TANDEM_X", "maybe")
    with pytest.raises(ImproperlyConfigured, match="TANDEM_X must be a boolean"):
        env_bool("TANDEM_X", False)
    monkeypatch.setenv("TANDEM_X", "12abc")
    with pytest.raises(ImproperlyConfigured, match="TANDEM_X must be an integer"):
        env_int("TANDEM_X", 1)
    monkeypatch.setenv("TANDEM_X", "0")
    with pytest.raises(ImproperlyConfigured, match="TANDEM_X must be at least 1"):
        env_int("TANDEM_X", 1, minimum=1)
    monkeypatch.delenv("TANDEM_X")
    with pytest.raises(ImproperlyConfigured, match="TANDEM_X is required"):
        env_str("TANDEM_X")


def test_helpers_parse_good_values(monkeypatch):
    monkeypatch.setenv("TANDEM_X", " Yes ")
    assert env_bool("TANDEM_X", False) is True
    monkeypatch.setenv("TANDEM_X", "a.example, b.example,")
    assert env_list("TANDEM_X", []) == ["a.example", "b.example"]
    assert env_int("TANDEM_UNSET_VARIABLE", 7) == 7


ENGINE = "settings.DATABASES['default']['ENGINE']"


def _start_django(printing: str = ENGINE, **env: str) -> subprocess.CompletedProcess:
    """Sets Django up in a fresh interpreter, with `env` over this environment less SECRET_KEY, DEBUG and
    DATABASE_URL, and prints `printing` (an expression over the settings; by default the database engine)."""
    clean = {k: v for k, v in os.environ.items() if k not in {"SECRET_KEY", "DEBUG", "DATABASE_URL"}}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); from django.conf import settings; print({printing})"],
        env={**clean, "DJANGO_SETTINGS_MODULE": "feedback_app.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _make_secret_key(data_dir) -> subprocess.CompletedProcess:
    """Runs `python -m feedback_app.secret_key` with `data_dir` as Tandem's data directory."""
    return subprocess.run(
        [sys.executable, "-m", "feedback_app.secret_key"],
        env={**os.environ, "TANDEM_DATA_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_start_up_stops_when_debug_is_off_without_a_secret_key(tmp_path):
    result = _start_django(DEBUG="false", TANDEM_DATA_DIR=str(tmp_path))
    assert result.returncode != 0
    assert "SECRET_KEY is required when DEBUG is off" in result.stderr


def test_debug_is_off_by_default_and_the_key_file_is_read(tmp_path):
    made = _make_secret_key(tmp_path)
    assert made.returncode == 0, made.stderr
    key_file = tmp_path / "secret_key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    key = key_file.read_text()
    result = _start_django("settings.DEBUG, settings.SECRET_KEY", TANDEM_DATA_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", key]
    again = _make_secret_key(tmp_path)
    assert "kept" in again.stdout and key_file.read_text() == key


def test_start_up_stops_on_a_bad_boolean():
    result = _start_django(DEBUG="perhaps")
    assert result.returncode != 0
    assert "DEBUG must be a boolean" in result.stderr


def test_database_url_selects_postgresql():
    result = _start_django(DATABASE_URL="postgres://u:p@localhost:5432/tandem", SECRET_KEY="x", DEBUG="false")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "django.db.backends.postgresql"


def test_every_setting_read_from_the_environment_is_in_env_example():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    read = set(re.findall(r'env_\w+\("([A-Z_]+)"', (root / "feedback_app" / "settings.py").read_text()))
    listed = set(re.findall(r"^([A-Z_]+)=", (root / ".env.example").read_text(), flags=re.M))
    assert read, "the settings module reads no variables?"
    assert read - listed == set()


def test_healthz_answers_when_the_database_does(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
