# One command sets everything up and runs the job: `make demo`, `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
JOBS ?= 2

.PHONY: setup demo test gpu-test clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0   # the CPU wheel; an unpinned torch pulls a CUDA build
	$(PY) -m pip install -q -e ".[test,plot]"
	touch $@

demo: setup
	$(PY) -m fmha demo

test: setup
	$(PY) -m pytest -q -n $(JOBS) tests

# on a GPU machine with torch and triton already there (no venv): the compiled kernels.  One NumPy
# thread per worker: the float64 references of GPU-sized cases would otherwise oversubscribe the cores.
# SHARD=I/N runs the I-th of N fixed parts (a cold Triton cache makes the whole suite longer than one call).
GPU_JOBS ?= 15
gpu-test:
	PYTHONPATH=src OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
		$(PYTHON) -m pytest -q -n $(GPU_JOBS) -p no:cacheprovider -rf $(if $(SHARD),--shard $(SHARD)) tests

clean:
	rm -rf $(VENV) build src/*.egg-info
