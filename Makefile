# The two commands of the README: `make run` and `make test`.
# Both create .venv on first use. torch is installed first from the pinned CPU
# build (`pip install torch==2.13.0` takes the local CPU wheel on these machines),
# so resolving the package's own `torch>=2.2` range installs nothing more and never
# pulls a multi-GB CUDA build onto a CPU machine.
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0

BENCH_STAMP := $(VENV)/.bench-installed
LINT_STAMP  := $(VENV)/.lint-installed

.PHONY: run test lint test-api test-long test-pg install bench clean anvil test-chain

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,chain]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/aitbc demo --home .aitbc-demo

# The unit, API and end-to-end tests (2 processes), then the API conformance suite on its
# own, so it prints its case counts (schemathesis against a live coordinator, ~2 min).
# The lint tools are installed too: the SDK's stub tests run ruff and mypy as a user would.
test: $(LINT_STAMP)
	$(PY) -m pytest -q -n 2 -m "not schemathesis and not long and not chain"
	$(MAKE) --no-print-directory test-api

# The trust-boundary end-to-end suites, the documented examples, the live report/tracker and
# progress-bar suites, and the single tests of a minute or more (kill and restart runs, the
# CLI money workflow, monitor into a pipe, metrics against a live record): kept out of the
# default run so it stays within its 15-minute budget on 2 cores; CI runs them too.
test-long: $(LINT_STAMP)
	$(PY) -m pytest -q -n 2 -m long

# The coordinator, ledger, money and end-to-end payment suites again, each coordinator and
# ledger on a database of its own on a real PostgreSQL server (AITBC_TEST_PG_URL names the
# server's maintenance database; `.ci/postgres start DIR` starts a throwaway one and prints
# it). .ci/run starts the server and runs this after make test.
PG_SUITES := tests/coordinator tests/ledger tests/e2e/test_payments.py tests/e2e/test_trust_money.py \
	tests/e2e/test_stuck_runs.py tests/e2e/test_fault_tolerance.py tests/e2e/test_retention.py \
	tests/e2e/test_fair_exchange.py tests/e2e/test_gossip_fair.py \
	tests/e2e/test_verification_live.py tests/e2e/test_replicas.py
test-pg: $(LINT_STAMP)
	@test -n "$$AITBC_TEST_PG_URL" || { echo "error: make test-pg needs AITBC_TEST_PG_URL (eval \"\$$(.ci/postgres start DIR)\")" >&2; exit 2; }
	AITBC_TEST_DB=postgresql $(PY) -m pytest -q -n 2 -m "not schemathesis" $(PG_SUITES)

# The EVM node of the chain suites: Foundry's anvil, whose npm package ships the binary (so
# nothing is downloaded at run time), installed under .tools/ (not committed).
ANVIL := .tools/node_modules/.bin/anvil
$(ANVIL):
	npm install --prefix .tools --no-audit --no-fund --silent "@foundry-rs/anvil-linux-amd64@^1"
anvil: $(ANVIL)

# The chain suites (marker chain, kept out of make test): the node, EVM wallets and the
# JSON-RPC client against a real anvil started by each test. AITBC_REQUIRE_ANVIL=1 makes a
# missing anvil a failure, not a skip.
test-chain: $(LINT_STAMP) $(ANVIL)
	AITBC_REQUIRE_ANVIL=1 $(PY) -m pytest -q -n 2 -m chain tests/chain

test-api: $(STAMP)
	$(PY) -m pytest -q -m schemathesis tests/api

$(LINT_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[lint]"
	touch $(LINT_STAMP)

# The gate CI runs before the tests: ruff's checks and formatting on the whole tree, and
# mypy on src at the settings in pyproject.toml ([tool.mypy]); each must find nothing.
LINT_PATHS := src tests bench examples
lint: $(LINT_STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[test,bench]"
	$(PY) -m pip install -q --no-deps "flwr>=1.5"  # its caps would downgrade typer, pathspec: see pyproject
	touch $(BENCH_STAMP)

# All benchmarks, one after another; each prints its table and writes bench/results/<name>.json.
# bench/report.py then gathers the printed tables into bench/RESULTS.md.
BENCHES := aggregation_speed aggregation_memory communication sparse_robust robustness stragglers coordinator_load live_utilization live_stragglers live_large models overlap_loss honest_runs metrics_scrape verification replay_drift replica_takeover peer_transport
bench: $(BENCH_STAMP)
	mkdir -p bench/results
	set -o pipefail; for b in $(BENCHES); do \
	  (cd bench && ../$(PY) $$b.py) | tee bench/results/$$b.txt || exit 1; done
	$(PY) bench/report.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
