#!/bin/sh
# The fast loop: lint and types, then every test that is not slow, on SQLite,
# spread over the machine's cores (pytest-xdist). `make test` runs the rest.
#
# Arguments go to pytest: scripts/check.sh tests/test_queue_views.py -k pager
set -eu
cd "$(dirname "$0")/.."
BIN=.venv/bin

echo "== ruff"
$BIN/ruff check .
$BIN/ruff format --check .
echo "== mypy"
$BIN/mypy ledgerdash reviews bench clients/python/src/ledgerdash_client

echo "== pytest on SQLite, without the slow tests"
env -u DATABASE_URL $BIN/pytest -n "${WORKERS:-auto}" -m "not postgres and not slow" "$@"
