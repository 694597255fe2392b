# Two entry points for a fresh machine: `make demo` (the main job on built-in defaults) and `make test`.
# Both create or refresh the virtual environment .venv inside the repo from constraints.txt first.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup browser demo test test-fast bench

$(STAMP): pyproject.toml constraints.txt
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,quant]'
	# DeepSpeed (optional for users; the tests exercise the ZeRO-3 recipe) builds against the installed torch.
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -c constraints.txt deepspeed --no-build-isolation
	# On a machine without GPUs DeepSpeed's communication backend JIT-builds its shared-memory op (deepspeed_shm_comm,
	# about 45 CPU seconds) at the first run; built here once per environment, where the tests' runs load it
	# (tests/conftest.py points TORCH_EXTENSIONS_DIR here). With a GPU DeepSpeed builds nothing here. Without a C++
	# compiler setup still succeeds: only the DeepSpeed runs need the op.
	TORCH_EXTENSIONS_DIR=$(abspath $(VENV))/torch_extensions $(PYTHON) -c \
		"from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null \
		|| echo "note: DeepSpeed's CPU op was not prebuilt; a run under DeepSpeed on this machine builds it first"
	touch $(STAMP)

setup: $(STAMP)

# The report page's browser test drives Chromium from the system packages (Debian/Ubuntu), installed once as root;
# where it cannot be installed the test is skipped and says why.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null) \
		|| echo "note: installing chromium failed; tests/training/outputs/test_report_browser.py will be skipped"; \
	else echo "note: chromium is missing; tests/training/outputs/test_report_browser.py will be skipped" \
		"(install it with: sudo apt-get install chromium chromium-driver)"; fi

demo: setup
	PYTHON=$(PYTHON) bash scripts/demo.sh demo_output

# The tests run in TEST_WORKERS processes (pytest-xdist), each on one torch thread: most tests are single-threaded
# Python over tiny models, so two workers on this project's 2-core machine take about two thirds of the time of one.
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -n $(TEST_WORKERS)

# A worker takes whole modules (loadscope), so a module's fixtures (its trainer runs) run once, not once per worker:
# 719 s against 805 s here. The fast loop has few such fixtures and balances better test by test (105 s against 113).
# The modules go out in collection order, the longest first (FIRST_MODULES in tests/conftest.py), so that no long one
# is left to run alone at the end.
test: setup browser
	$(PYTEST) --dist loadscope --no-loadscope-reorder tests

# The inner loop: the tests not marked slow (whole trainer runs, child processes, model grids; see tests/conftest.py).
test-fast: setup browser
	$(PYTEST) -m "not slow" tests

bench: setup
	$(PYTHON) scripts/bench_offload.py
