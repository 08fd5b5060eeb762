# Everyday verbs. `make help` lists them.
.DEFAULT_GOAL := help
VENV ?= .venv

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: ## create .venv, fetch jars and the Kafka broker (idempotent)
	bash scripts/setup.sh

run: ## run the service locally until Ctrl-C (embedded broker, conf/local.toml)
	./spark-submit.sh

test: ## lint, type check and the whole test suite
	./scripts/test.sh

unit: setup ## the fast unit tests only (no Spark, no broker)
	$(VENV)/bin/pytest tests/unit -q

lint: setup ## ruff and mypy
	$(VENV)/bin/ruff check src tests jobs scripts bench devkit
	$(VENV)/bin/ruff format --check src tests jobs scripts bench devkit
	$(VENV)/bin/mypy

format: setup ## apply ruff's formatting and import order
	$(VENV)/bin/ruff check --fix src tests jobs scripts bench devkit
	$(VENV)/bin/ruff format src tests jobs scripts bench devkit

bench: setup ## the benchmark suite, lakeprop beside its baseline (SIZE=smoke|default|full)
	$(VENV)/bin/python -m bench.run --size $(or $(SIZE),default)

bench-smoke: setup ## every benchmark at its smoke size, its checks asserted (not in `make test`)
	LAKEPROP_STACK=default $(VENV)/bin/pytest -m bench

docs: setup ## serve the docs site on http://127.0.0.1:8000
	$(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

reference: setup ## regenerate the docs' reference pages from the code
	$(VENV)/bin/python -m devkit.reference

bench-report: setup ## regenerate the docs' benchmarks page and plots from bench/results
	$(VENV)/bin/python -m bench.report

chaos: setup ## the chaos harness: kill the service at every fault point, restart, check
	scripts/chaos.sh

broker-start: setup ## start the local development broker on 127.0.0.1:19092
	$(VENV)/bin/lakeprop --config conf/local.toml broker start

broker-stop: ## stop the local development broker
	$(VENV)/bin/lakeprop --config conf/local.toml broker stop

clean-state: ## delete local state, checkpoint, warehouse and broker data (.lakeprop)
	rm -rf .lakeprop

.PHONY: help setup run test unit lint format bench bench-smoke bench-report docs reference chaos \
	broker-start broker-stop clean-state notebooks

notebooks: setup ## open the notebooks in JupyterLab (installs it into .venv once)
	$(VENV)/bin/python -c "import jupyterlab" 2>/dev/null || $(VENV)/bin/pip install -q jupyterlab
	$(VENV)/bin/jupyter lab notebooks/
