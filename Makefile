# Hutch: `make demo` runs a real job against the local sandbox; `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test unit integration e2e chaos lint broker postgres tools bench bench-speed bench-floor bench-pool bench-speed-memory bench-governor bench-frontier bench-proxy bench-submit bench-store bench-parse bench-crawl clean help

help:
	@echo "make demo   - set up, make sure RabbitMQ is reachable, run the sample job against the sandbox"
	@echo "make test   - unit, integration and end-to-end tests (real RabbitMQ)"
	@echo "make lint   - ruff and mypy"
	@echo "make bench  - benchmarks (figures in docs/benchmarks.md)"

# The sandbox (sandbox/) is a distribution of its own, kept out of Hutch's wheel; tests,
# benchmarks and the demo need it, so it is installed beside Hutch.
$(STAMP): pyproject.toml sandbox/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]' -e ./sandbox
	touch $(STAMP)

venv: $(STAMP)

broker: $(STAMP)
	$(PY) -m hutch.services.control.broker

demo: broker
	$(PY) -m hutch.services.control.demo

# Two pytest-xdist workers: the suite mostly waits on services, brokers and sites, so two
# halves side by side take about half the time on two cores. A module runs whole on one
# worker, and tests/chaos (its own RabbitMQ node) all on one (tests/conftest.py).
test: broker postgres tools
	$(PY) -m pytest -q -ra --durations=25 -n 2 --dist loadfile

# The PostgreSQL store's tests use the machine's server on 127.0.0.1:5432 (a database of
# their own, dropped after); started here where it is installed but stopped.
postgres:
	@pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null || \
	  { command -v pg_ctlcluster >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | tail -1) main start && \
	    for i in 1 2 3 4 5 6 7 8 9 10; do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; } || \
	  echo "make postgres: no PostgreSQL on 127.0.0.1:5432; its tests are skipped (and fail in CI)"

# Prometheus and promtool (Debian's package) for tests/e2e/test_metrics.py; installed with
# apt where they are missing and apt can run, else that test is skipped (and says why).
tools:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null || \
	      { apt-get update -q >/dev/null && \
	        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null; }; } || \
	  echo "make tools: prometheus not installed; tests/e2e/test_metrics.py will be skipped"; }

unit: $(STAMP) postgres
	$(PY) -m pytest -q tests/unit

integration: broker postgres
	$(PY) -m pytest -q tests/integration

e2e: broker postgres
	$(PY) -m pytest -q tests/e2e

# Part of `make test`; on a RabbitMQ node of their own (tests/brokers.py), not the shared broker.
chaos: $(STAMP)
	$(PY) -m pytest -q tests/chaos

# mypy cannot follow the editable install's folder mapping (shared/ is the package `hutch`,
# services/ is `hutch.services`), so it checks the package as installed through links: a
# folder `hutch` holding a link to everything in shared/, and `services` beside them; the
# sandbox's own package is linked beside `hutch`.
lint: $(STAMP)
	$(VENV)/bin/ruff check shared services sandbox tests bench
	rm -rf build/typecheck && mkdir -p build/typecheck/hutch
	for item in shared/*; do ln -s ../../../$$item build/typecheck/hutch/; done
	ln -s ../../../services build/typecheck/hutch/services
	ln -s ../../sandbox/hutch_sandbox build/typecheck/hutch_sandbox
	cd build/typecheck && ../../$(VENV)/bin/mypy -p hutch -p hutch_sandbox --config-file ../../pyproject.toml

# Benchmarks print their figures; docs/benchmarks.md records them with their configs.
bench: bench-speed bench-floor bench-pool bench-governor bench-frontier bench-proxy bench-submit bench-store bench-parse bench-crawl

# Hutch against a bare asyncio loop, on a RabbitMQ node of its own; figures in docs/benchmarks.md.
bench-speed: $(STAMP)
	$(PY) bench/speed.py

# The fetcher's connection pool against httpcore's: a bookkeeping pass, and requests through each.
bench-pool: $(STAMP)
	$(PY) bench/pool_pass.py
	$(PY) bench/pool_pass.py --stream

# What one durable hop through RabbitMQ costs, with none of Hutch's code: the floor under CPU per page.
bench-floor: $(STAMP)
	$(PY) bench/hop_floor.py

bench-speed-memory: $(STAMP)
	$(PY) bench/speed.py --shapes memory

bench-governor: broker
	$(PY) bench/governor_sites.py
	$(PY) bench/governor_permits.py
	$(PY) bench/governor_memory.py
	$(PY) bench/governor_wire.py

# On a RabbitMQ node of its own (ulimit -n 20000), started and stopped by the benchmark.
bench-frontier: $(STAMP)
	$(PY) bench/frontier_scale.py --private-node
	$(PY) bench/frontier_two_jobs.py

bench-proxy: broker
	$(PY) bench/proxy_escalation.py

bench-submit: broker
	$(PY) bench/submit_bench.py

bench-store: broker
	$(PY) bench/store_commit.py

bench-parse: $(STAMP)
	$(PY) bench/parse_workers.py

# A crawl against a URL list of the same pages, on a RabbitMQ node of its own.
bench-crawl: $(STAMP)
	$(PY) bench/crawl_vs_list.py

# On a RabbitMQ node of its own (and PostgreSQL on 127.0.0.1:5432); figures in docs/frontier-alternatives.md.
.PHONY: bench-frontier-models
bench-frontier-models: $(STAMP)
	$(PY) bench/frontier_models.py

clean:
	rm -rf $(VENV) hutch-data .pytest_cache .mypy_cache .ruff_cache
