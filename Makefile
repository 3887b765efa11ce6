# The README's two commands: `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: venv run test lint bench bench-quick clean

venv:
	@./scripts/venv.sh

## Run the app with demo data on http://$(HOST):$(PORT)/ (SQLite under var/).
run: venv
	@DEBUG=true ./scripts/run.sh $(HOST) $(PORT)

## Lint, type-check, then the whole suite on SQLite and on PostgreSQL.
test: venv
	@./scripts/test.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ledgerdash reviews

clean:
	rm -rf $(VENV) var staticfiles test-artifacts
