#!/bin/sh
# Migrate the embedded database, load the demo, then serve: the sandbox
# provider and a reconciler in the background (the reconciler restarted if it
# exits), gunicorn + whitenoise in front.
set -eu
cd "$(dirname "$0")/.."
HOST=${1:-127.0.0.1}
PORT=${2:-8000}
SANDBOX_PORT=${SANDBOX_PORT:-$((PORT + 100))}
PY=.venv/bin/python
export DEBUG=${DEBUG:-true}
VAR=${LEDGERDASH_VAR_DIR:-var}
mkdir -p "$VAR"

echo "== migrating the database ($VAR)"
$PY manage.py migrate --noinput --verbosity 0
$PY manage.py collectstatic --noinput --verbosity 0

pids=""
cleanup() {
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

$PY -m ledgerdash.sandbox --port "$SANDBOX_PORT" --db "$VAR/sandbox.sqlite3" >"$VAR/sandbox.log" 2>&1 &
pids="$pids $!"
deadline=$(($(date +%s) + 60))
until $PY -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=1)" \
        "http://127.0.0.1:$SANDBOX_PORT/health" 2>/dev/null; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "the sandbox provider did not start; see $VAR/sandbox.log"; exit 1; }
    sleep 0.1
done

echo "== loading the demo"
$PY manage.py demo --defer-drills --sandbox-url "http://127.0.0.1:$SANDBOX_PORT"

# Run a background worker, and again whenever it exits, until make run stops.
# Its current process id is kept in $VAR/<name>.pid.
supervise() {
    name=$1
    shift
    (
        child=""
        trap 'if [ -n "$child" ]; then kill "$child" 2>/dev/null; fi; rm -f "$VAR/$name.pid"; exit 0' TERM INT
        while :; do
            "$@" >>"$VAR/$name.log" 2>&1 &
            child=$!
            echo "$child" >"$VAR/$name.pid"
            status=0
            wait "$child" || status=$?
            echo "run.sh: $name exited with status $status; restarting it in 2 s" >>"$VAR/$name.log"
            sleep 2
        done
    ) &
    pids="$pids $!"
}

supervise notify $PY manage.py notify --interval 5

.venv/bin/gunicorn ledgerdash.wsgi --bind "$HOST:$PORT" --workers 2 --log-level warning &
web=$!
pids="$pids $web"
deadline=$(($(date +%s) + 120))
until $PY -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" \
        "http://127.0.0.1:$PORT/readyz" 2>/dev/null; do
    kill -0 "$web" 2>/dev/null || { echo "the web server stopped; see the lines above"; exit 1; }
    [ "$(date +%s)" -lt "$deadline" ] || { echo "the web server did not answer within two minutes"; exit 1; }
    sleep 0.2
done

echo
echo "ledgerdash: http://$HOST:$PORT/ (log in with a demo user above; Ctrl-C stops)"
echo "sandbox provider: http://127.0.0.1:$SANDBOX_PORT/ ; reconciler log: $VAR/reconciler.log; notifications log: $VAR/notify.log"

# The demo's crash drills kill real agents (a minute or two); the overview shows their progress.
# The reconciler starts once they are done, so it never races a drill's own recovery pass.
echo "== crash drills for the demo: running, progress on the overview (log: $VAR/demo.log)"
if $PY manage.py demo --drills --sandbox-url "http://127.0.0.1:$SANDBOX_PORT" >"$VAR/demo.log" 2>&1; then
    echo "== $(tail -n 1 "$VAR/demo.log")"
else
    echo "== the demo's crash drills stopped early: see $VAR/demo.log (the rest of the demo is loaded)"
fi
supervise reconciler $PY manage.py reconcile --interval 5
wait "$web"
