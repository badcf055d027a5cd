# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The JS reference IPFS tools the interop tests run (tests/js/package-lock.json pins them).
JS_STAMP := tests/js/node_modules/.installed

.PHONY: setup browser netns-tools test test-busy demo lint bench clean gpu-deps

setup: $(STAMP)

# torch first, pinned: the CPU wheel of 2.13.0 lies on disk; an open range would pull a CUDA build.
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The dashboard tests open the page in a real headless browser: Debian's chromium. Installed here
# when missing and we are root (a fresh machine); a no-op when it is on PATH. Without it (not
# root), those tests are skipped and pytest says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y chromium || \
	      { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }; \
	  else echo "chromium missing and not root: the browser tests will be skipped"; fi; }

# The network-namespace tests (test_netbed, test_nat_swarm) build hosts and NAT routers with
# ip, tc and nft: installed here when missing and we are root; otherwise they skip, saying why.
netns-tools:
	@for t in ip:iproute2 tc:iproute2 nft:nftables; do \
	  command -v $${t%%:*} >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y $${t#*:} || \
	    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $${t#*:}; } || true; \
	done

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	cd tests/js && npm ci --no-audit --no-fund
	touch $(JS_STAMP)

# Two pytest-xdist workers: the swarm tests run one after another on one of them
# (tests/support/groups.py), the rest of the suite on the other. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: setup browser netns-tools $(JS_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The swarm tests on a busy machine (issue 23): two busy-loop processes (stress-ng, from Debian)
# beside them for as long as they run. Installs stress-ng when missing and we are root.
SWARM_TESTS = $(shell $(BIN)/python -c "import tests.conftest as c; print(' '.join(sorted(c.ONE_SWARM_AT_A_TIME)))" 2>/dev/null)
test-busy: setup browser $(JS_STAMP)
	@command -v stress-ng >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y stress-ng
	stress-ng --cpu 2 --timeout 3600s >/dev/null 2>&1 & pid=$$!; \
	  $(BIN)/python -m pytest -q $(SWARM_TESTS); rc=$$?; kill $$pid; exit $$rc

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy cnode node storage aggregation auth

demo: setup
	$(BIN)/cnode demo

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

# What bench/gpu_check.py needs on a GPU machine beside torch, transformers and tokenizers: the
# pure-Python wheels of storage and logging, at the versions of this venv (about 2.4 MB). Carry
# .gpu-deps along and run: PYTHONPATH=.:.gpu-deps python bench/gpu_check.py
GPU_DEPS := dag-cbor multiformats multiformats-config bases typing-validation structlog
gpu-deps: setup
	rm -rf .gpu-deps
	$(BIN)/pip freeze | grep -i -E '^($(subst $(eval) ,|,$(GPU_DEPS)))==' > .gpu-deps.txt
	$(BIN)/pip install --quiet --no-deps --target .gpu-deps -r .gpu-deps.txt
	rm .gpu-deps.txt

clean:
	rm -rf $(VENV) build *.egg-info tests/js/node_modules .gpu-deps
