# h5forge: `make demo` builds the demo dataset from scratch, `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: install demo test bench clean

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

bench: install
	$(BIN)/python benchmarks/build.py
	$(BIN)/python benchmarks/read.py

clean:
	rm -rf data/demo data/raw/demo
