# The README's commands: `make run`, `make check` (the fast loop) and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
# The simulation's long runs (make simulate-long, simulate-long-pg).
JOBS ?= $(shell nproc)
SEEDS ?= 10000
PG_SEEDS ?= 2000
FIRST_SEED ?= 1
SIM_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres

.PHONY: venv bench-venv lock run check test test-pgbouncer ha-drill simulate simulate-long simulate-long-pg screenshots lint bench bench-quick bench-growth clean

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

## The simulation's default run (seeds 1 to 200, every fault kind, SQLite) over the cores: exits 1
## unless every seed holds every invariant and the run reaches every legal move and fault kind
## (make test runs the few of its seeds that reach them all). About three minutes on 2 cores.
simulate: venv
	@DEBUG=true $(PY) manage.py simulate --jobs $(JOBS) --reach-all

## The long runs before a release, each seed from FIRST_SEED on: SEEDS (10,000) on SQLite, two and
## a half to three hours on 2 cores; PG_SEEDS (2,000) on PostgreSQL (SIM_DATABASE_URL, default the local
## server; databases ledgerdash_sim_* of the run's own), an hour or more.
simulate-long: venv
	@DEBUG=true $(PY) manage.py simulate --seeds $(SEEDS) --first-seed $(FIRST_SEED) --jobs $(JOBS) --reach-all
simulate-long-pg: venv
	@DEBUG=true $(PY) manage.py simulate --seeds $(PG_SEEDS) --first-seed $(FIRST_SEED) --jobs $(JOBS) \
		--reach-all --database $(SIM_DATABASE_URL)

## The screenshots the README and docs/dashboard.md show, made again by the browser tests that take
## them (PostgreSQL, Debian's chromium): commit docs/screenshots/ after a change to the pages.
screenshots: venv
	@./scripts/browser.sh
	@LEDGERDASH_DOC_SHOTS=1 DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/ledgerdash} \
		$(VENV)/bin/pytest -q -p no:cacheprovider tests/test_browser.py tests/test_browser_approvals.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ledgerdash reviews bench clients/python/src/ledgerdash_client

clean:
	rm -rf $(VENV) .venv-bench var staticfiles test-artifacts .coverage .coverage.* htmlcov
