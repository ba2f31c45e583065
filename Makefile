# One command sets up and serves (make serve), one sets up and runs every test (make test).
# TORCH picks the torch build: the default is the CPU wheel these machines hold on disk
# (a looser spec downloads a multi-GB CUDA build). GPU users: make TORCH='torch' install.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install serve test test-fast lint bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/mesh-launch --role all

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -p no:cacheprovider tests/unit

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
