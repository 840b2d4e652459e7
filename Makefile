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

.PHONY: install lab test execute bench data slides clean

install: $(INSTALLED)

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when requirements.txt or pyproject.toml change, so a second run is instant.
$(INSTALLED): requirements.txt pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# Jupyter refuses to run as root unless told to (containers, CI machines).
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(INSTALLED)
	$(JUPYTER) lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

test: $(INSTALLED)
	$(PY) -m pytest $(NBVAL) tests notebooks

# The only way stored outputs are written: run each notebook top to bottom in the venv.
execute: $(INSTALLED)
	@for nb in $(or $(NB),$(NOTEBOOKS)); do \
	  echo "executing $$nb"; \
	  $(JUPYTER) nbconvert --to notebook --execute --inplace --log-level=WARN \
	    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False "$$nb" || exit 1; \
	done

bench: $(INSTALLED)
	$(PY) tools/bench.py $(NOTEBOOKS)

data: $(INSTALLED)
	$(PY) data/make_data.py

# Static reveal.js decks of the lessons, in build/slides (git-ignored); see tools/build_slides.py.
slides: $(INSTALLED)
	$(PY) tools/build_slides.py

clean:
	rm -rf build .pytest_cache
