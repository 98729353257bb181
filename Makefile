# Two set-up commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# What `make demo` needs: memwarden and its runtime dependencies (what `pip install .` installs), the hook.
RUNTIME_STAMP := $(VENV)/.memwarden-runtime
# What `make test`, `make lint` and `make bench` need on top: the test tools and the quantization libraries.
STAMP := $(VENV)/.memwarden-installed

.PHONY: install install-runtime browser demo test lint bench clean

$(RUNTIME_STAMP): pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first, alone and pinned, so pip takes the CPU build on disk, never a CUDA download
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt torch
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e .
	$(PY) -m memwarden.record.native --build
	touch $(RUNTIME_STAMP)

$(STAMP): $(RUNTIME_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test]"
	# torchao apart (its own folder, not site-packages): beside transformers, every `import
	# transformers` would import it. tests/test_estimate_hqq_torchao.py quantizes with it in a child.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --upgrade --target $(VENV)/torchao -c constraints.txt torchao
	# hqq apart too, built without its CUDA step; the HQQ test quantizes with it in a child
	DISABLE_CUDA=1 $(PY) -m pip install -q --disable-pip-version-check --no-deps --upgrade --target $(VENV)/hqq \
		-c constraints.txt hqq einops termcolor
	# bitsandbytes (CPU backend) and compressed-tensors (+ loguru) apart too; tests/test_estimate_quant_libraries.py
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --upgrade --target $(VENV)/bnb -c constraints.txt bitsandbytes
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --upgrade --target $(VENV)/ct \
		-c constraints.txt compressed-tensors loguru
	touch $(STAMP)

# Python packages and the native capture hook only: a C++ compiler and Python are all `make demo`
# needs. No system packages are installed here. install-runtime: memwarden and its runtime
# dependencies alone; install: those and the test tools.
install-runtime: $(RUNTIME_STAMP)

install: $(STAMP)

# The headless browser the report tests drive. Part of the test set-up, not of install: it uses
# the system's package manager where there is one; where there is none it says so, and the
# browser tests skip with that reason.
browser:
	@./scripts/install-chromium.sh

demo: install-runtime
	$(VENV)/bin/memwarden demo

test: install browser
	# two workers, each test file in one of them (module fixtures built once): ~11 min on 2 cores, 17 serial
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25

# The quality gates .ci/run applies: lint, formatting, types (zero errors over src/memwarden).
lint: install
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/mypy

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
