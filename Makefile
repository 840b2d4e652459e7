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
# A wheel index to take torch from instead of the package index (whose torch is a CUDA build on Linux),
# e.g. PyTorch's CPU builds: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# The choice is remembered in the venv; see tools/install_torch.py. TORCH_INDEX_TIMEOUT: seconds to wait.
TORCH_INDEX ?=
TORCH_INDEX_TIMEOUT ?= 20

.PHONY: install lab lint test test-other-cpu test-gpu execute bench run-twice reference data slides handout translations practice clean torch-from-index validate-planner

install: $(INSTALLED) $(if $(TORCH_INDEX),torch-from-index)

# TORCH_INDEX given for a venv that exists: torch from that index, unless it came from there already.
torch-from-index: $(INSTALLED)
	$(PY) tools/install_torch.py --index-url '$(TORCH_INDEX)' --timeout $(TORCH_INDEX_TIMEOUT)

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when requirements.txt or pyproject.toml change, so a second run is instant.
$(INSTALLED): requirements.txt pyproject.toml tools/jupyterlab_overrides.json | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	@# torch from TORCH_INDEX, or from the index remembered in the venv; without either, nothing (the next line)
	$(PY) tools/install_torch.py --index-url '$(TORCH_INDEX)' --timeout $(TORCH_INDEX_TIMEOUT)
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

# Lesson 05's figures on this machine (its device: the first GPU, else the CPU), written to data/reference/ with
# the machine's description; the lesson plots a learner's speed ratios beside every file there.
reference: $(INSTALLED)
	$(PY) tools/record_reference.py

# Lesson 07's planner against live runs here (real tensors, fake ones, 2 processes) and the
# published runs: prints the table, writes data/planner/validation.json (machine, versions, date).
validate-planner: $(INSTALLED)
	CUDA_VISIBLE_DEVICES= $(PY) tools/validate_planner.py

data: $(INSTALLED)
	$(PY) data/make_data.py

# Static reveal.js decks of the lessons, in build/slides (git-ignored), a translation's in build/slides/<lang>;
# see tools/build_slides.py.
slides: $(INSTALLED)
	$(PY) tools/build_slides.py

# Each practice notebook written from its solution notebook, the one source (an exercise's `...` version is
# its cell's metadata "practice"); then `make execute NB=...` on a practice notebook whose code changed.
practice: $(INSTALLED)
	$(PY) tools/make_practice.py

# The Hindi and Turkish notebooks (notebooks/hi, notebooks/tr) from the English ones and the catalogs in
# locales/: the catalogs follow the English first (changed cells become fuzzy), then the notebooks are
# written; commit both. See tools/translations.py and the README's "In your language".
translations: $(INSTALLED)
	$(PY) tools/translations.py update
	$(PY) tools/translations.py build

# One PDF per lesson in build/handouts (one slide per page, speaker notes included), printed from
# the static decks by headless Chromium; see tools/handout.py.
handout: slides
	$(PY) tools/handout.py

clean:
	rm -rf build .pytest_cache
