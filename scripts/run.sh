#!/bin/sh
# Migrate the embedded database, load the demo, serve with gunicorn + whitenoise.
set -eu
cd "$(dirname "$0")/.."
HOST=${1:-127.0.0.1}
PORT=${2:-8000}
PY=.venv/bin/python
export DEBUG=${DEBUG:-true}

$PY manage.py migrate --noinput
$PY manage.py collectstatic --noinput --verbosity 0
$PY manage.py demo
echo
echo "ledgerdash: http://$HOST:$PORT/ (log in with a demo user above; Ctrl-C stops)"
exec .venv/bin/gunicorn ledgerdash.wsgi --bind "$HOST:$PORT" --workers 2 --access-logfile - --log-level warning
