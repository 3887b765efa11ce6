#!/bin/sh
# Make sure promtool (Debian's prometheus package) is there for the alert tests.
#
# The tests check deploy/prometheus-alerts.yml with promtool and make each of
# its alerts fire from the app's own metrics (tests/test_alerts.py). As root, a
# missing promtool is installed from Debian's packages (the prometheus server
# the package brings is not started here); otherwise this only says what is
# missing (the alert tests then skip with that reason, or fail under CI=true).
set -eu
if command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "the alert tests need promtool: install Debian's prometheus package (apt-get install prometheus)" >&2
    exit 0
fi
echo "installing Debian's prometheus package for promtool"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
