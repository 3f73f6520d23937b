# `make demo` and `make test` each bootstrap .venv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_FLAGS ?= -q --disable-pip-version-check

.PHONY: demo test test-torch bench bench-peer gpu-check lint docs clean

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -c constraints-dev.txt "torch==2.13.0"
	$(PY) -m pip install $(PIP_FLAGS) -c constraints-dev.txt -e ".[test]"
	# pynuml's own HDF5 writer and reader for the NuGraph tests: its io module needs only
	# h5py, torch and PyG; the package also declares mpi4py, pandas and plotting, not used.
	$(PY) -m pip install $(PIP_FLAGS) --no-deps "pynuml==25.4.0"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/autoloader demo --workdir build/demo

# Two test processes: most of the suite's time is subprocesses importing torch (~3.5 s
# each) and tests waiting on worker processes, so two overlap well on 2 cores (the whole
# suite: 636 s against 1,090 s in one process). `make test TEST_WORKERS=0`: one process.
# The remote tests run in a process of their own, after the rest: the XRootD client they
# load installs fork handlers (XrdCl::ForkHandler) that were seen to deadlock a later fork
# of another test's DataLoader workers in the same process.
TEST_WORKERS ?= 2
REMOTE_TESTS := tests/datasets/test_remote.py tests/datasets/test_remote_read_ahead.py
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(addprefix --ignore=,$(REMOTE_TESTS))
	$(PY) -m pytest -q $(REMOTE_TESTS)

# The suite on another torch, in its own venv: `make test-torch TORCH=2.15.0`. The
# machine's pip configuration (a local index, a cap on torch) is not inherited, so the
# torch asked for, and the PyG, Lightning and Accelerate that pip resolves for it, come
# from PyPI.
TORCH ?= 2.15.0
TVENV := .venv-torch-$(TORCH)
TSTAMP := $(TVENV)/.installed
$(TSTAMP): pyproject.toml
	test -x $(TVENV)/bin/python || $(PYTHON) -m venv $(TVENV)
	echo "torch==$(TORCH)" > $(TVENV)/constraints.txt
	env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(TVENV)/bin/python -m pip install \
	  $(PIP_FLAGS) -c $(TVENV)/constraints.txt "torch==$(TORCH)"
	env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(TVENV)/bin/python -m pip install \
	  $(PIP_FLAGS) -c $(TVENV)/constraints.txt -e ".[test]"
	env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(TVENV)/bin/python -m pip install \
	  $(PIP_FLAGS) --no-deps "pynuml==25.4.0"
	touch $(TSTAMP)

test-torch: $(TSTAMP)
	$(TVENV)/bin/python -c "import torch; print('torch', torch.__version__)"
	$(TVENV)/bin/python -m pytest -q -n $(TEST_WORKERS) $(addprefix --ignore=,$(REMOTE_TESTS))
	$(TVENV)/bin/python -m pytest -q $(REMOTE_TESTS)

# The real CUDA path on a GPU machine; prints SKIP and exits 0 without CUDA. Runs with
# the machine's own python3 where that already has torch and autoloader (a GPU node's
# CUDA build, `pip install --no-deps -e .`), else with .venv.
GPU_PY ?= $(shell python3 -c "import torch, autoloader" >/dev/null 2>&1 && echo python3 || echo $(PY))
gpu-check:
	@if [ "$(GPU_PY)" = "$(PY)" ]; then $(MAKE) --no-print-directory $(STAMP); fi
	$(GPU_PY) benchmarks/gpu_check.py

bench: $(STAMP)
	$(PY) -m pip install $(PIP_FLAGS) -c constraints-dev.txt -e ".[bench]"
	$(PY) benchmarks/samplers.py
	$(PY) benchmarks/workers.py
	$(PY) benchmarks/adapt.py
	$(PY) benchmarks/regimes.py
	$(PY) benchmarks/loop_limit.py
	$(PY) benchmarks/baseline.py
	$(PY) benchmarks/metrics.py
	$(PY) benchmarks/cli.py
	$(PY) -m pip install $(PIP_FLAGS) --no-deps "nugraph==25.4.0"
	$(PY) benchmarks/nugraph_files.py

# autoloader against torch's defaults and loadtune (PyPI), each as users run it. loadtune
# lives in its own venv (with this checkout, for the workloads' datasets), CPU torch pinned.
PEER_VENV := .venv-peer
$(PEER_VENV)/.installed: pyproject.toml constraints-dev.txt
	test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install $(PIP_FLAGS) -c constraints-dev.txt "torch==2.13.0" \
	  "loadtune==0.3.0" -e .
	touch $(PEER_VENV)/.installed

bench-peer: $(STAMP) $(PEER_VENV)/.installed
	$(PY) benchmarks/peer.py --peer-python $(PEER_VENV)/bin/python

# Pinned: another ruff formats some lines otherwise, and CI runs this.
LINTED := autoloader plugins tests benchmarks examples
lint: $(STAMP)
	$(PY) -m pip install $(PIP_FLAGS) "ruff==0.17.6" "mypy==2.4.1"
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy autoloader plugins

# The manual: mkdocs with --strict (mkdocs.yml), so a broken link or a page missing from
# the navigation fails the build. mkdocs needs nothing of the package, only the pages.
docs: $(STAMP)
	$(PY) -m pip install $(PIP_FLAGS) -c constraints-dev.txt "mkdocs==1.6.1"
	$(PY) -m mkdocs build --strict
	@echo "the manual is in build/site/index.html"

clean:
	rm -rf $(VENV) build .pytest_cache
