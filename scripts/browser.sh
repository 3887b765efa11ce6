#!/bin/sh
# Make sure Debian's chromium is there for the browser tests.
#
# Playwright drives /usr/bin/chromium; it never downloads a browser of its
# own. As root, a missing chromium is installed from Debian's packages;
# otherwise this only says what is missing (the browser tests then skip with
# that reason, or fail under CI=true).
set -eu
CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "browser tests need $CHROMIUM: install Debian's chromium package (apt-get install chromium)" >&2
    exit 0
fi
echo "installing Debian's chromium for the browser tests"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
