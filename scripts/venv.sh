#!/bin/sh
# Create a virtualenv with a Python >= 3.12 and install exactly what uv.lock
# pins into it, hashes checked.
#
#   scripts/venv.sh          .venv: the app with the dev tools (make venv)
#   scripts/venv.sh bench    .venv-bench: the same plus the benchmark peers
#                            (dbos, pyinstrument, py-spy) (make bench)
#   scripts/venv.sh lock     rewrite uv.lock from pyproject.toml, then make .venv
#                            (make lock; UPGRADE=1 or UPGRADE=<package> to move pins)
#
# Django 6 needs Python 3.12 or newer; the interpreter is chosen and checked
# here, before anything is installed. Set PYTHON=/path/to/python to choose
# one yourself. uv.lock is written by `make lock`; an install never resolves
# anything, so every checkout gets the same versions.
set -eu
cd "$(dirname "$0")/.."

VENV=.venv
MODE=${1:-}
case "$MODE" in
    "" | lock) TARGET=$VENV EXTRAS="--extra dev" ;;
    bench) TARGET=.venv-bench EXTRAS="--extra dev --extra bench" ;;
    *) echo "usage: scripts/venv.sh [bench | lock]" >&2; exit 2 ;;
esac

is_new_enough() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null
}

find_python() {
    if [ -n "${PYTHON:-}" ]; then
        if is_new_enough "$PYTHON"; then echo "$PYTHON"; return 0; fi
        echo "PYTHON=$PYTHON is not Python 3.12 or newer" >&2
        return 1
    fi
    pyenvs=$(ls -d "$HOME"/.pyenv/versions/3.1[2-9]* 2>/dev/null | sort -rV | sed 's|$|/bin/python3|' || true)
    for candidate in python3.14 python3.13 python3.12 python3 $pyenvs \
        /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
        path=$(command -v "$candidate" 2>/dev/null || true)
        [ -n "$path" ] || continue
        if is_new_enough "$path"; then echo "$path"; return 0; fi
    done
    return 1
}

if [ -x "$VENV/bin/python" ] && ! is_new_enough "$VENV/bin/python"; then
    echo "removing $VENV: it was made with a Python older than 3.12" >&2
    rm -rf "$VENV"
fi

if [ ! -x "$VENV/bin/python" ]; then
    if ! PY=$(find_python); then
        cat >&2 <<'MSG'
ledgerdash needs Python 3.12 or newer (Django 6 does), and none was found.
Looked for python3.14, python3.13, python3.12 and python3 on PATH, and under
~/.pyenv/versions. Install one (e.g. `pyenv install 3.13`) or point to it:
    PYTHON=/path/to/python3.13 make run
MSG
        exit 1
    fi
    echo "== creating $VENV with $PY ($("$PY" --version)), then installing what uv.lock pins (a minute or two)"
    "$PY" -m venv "$VENV"
fi

# uv installs from the lock; it is itself pinned there. A new .venv (or one
# made before the lock) gets the locked uv through pip, hashes checked.
UV_PIN=$("$VENV/bin/python" - <<'PY'
import tomllib

with open("uv.lock", "rb") as f:
    (uv,) = [p for p in tomllib.load(f)["package"] if p["name"] == "uv"]
print(f"uv=={uv['version']} " + " ".join(f"--hash={wheel['hash']}" for wheel in uv["wheels"]))
PY
)
if [ "$("$VENV/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$(echo "$UV_PIN" | sed 's/^uv==\([^ ]*\).*/\1/')" ]; then
    "$VENV/bin/python" -m pip --version >/dev/null 2>&1 || "$VENV/bin/python" -m ensurepip --default-pip >/dev/null
    req=$(mktemp)
    trap 'rm -f "$req"' EXIT
    echo "$UV_PIN" >"$req"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --only-binary :all: -r "$req"
fi

# Never an interpreter uv would download: the one .venv was made with.
export UV_PYTHON_DOWNLOADS=never
BASE_PY=$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')

if [ "$MODE" = lock ]; then
    case "${UPGRADE:-}" in
        "") "$VENV/bin/uv" lock --python "$BASE_PY" ;;
        1) "$VENV/bin/uv" lock --python "$BASE_PY" --upgrade ;;
        *) "$VENV/bin/uv" lock --python "$BASE_PY" --upgrade-package "$UPGRADE" ;;
    esac
fi

# --locked: a pyproject.toml changed without `make lock` is an error, not a
# silent re-resolve.
# shellcheck disable=SC2086 # EXTRAS is a list of options
if ! UV_PROJECT_ENVIRONMENT=$TARGET "$VENV/bin/uv" sync --quiet --locked $EXTRAS --python "$BASE_PY"; then
    echo "(when uv.lock is out of date with pyproject.toml: \`make lock\`, then commit uv.lock)" >&2
    exit 1
fi

# Guard against an interpreter or lock that brought an older Django.
"$TARGET/bin/python" -c 'import django, sys; sys.exit(0 if django.VERSION >= (6, 0) else "Django %s installed; ledgerdash needs 6.0 or newer" % django.get_version())'
