#!/bin/sh
# make run from a fresh clone on a busy machine, timed: until the dashboard answers, and until the
# demo's crash drills are done. The figures docs/benchmarks.md reports ("The first start").
#
#   scripts/first-start.sh            LOAD=6 busy processes beside it, a package cache of its own
#   LOAD=0 WARM=1 scripts/first-start.sh   an idle machine, the user's package cache
#
# The clone is of this checkout's HEAD, in a temporary directory removed at the end.
set -eu
LOAD=${LOAD:-6}
PORT=${PORT:-8750}
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pids=""
cleanup() {
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    [ -z "${run:-}" ] || kill -- -"$run" 2>/dev/null || true
    sleep 1
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

git clone -q "$src" "$work/ledgerdash"
[ -n "${WARM:-}" ] || export UV_CACHE_DIR="$work/uv-cache" PIP_CACHE_DIR="$work/pip-cache"
i=0
while [ "$i" -lt "$LOAD" ]; do
    python3 -c 'while True: pass' &
    pids="$pids $!"
    i=$((i + 1))
done
sleep 5  # let the load average climb

start=$(date +%s.%N)
elapsed() { echo "$(date +%s.%N) - $start" | bc | xargs printf '%.0f'; }
cd "$work/ledgerdash"
setsid make run PORT="$PORT" >"$work/run.log" 2>&1 &
run=$!
answered=""
while :; do
    kill -0 "$run" 2>/dev/null || { cat "$work/run.log"; echo "make run stopped"; exit 1; }
    if [ -z "$answered" ] && python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
            "http://127.0.0.1:$PORT/login/" 2>/dev/null; then
        answered=$(elapsed)
        echo "the dashboard answered after ${answered} s (load average $(cut -d' ' -f1 /proc/loadavg))"
    fi
    if grep -q "crash drills are done\|crash drills stopped" "$work/run.log"; then
        echo "the demo's crash drills were done after $(elapsed) s: $(grep -o "[0-9]* of [0-9]* cases held[a-z ]*" "$work/run.log")"
        break
    fi
    sleep 0.5
done
echo "make run printed:"
grep "^==\|^ledgerdash:\|^creating" "$work/run.log" | sed 's/^/  /'
