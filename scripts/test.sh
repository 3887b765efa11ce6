#!/bin/sh
# The whole suite: lint and types, then pytest on SQLite and on PostgreSQL,
# then the benchmark smoke test in .venv-bench, beside the peers.
#
# PostgreSQL comes from TEST_DATABASE_URL (default: the local server, trust
# auth). Outside CI an unreachable server makes the PostgreSQL pass skip with
# a reason; with CI=true it fails instead.
set -eu
cd "$(dirname "$0")/.."
BIN=.venv/bin
PG_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/ledgerdash}

echo "== ruff"
$BIN/ruff check .
$BIN/ruff format --check .
echo "== mypy"
$BIN/mypy ledgerdash reviews bench

echo "== pytest on SQLite"
env -u DATABASE_URL $BIN/pytest -m "not postgres" "$@"

echo "== pytest on PostgreSQL (with the browser tests)"
./scripts/browser.sh
DATABASE_URL=$PG_URL $BIN/pytest -m "not bench" "$@"

echo "== the benchmark smoke test, on PostgreSQL beside the peers (.venv-bench)"
./scripts/venv.sh bench
DATABASE_URL=$PG_URL .venv-bench/bin/pytest -m bench "$@"
