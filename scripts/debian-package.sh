#!/bin/sh
# Make sure a program from Debian's packages is there for some of the tests:
#
#   scripts/debian-package.sh PROGRAM PACKAGE WHAT-NEEDS-IT
#
# PROGRAM is a path or a command name. As root, a missing one is installed
# from Debian's PACKAGE (a service the package brings is not started here);
# otherwise this only says what is missing (those tests then skip with that
# reason, or fail under CI=true).
set -eu
PROGRAM=$1 PACKAGE=$2 WHAT=$3
if command -v "$PROGRAM" >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "$WHAT need $PROGRAM: install Debian's $PACKAGE package (apt-get install $PACKAGE)" >&2
    exit 0
fi
echo "installing Debian's $PACKAGE for $WHAT" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "$PACKAGE" >/dev/null
