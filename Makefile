# h5forge: `make demo` builds the demo dataset from scratch, `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: install install-test test-tools demo test test-soak test-quick lint format docs bench bench-smoke bench-check clean

# `install`: what building needs (the package and its [build] extra: Prefect, dask, decoders);
# `install-test` adds the test extra (pytest, torch, jax, xarray, ...), which only the tests need, and
# the field kind of a package of its own (tests/plugins/, docs/extending.md), which the tests run.
install: $(VENV)/.installed-build
install-test: $(VENV)/.installed-test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-build: pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e ".[build]"
	touch $@

PLUGIN = tests/plugins/h5forge-example-kind

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed-build $(wildcard $(PLUGIN)/*.py $(PLUGIN)/pyproject.toml)
	$(BIN)/pip install --quiet -e ".[build,test]"
	$(BIN)/pip install --quiet ./$(PLUGIN)
	touch $@

demo: install
	$(BIN)/h5forge demo-data data/raw/demo
	$(BIN)/h5forge build config/demo.yaml
	$(BIN)/h5forge verify data/demo/dataset_latest.h5
	$(BIN)/h5forge versions data/demo
	$(BIN)/h5forge read data/demo/dataset_latest.h5 --batch-size 4

# The command-line tools the tests run, which ship in no Python package: h5dump, HDF5's own reader
# (tests/test_portability.py checks what it shows of a version), and nginx, a real HTTP server with
# range requests (the remote-read tests serve versions with it, as a plain process). Debian and Ubuntu
# have them in hdf5-tools and nginx-light, installed here when missing.
test-tools:
	@missing=; command -v h5dump >/dev/null || missing=" hdf5-tools"; \
	  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx-light"; \
	  [ -z "$$missing" ] || { \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  if ! command -v apt-get >/dev/null || { [ -n "$$sudo" ] && ! command -v sudo >/dev/null; }; then \
	    echo "error: the tests need h5dump and nginx: install$$missing (or brew install hdf5 nginx)"; exit 1; fi; \
	  echo "installing$$missing, which the tests run"; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; }

# two test processes (pytest-xdist): much of the suite waits on servers, clusters and subprocesses
test: install-test test-tools
	PREFECT_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q -n 2 -m "not tf and not soak"

# the fault suite at full size: 20 SIGKILLed runs of each kind, thousands of bit flips and damaged files
test-soak: install-test
	PREFECT_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q -m soak

# the inner loop: no Prefect server, no subprocess services, nothing slow (`make test` runs everything)
test-quick: install-test test-tools
	PREFECT_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q -m "not slow and not e2e and not tf and not soak"

# The TensorFlow reader in a second venv: tensorflow-cpu needs an older h5py than pyproject.toml pins
# (requirements-tf.txt), so .venv-tf is built from scratch when missing or when that file changes,
# h5forge goes in without its deps, and only the TF tests run there (they skip in .venv).
VENV_TF ?= .venv-tf
BIN_TF   = $(VENV_TF)/bin
TF_REQS  = requirements-tf.txt

.PHONY: install-tf test-tf
install-tf: $(VENV_TF)/.h5forge

$(VENV_TF)/.installed: $(TF_REQS)
	rm -rf $(VENV_TF)
	$(PYTHON) -m venv $(VENV_TF)
	$(BIN_TF)/pip install --quiet -r $(TF_REQS)
	touch $@

# h5forge itself, again whenever pyproject.toml changes (its package list), without its h5py pin
$(VENV_TF)/.h5forge: $(VENV_TF)/.installed pyproject.toml
	$(BIN_TF)/pip install --quiet --no-deps -e .
	touch $@

test-tf: install-tf
	$(BIN_TF)/python -m pytest -q -m tf tests/read/test_tf_reader.py

# benchmarks/README.md. Full size: hours on a 2-core machine. --smoke (CI): tiny sizes, every code path,
# results to benchmarks/results/smoke/ (git-ignored); all of them run, and the target fails if any failed.
BENCHMARKS = build_peers read_peers nightly ingest_parts kinds second_build read_masks row_hash segments cluster boxes_memory read_remote decode

bench: install-test
	for b in $(BENCHMARKS); do $(BIN)/python -m benchmarks.$$b || exit 1; done

bench-smoke: install-test
	status=0; for b in $(BENCHMARKS); do \
	  $(BIN)/python -m benchmarks.$$b --smoke || { echo "benchmarks.$$b --smoke FAILED"; status=1; }; done; \
	exit $$status

# The short benchmarks again at their committed sizes (benchmarks/README.md, "check"): one line per
# committed figure, within 25 % (or the spread its file states) or off; fails if any is off.
bench-check: install-test
	$(BIN)/python -m benchmarks.check

# Static checks (settings in pyproject.toml): ruff's linter on the source folders, then the import
# contracts and mypy on the package as pip installs it, where flows/, tasks/ and deployments/ sit
# inside h5forge/ (h5forge.flows, ...), as the contracts name them.
LINT_DIR = build/lint
LINT_SRC = src/h5forge flows tasks deployments benchmarks/*.py
lint: install-test
	$(BIN)/ruff check $(LINT_SRC)
	$(BIN)/ruff format --check $(LINT_SRC)
	rm -rf $(LINT_DIR)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation --target $(LINT_DIR) .
	cd $(LINT_DIR) && $(CURDIR)/$(BIN)/lint-imports $(CURDIR)/pyproject.toml
	cd $(LINT_DIR) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/build/mypy-cache -p h5forge

# ruff's formatter over the source folders (settings in pyproject.toml [tool.ruff.format])
format: install-test
	$(BIN)/ruff format $(LINT_SRC)

# docs/format.md's layout table, from the code
docs: install
	$(BIN)/python -m h5forge.kinds._doc docs/format.md

clean:
	rm -rf data/demo data/raw/demo
