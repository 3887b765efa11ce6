#!/bin/sh
# The PostgreSQL tests through PgBouncer in transaction pooling mode
# (`make test-pgbouncer`; `make test` runs the PostgreSQL-only ones this way
# with SMOKE=1): a PgBouncer of the run's own (scripts/pgbouncer.sh) in front
# of TEST_DATABASE_URL's server, the app's every connection through it with
# DATABASE_TRANSACTION_POOLER=true, the harness's databases and roles made
# on the server itself. Arguments go to pytest.
set -eu
cd "$(dirname "$0")/.."
BIN=.venv/bin
PG_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/ledgerdash}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/ledgerdash-pgbouncer.XXXXXX")
chmod 755 "$DIR"
PORT=$($BIN/python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
trap './scripts/pgbouncer.sh stop "$DIR"; rm -rf "$DIR"' EXIT
POOLED=$(./scripts/pgbouncer.sh start "$DIR" "$PORT" "$PG_URL")
echo "PgBouncer $(/usr/sbin/pgbouncer --version | head -1 | cut -d' ' -f2) in transaction mode on port $PORT, in front of ${PG_URL%%\?*}"
if [ "${SMOKE:-0}" = 1 ]; then
    MARKS="postgres and not slow and not bench"
else
    MARKS="not bench"
fi
# shellcheck disable=SC2086 # the xdist options are a list
DATABASE_URL=$POOLED LEDGERDASH_TEST_ADMIN_URL=$PG_URL DATABASE_TRANSACTION_POOLER=true \
    $BIN/pytest -n "${WORKERS:-$(($(nproc) + 1))}" --dist loadgroup -m "$MARKS" "$@"
