#!/bin/sh
# Make sure Debian's chromium is there for the browser tests: Playwright
# drives /usr/bin/chromium and never downloads a browser of its own.
exec "$(dirname "$0")/debian-package.sh" /usr/bin/chromium chromium "the browser tests"
