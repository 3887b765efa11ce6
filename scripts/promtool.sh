#!/bin/sh
# Make sure promtool (Debian's prometheus package) is there for the alert
# tests: they check deploy/prometheus-alerts.yml with it and make each of its
# alerts fire from the app's own metrics (tests/test_alerts.py).
exec "$(dirname "$0")/debian-package.sh" promtool prometheus "the alert tests"
