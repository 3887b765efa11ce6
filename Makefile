# The README's commands: `make run`, `make check` (the fast loop) and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: venv bench-venv lock run check test test-pgbouncer ha-drill lint bench bench-quick bench-growth clean

## .venv with exactly what uv.lock pins (the app and the dev tools).
venv:
	@./scripts/venv.sh

## .venv-bench: the same plus the benchmark peers (dbos, pyinstrument, py-spy).
bench-venv:
	@./scripts/venv.sh bench

## Rewrite uv.lock after pyproject.toml changed, keeping every pin that still
## fits, then install it. UPGRADE=1 moves every pin to the newest release
## allowed; UPGRADE=django moves just that one.
lock:
	@./scripts/venv.sh lock

## Run the app with demo data on http://$(HOST):$(PORT)/ (SQLite under var/).
run: venv
	@DEBUG=true ./scripts/run.sh $(HOST) $(PORT)

## Lint, type-check, then the tests that are not slow, on SQLite, in parallel.
check: venv
	@./scripts/check.sh

## Lint, type-check, then the whole suite on SQLite and on PostgreSQL, with coverage.
test: venv
	@./scripts/test.sh

## The PostgreSQL tests through a PgBouncer of their own, in transaction mode
## (scripts/test-pgbouncer.sh; SMOKE=1 runs the PostgreSQL-only ones).
test-pgbouncer: venv
	@./scripts/test-pgbouncer.sh

## The failover drill (ledgerdash/ha): agents, reconcilers and the notifier under load on a
## PostgreSQL cluster of its own (Patroni, etcd, a synchronous standby, from Debian's packages);
## the primary is killed, then the next one frozen. About 2 minutes; exits 1 unless nothing was
## lost, duplicated or left stuck.
ha-drill: venv
	@./scripts/ha-packages.sh
	@DEBUG=true $(PY) manage.py ha_drill

## Benchmarks beside the peers, on PostgreSQL (BENCH_DATABASE_URL, default the local
## server; scratch databases ledgerdash_bench*): 12 to 15 minutes, 22 on the slowest
## machine yet; bench-quick is the smoke run (3 to 6 minutes). Figures print as a
## table and land in bench/results/.
bench: bench-venv
	.venv-bench/bin/python -m bench

bench-quick: bench-venv
	.venv-bench/bin/python -m bench --quick

## The ledger grown to 50 million events beside it nearly empty (docs/scale.md): about
## an hour and 40 GB of disk here; GROWTH_EVENTS and GROWTH_TENANTS set its size.
bench-growth: bench-venv
	.venv-bench/bin/python -m bench --only growth

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ledgerdash reviews bench clients/python/src/ledgerdash_client

clean:
	rm -rf $(VENV) .venv-bench var staticfiles test-artifacts .coverage .coverage.* htmlcov
