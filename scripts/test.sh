#!/bin/sh
# The whole suite: lint and types, then pytest on SQLite and on PostgreSQL.
#
# PostgreSQL comes from TEST_DATABASE_URL (default: the local server, trust
# auth). Outside CI an unreachable server makes the PostgreSQL pass skip with
# a reason; with CI=true it fails instead.
set -eu
cd "$(dirname "$0")/.."
BIN=.venv/bin

echo "== ruff"
$BIN/ruff check .
$BIN/ruff format --check .
echo "== mypy"
$BIN/mypy ledgerdash reviews bench

echo "== pytest on SQLite"
env -u DATABASE_URL $BIN/pytest -m "not postgres" "$@"

echo "== pytest on PostgreSQL (with the browser tests)"
./scripts/browser.sh
DATABASE_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/ledgerdash} $BIN/pytest "$@"
