# h5forge: `make demo` builds the demo dataset from scratch, `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: install demo test test-quick lint docs bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

demo: install
	$(BIN)/h5forge demo-data data/raw/demo
	$(BIN)/h5forge build config/demo.yaml
	$(BIN)/h5forge verify data/demo/dataset_latest.h5
	$(BIN)/h5forge versions data/demo

test: install
	PREFECT_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q

# the inner loop: no Prefect server, no subprocess services, nothing slow (`make test` runs everything)
test-quick: install
	PREFECT_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q -m "not slow and not e2e"

bench: install
	$(BIN)/python benchmarks/build.py
	$(BIN)/python benchmarks/read.py

# import contracts (pyproject.toml [tool.importlinter]), checked on the package as pip installs it,
# where flows/, tasks/ and deployments/ sit inside h5forge/
LINT_DIR = build/lint
lint: install
	rm -rf $(LINT_DIR)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation --target $(LINT_DIR) .
	cd $(LINT_DIR) && $(CURDIR)/$(BIN)/lint-imports $(CURDIR)/pyproject.toml

# docs/format.md's layout table, from the code
docs: install
	$(BIN)/python -m h5forge.kinds.doc docs/format.md

clean:
	rm -rf data/demo data/raw/demo
