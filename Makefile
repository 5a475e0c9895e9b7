# The two commands of the README:
#   make demo   trains the built-in demo model end to end (no network beyond the package registries)
#   make test   lint, type check and the whole test suite (what CI runs, through .ci/run)
#   make wheels a wheel and an sdist of every package into dist/ (after checking the halyard-* ranges)
# Each creates or updates the local virtual environment .venv first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PACKAGE_DIRS := $(sort $(dir $(wildcard packages/*/pyproject.toml)))
STAMP := $(VENV)/.installed
INSTALL_ARGS := $(foreach p,$(PACKAGE_DIRS),-e $(p)) --group dev
# Simulated devices so sharding code runs on a CPU-only machine.
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8
# Three workers on CI's two cores: many tests wait on subprocesses (training runs, kill -9 and resume,
# multi-process runs), and a third worker keeps both cores busy meanwhile (the whole suite on this
# 2-core machine: 1770 s with two workers, 1540 s with three). The slowest tests are listed at the end of
# the run. Each worker process runs at most 1000 tests, then a fresh one takes its place
# (tools/pytest_worker_life.py); with ~2200 tests, none does. It was 300: a worker that lived for the whole
# suite grew to ~6 GB and, in about one full run of four, died of a native segfault in jaxlib's CPU runtime
# hundreds of tests in. Both come from the compiled programs a worker keeps, which it now drops after a test
# file past half the kernel's limit on memory maps or 4 GB resident (conftest.py's release_compiled_programs),
# and each fresh worker costs ~25 s of collection (every test module imported again; 300 started 5). Workers are sent
# at most 16 tests at a time (xdist's first share is otherwise a quarter of a worker's tests, 140 in a row):
# the files come longest first (conftest.py's FILE_SECONDS), and small shares spread them over the workers.
# A worker that crashes is reported at the end of the run with the test it ran, the signal, and its native
# and Python stacks (tools/pytest_crash_report.py).
PYTEST_ARGS ?= -n 3 --durations=30 --maxschedchunk 16 -p tools.pytest_worker_life --worker-tests 1000 \
	-p tools.pytest_crash_report

.PHONY: demo test lint typecheck pytest venv wheels clean stress parity-isa

# libtpu, the TPU compiler, in a folder that is not on sys.path: `halyard plan --accelerator "TPU v5e"` compiles
# the step for the chip's topology with it (halyard.train.plan.tpu_topology). Importable, it would make every
# JAX process try to start a TPU and the TPU-only tests run (conftest.py). The version JAX 0.10.2's `jax[tpu]`
# pins: 213 MB, ~5 s to fetch here. Without a registry it is left out: the plan then prints the CPU's estimate
# with no fit verdict, and its test skips, each saying how to get libtpu.
LIBTPU_VERSION := 0.0.42.1
LIBTPU := $(VENV)/libtpu/libtpu/libtpu.so

venv: $(STAMP) $(LIBTPU)

$(LIBTPU): | $(STAMP)
	$(PY) -m pip install --quiet --no-deps --target $(VENV)/libtpu "libtpu==$(LIBTPU_VERSION)" \
		|| echo "libtpu $(LIBTPU_VERSION) not installed: halyard plan --accelerator 'TPU v5e' gives the CPU's estimate, no verdict"

$(STAMP): pyproject.toml $(wildcard packages/*/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=25.1"
	# A CPU build of torch, from local disk where available (only the tests use it, as the
	# reference implementation for Hugging Face parity); installed first so that nothing pulls a CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	# The packages and the dev group through uv, which resolves and installs them in ~25 s where pip takes
	# ~150 s (it keeps the torch above, which satisfies every range); pip does the same if uv fails.
	$(PY) -m pip install --quiet "uv>=0.9,<1"
	$(PY) -m uv pip install --quiet --python $(PY) $(INSTALL_ARGS) \
		|| $(PY) -m pip install --quiet $(INSTALL_ARGS)
	touch $(STAMP)

# One CPU device for the demo: simulated devices only slow a single small model down. libtpu too, as `make venv`
# installs it, so that `halyard plan --accelerator "TPU v5e"` after `make demo` gives the TPU compiler's verdict.
demo: $(STAMP) $(LIBTPU)
	XLA_FLAGS= $(VENV)/bin/halyard train --config demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP) $(LIBTPU)
	$(PY) -m pytest $(PYTEST_ARGS)

# mypy runs beside the suite: the suite leaves a core idle while it collects and in its last minutes.
test: lint
	$(MAKE) --no-print-directory -j2 typecheck pytest

# The multi-device and multi-process files 5 times with a CPU hog on every core beside them (ROUNDS=n to change),
# then the determinism soak (tools/determinism_soak.py: 2,000 requests, 3 rounds) beside the same hogs.
ROUNDS ?= 5
stress: $(STAMP)
	tools/stress_suite.sh --rounds $(ROUNDS)

# The family and engine parity files with each instruction set XLA's CPU backend may pick kernels for: this
# CPU's best, AVX2 (no AVX-512) and AVX (no FMA either).
parity-isa: $(STAMP)
	tools/stress_suite.sh --files parity --hogs 0 --rounds 1 --isa native,AVX2,AVX

wheels: $(STAMP)
	$(PY) tools/wheelhouse.py --out dist

clean:
	rm -rf $(VENV) dist .pytest_cache .mypy_cache .ruff_cache .stress
