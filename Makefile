# One-command set-up: `make lab` to learn, `make test` to check everything.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
JUPYTER := $(VENV)/bin/jupyter
INSTALLED := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb notebooks/practice/*.ipynb))
NBVAL := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
LAB_ARGS ?=

.PHONY: install lab lint test test-other-cpu test-gpu execute bench run-twice data slides handout clean

install: $(INSTALLED)

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when requirements.txt or pyproject.toml change, so a second run is instant.
$(INSTALLED): requirements.txt pyproject.toml tools/jupyterlab_overrides.json | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@# JupyterLab's first start asks nothing that is not about the course (no news or update prompt)
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp tools/jupyterlab_overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $@

# Jupyter refuses to run as root unless told to (containers, CI machines).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(INSTALLED)
	$(JUPYTER) lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# The stored outputs are replayed on the CPU by design: a GPU, if any, is hidden from the tests.
# What depends on the hardware is range-checked in each lesson (helpers/ranges.py), so the replay
# holds on any CPU; test-other-cpu proves it on PyTorch's plain kernels, test-gpu runs on a GPU.
# Two test workers (pytest-xdist), one per core of the course's 2-core machine; each file (a notebook's
# cells in order) stays on one worker. TEST_WORKERS=0 runs everything in this one process.
TEST_WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# ruff over helpers/, tools/, tests/, data/ and the notebooks' code cells (pyproject.toml).
lint: $(INSTALLED)
	$(VENV)/bin/ruff check .

test: $(INSTALLED)
	CUDA_VISIBLE_DEVICES= $(PY) -m pytest $(NBVAL) $(PARALLEL) --durations=15 tests notebooks

test-other-cpu: $(INSTALLED)
	ATEN_CPU_CAPABILITY=default CUDA_VISIBLE_DEVICES= $(PY) -m pytest $(NBVAL) $(PARALLEL) notebooks

# Every notebook run on the GPU: fails on any cell error or any measured value outside its range.
test-gpu: $(INSTALLED)
	$(PY) tools/bench.py --require-gpu $(NOTEBOOKS)

# The only way stored outputs are written: run each notebook top to bottom in the venv.
execute: $(INSTALLED)
	@for nb in $(or $(NB),$(NOTEBOOKS)); do \
	  echo "executing $$nb"; \
	  $(JUPYTER) nbconvert --to notebook --execute --inplace --log-level=WARN \
	    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False "$$nb" || exit 1; \
	done

# Wall time, peak memory and measured values per notebook; fails on a value outside its range.
bench: $(INSTALLED)
	$(PY) tools/bench.py $(NOTEBOOKS)

# Each code cell run twice in a row, as a learner pressing Shift+Enter twice: lists the cells whose
# second run fails or prints something else (tools/run_twice.py). For authors; not in `make test`.
run-twice: $(INSTALLED)
	$(PY) tools/run_twice.py $(NB)

data: $(INSTALLED)
	$(PY) data/make_data.py

# Static reveal.js decks of the lessons, in build/slides (git-ignored); see tools/build_slides.py.
slides: $(INSTALLED)
	$(PY) tools/build_slides.py

# One PDF per lesson in build/handouts (one slide per page, speaker notes included), printed from
# the static decks by headless Chromium; see tools/handout.py.
handout: slides
	$(PY) tools/handout.py

clean:
	rm -rf build .pytest_cache
