#!/usr/bin/env bash
# Set up and run Tandem on this machine: SQLite, Celery's filesystem broker, one worker, the built-in gridworld and
# tiny policy. Safe to run again: nothing that exists is trained again.
set -euo pipefail
cd "$(dirname "$0")"

export TANDEM_DATA_DIR="${TANDEM_DATA_DIR:-$PWD/var}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
host="${TANDEM_HOST:-127.0.0.1}"
port="${TANDEM_PORT:-8000}"
mkdir -p "$TANDEM_DATA_DIR/logs"

scripts/install.sh
py=.venv/bin/python
$py -m feedback_app.secret_key
$py manage.py migrate --noinput
$py manage.py bootstrap_demo

.venv/bin/celery -A training worker -Q rollouts,training,default --concurrency 1 --loglevel INFO \
  >"$TANDEM_DATA_DIR/logs/worker.log" 2>&1 &
worker_pid=$!
trap 'kill $worker_pid 2>/dev/null; wait $worker_pid 2>/dev/null' EXIT INT TERM

echo
echo "Tandem is running at http://$host:$port/  (worker log: $TANDEM_DATA_DIR/logs/worker.log; Ctrl-C stops both)"
echo "Demo logins are listed above and kept in $TANDEM_DATA_DIR/demo-logins.txt"
echo
.venv/bin/gunicorn feedback_app.wsgi --bind "$host:$port" --workers 2 --threads 4 --timeout 120 \
  --access-logfile "$TANDEM_DATA_DIR/logs/access.log"
