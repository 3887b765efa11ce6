#!/bin/sh
# Make sure Debian's patroni and etcd are there for the failover drill
# (make ha-drill, tests/test_ha_drill.py); PostgreSQL's server binaries come
# with Debian's postgresql package. Nothing is started here.
set -eu
"$(dirname "$0")/debian-package.sh" patroni patroni "the failover drill"
"$(dirname "$0")/debian-package.sh" etcd etcd-server "the failover drill"
