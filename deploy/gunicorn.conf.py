"""Gunicorn's configuration for ledgerdash (deploy/start-web passes it with --config).

Every value can be overridden from the environment named beside it, or with
GUNICORN_CMD_ARGS. The timeouts are chosen together with the database's:

- ``timeout`` (GUNICORN_TIMEOUT, 60 s) is the last resort: a worker silent
  for that long is killed and its clients get no answer at all. The
  database gives up first: ``DATABASE_LOCK_TIMEOUT_MS`` (10 s) and
  ``DATABASE_STATEMENT_TIMEOUT_MS`` (30 s) end a stalled statement with an
  error that the app answers as a 503 with ``Retry-After`` (the API's
  ``ledger_unavailable``), so a locked table costs a client seconds and a
  worker nothing.
- ``graceful_timeout`` (30 s): on SIGTERM a worker finishes the request it is
  serving; tool-call recording requests are short, exports stream.
- ``keepalive`` (5 s): with threaded workers, how long a client's
  connection may sit idle between requests before the worker closes it
  (sync workers close it after each answer). An agent's tool call is two
  or three requests in a row; the Python client sends them on one
  connection and never reuses one idle for more than 1.5 s
  (clients/python/src/ledgerdash_client/httpconn.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ledgerdash.ops.logs import GunicornLogger, gunicorn_config

bind = os.environ.get("LEDGERDASH_BIND", "127.0.0.1:8000")
# Sync workers by default: each serves one request at a time, and the kernel
# hands each new request to a worker that is free. GUNICORN_THREADS=n makes
# threaded workers (gthread), for hosts that mostly serve agents: each worker
# serves up to n requests at once and keeps clients' connections open between
# their requests, and a recording request mostly waits for its commit to
# reach the disk, so several agents' requests overlap there. Measured on two
# cores (docs/benchmarks.md): with 4 threads, 8 agents recorded 25% to 37%
# more tool calls per second over HTTP; but a kept connection stays with the
# worker that accepted it, so two clients can land on one worker and share
# its interpreter while the other idles: the dashboard's queue page, with two
# such clients, answered half as many requests (42 -> 21 a second). Each
# thread holds its own database connection: workers x threads x web hosts
# must stay below the server's max_connections (with DATABASE_POOL, the
# pool's max_size per worker caps it).
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "1"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
# A worker is replaced after this many requests (with jitter, so they don't all
# restart at once): a guard against slow leaks in the PDF renderer. Agents make
# two or three requests per tool call, so the bound is high: a replaced worker
# starts with cold caches (checked tokens, the authority, prepared statements).
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "50000"))
max_requests_jitter = max_requests // 10
# Load the app once in the master: a broken deployment (no collected static
# files, a bad setting) stops gunicorn at start with the reason, instead of
# workers failing one after the other.
preload_app = True
# The app logs one line per request itself (LOG_FORMAT); gunicorn's access log
# is off unless asked for. gunicorn's own lines (start, workers, signals) take
# the app's format: with LOG_FORMAT=json every line the process writes is JSON.
accesslog = os.environ.get("GUNICORN_ACCESS_LOG") or None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
# gunicorn's own, less the access-log line nobody keeps; its statsd logger (--statsd-host) is not
# offered: the app's metrics are Prometheus' (/metrics).
logger_class = GunicornLogger
logconfig_dict = gunicorn_config(os.environ.get("LOG_FORMAT", "plain").strip().lower(), loglevel, access=accesslog)
# gunicorn's control socket (for gunicornc) is off: nothing here uses it, and
# its default path is in the user's home, where two instances collide and a
# unit's read-only file system refuses it. GUNICORN_CONTROL_SOCKET=path turns
# it on at a path of this instance's own.
control_socket_disable = not os.environ.get("GUNICORN_CONTROL_SOCKET")
if not control_socket_disable:
    control_socket = os.environ["GUNICORN_CONTROL_SOCKET"]
# The client address and scheme come from the proxy in front (BEHIND_TLS_PROXY).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")

# Request metrics: each worker writes its samples to files in this directory,
# and /metrics adds them up, so one scrape sees every worker. Emptied when
# gunicorn starts (samples of an earlier run would count twice).
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="ledgerdash-metrics-")


def on_starting(server: object) -> None:
    # The app is loaded by now (preload_app): refuse to serve pages that would all fail.
    from ledgerdash.startup import check_static_files

    check_static_files()
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()


def child_exit(server: object, worker: object) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]
