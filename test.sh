#!/usr/bin/env bash
# Install Tandem with its test extras, then lint and run the whole suite. Extra arguments go to pytest.
# Without DATABASE_URL / CELERY_BROKER_URL the suite runs on SQLite and the filesystem broker; .ci/run points
# both at real PostgreSQL and Redis.
set -euo pipefail
cd "$(dirname "$0")"

scripts/install.sh test
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "Installing Debian's chromium for the browser tests..."
  apt-get update -q && apt-get install -y -q chromium >/dev/null
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DJANGO_ALLOW_ASYNC_UNSAFE=true
export TANDEM_DATA_DIR="${TANDEM_DATA_DIR:-$PWD/var/test}"
mkdir -p "$TANDEM_DATA_DIR"
.venv/bin/python -m feedback_app.secret_key >/dev/null

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python manage.py makemigrations --check --dry-run >/dev/null || {
  echo "Model changes without a migration: run manage.py makemigrations." >&2; exit 1; }
# The docs site (mkdocs.yml): --strict fails on a broken link or a page left out; generated pages come from
# docs/hooks.py.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet
# Test processes (pytest-xdist): one per core, two to four, each with its own database, data directory and broker
# (tests/xdist_env.py); modules are spread over them (tests/conftest.py). TEST_PROCESSES=0 runs everything here.
cores=$(nproc 2>/dev/null || echo 2)
processes=${TEST_PROCESSES:-$(( cores < 2 ? 2 : (cores > 4 ? 4 : cores) ))}
echo "Running the tests in $processes processes ($cores cores)."
exec .venv/bin/python -m pytest -p tests.xdist_env -n "$processes" "$@"
