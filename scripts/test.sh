#!/bin/sh
# The whole suite: lint and types, then pytest on SQLite and on PostgreSQL,
# then the PostgreSQL-only tests through PgBouncer in transaction mode, then
# the benchmark smoke test (in .venv-bench, beside the peers), then the
# coverage of the two main passes against its floor (pyproject.toml,
# [tool.coverage.report] fail_under).
#
# PostgreSQL comes from TEST_DATABASE_URL (default: the local server, trust
# auth); each run names its own test databases after it (tests/conftest.py).
# Outside CI an unreachable server makes the PostgreSQL passes skip with a
# reason; with CI=true they fail instead. WORKERS=n sets how many processes
# each pass spreads over (default: one more than the cores; 0 runs in this one).
#
# Arguments go to every pytest run. A run that collects nothing exits 5,
# which stops this script: no pass can succeed by running no test.
#
# Besides its fixed seeds, the simulation runs seeds of this commit's own
# (tests/sim_seeds.py), printed first: a failing one replays by its seed.
set -eu
cd "$(dirname "$0")/.."
BIN=.venv/bin
PG_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/ledgerdash}
# The crash drills stay on one worker, one after another: each starts agents,
# a provider and reconcilers of its own (tests/test_crashdrill.py). Every
# other test, slow ones included, is spread over the workers beside them.
# One worker more than the cores: many tests wait on processes they start
# (live servers, agents, providers), and the extra worker keeps the cores busy
# meanwhile (on 2 cores the two main passes took 6:17 and 9:01 with 2 workers,
# 4:28 and 7:39 with 3).
XDIST="-n ${WORKERS:-$(($(nproc) + 1))} --dist loadgroup"

echo "== the simulation's seeds for this commit"
$BIN/python -m tests.sim_seeds

echo "== ruff"
$BIN/ruff check .
$BIN/ruff format --check .
echo "== mypy"
$BIN/mypy ledgerdash reviews bench clients/python/src/ledgerdash_client

# Each pass names its slowest tests at its end: where `make test`'s time goes.
DURATIONS="--durations=15"

# The floor is judged once, on both passes together: PostgreSQL-only code
# would count as missed in either pass alone.
COV="--cov --cov-report= --cov-fail-under=0"

echo "== pytest on SQLite (with the alert tests and the newcomer examples, which use jq)"
./scripts/promtool.sh
./scripts/debian-package.sh jq jq "the newcomer examples (tests/test_run_command.py)"
# shellcheck disable=SC2086 # XDIST, COV and DURATIONS are lists of options
env -u DATABASE_URL $BIN/pytest $XDIST $COV $DURATIONS -m "not postgres" "$@"

echo "== pytest on PostgreSQL (with the browser tests and the failover drill)"
./scripts/browser.sh
./scripts/ha-packages.sh
# shellcheck disable=SC2086
DATABASE_URL=$PG_URL $BIN/pytest $XDIST $COV --cov-append $DURATIONS -m "not bench" "$@"

echo "== the PostgreSQL-only tests through PgBouncer in transaction mode (make test-pgbouncer: all of them)"
SMOKE=1 ./scripts/test-pgbouncer.sh "$@"

echo "== the benchmark smoke tests, on PostgreSQL beside the peers (.venv-bench)"
./scripts/venv.sh bench
# One module a worker: the quick benchmark's tests share its one run.
# shellcheck disable=SC2086
DATABASE_URL=$PG_URL .venv-bench/bin/pytest -n "${WORKERS:-auto}" --dist loadfile $DURATIONS -m bench "$@"

echo "== coverage of the SQLite and PostgreSQL passes"
$BIN/coverage report
