#!/bin/sh
# Create .venv with a Python >= 3.12 and install the project into it.
#
# Django 6 needs Python 3.12 or newer; pip on an older Python silently picks
# Django 5.x instead, so the interpreter is chosen and checked here, before
# anything is installed. Set PYTHON=/path/to/python to choose one yourself.
set -eu
cd "$(dirname "$0")/.."

VENV=.venv
STAMP="$VENV/.installed"

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
    echo "creating $VENV with $PY ($("$PY" --version))"
    "$PY" -m venv "$VENV"
fi

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e '.[dev,bench]'
    # Guard against a resolver that fell back to an older Django.
    "$VENV/bin/python" -c 'import django, sys; sys.exit(0 if django.VERSION >= (6, 0) else "Django %s installed; ledgerdash needs 6.0 or newer" % django.get_version())'
    touch "$STAMP"
fi
