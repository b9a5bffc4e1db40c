# The course's commands. `make run` and `make test` are the two a new user needs.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
ENSURE := bash scripts/ensure_env.sh
ENSURE_RUN := bash scripts/ensure_env.sh --for=run
OUT ?= build/run
# make book: the executed reference run the site shows (make report writes one per GPU); empty:
# the newest in reports/ (by its summary's date)
BOOK_REPORT ?=
PROFILE ?= $(or $(COURSE_PROFILE),auto)
# PARAMS="amp_dtype=fp16 steps=40": set notebook parameters (papermill) for run, notebooks, report
PARAM_ARGS := $(foreach p,$(PARAMS),--param $(p))
# make lab: the lab server's own environment (never the course's), and the kernelspec it is given,
# which runs the course's Python (scripts/lab.sh)
LAB_VENV ?= .venv-lab
LAB_KERNEL ?= $(LAB_VENV)/course-kernel

# make test: stock pytest-xdist, one worker more than the cores (tests/conftest.py), the tests
# that read one notebook's smoke run in its group on one worker, the long groups first
PYTEST_ARGS ?= -n auto --dist loadgroup --no-loadscope-reorder
# git's nbstripout filter (.gitattributes gives it notebooks/*.ipynb: commits take them without
# outputs, the working copy keeps them), set up by nbstripout's own --install. That passes no
# options on (nbstripout issue #150): --keep-id (the notebooks' fixed cell ids) is added to its
# command after it, and the language_info details a kernel adds go to nbstripout's extrakeys.
NBSTRIPOUT_KEYS := $(foreach k,codemirror_mode file_extension mimetype nbconvert_exporter \
  pygments_lexer version,metadata.language_info.$(k))
FILTER = if [ "$$(git rev-parse --show-toplevel 2>/dev/null)" != "$$(pwd -P)" ]; then \
    echo "make: not a git checkout (an archive?), so no notebook filter is set up: none is needed"; \
  elif ! "$$py" -m nbstripout --version >/dev/null 2>&1; then \
    echo "make: git's notebook filter is not set up: $$py has no nbstripout (make test installs it)"; \
  elif [ "$$(git config filter.nbstripout.clean)" != "\"$$py\" -m nbstripout --keep-id" ]; then \
    if "$$py" -m nbstripout --install --python "$$py" --attributes .gitattributes 2>/dev/null \
       && git config filter.nbstripout.clean "$$(git config filter.nbstripout.clean) --keep-id" \
       && git config filter.nbstripout.extrakeys "$(NBSTRIPOUT_KEYS)" 2>/dev/null; then \
      echo "make: set up git's nbstripout filter: notebooks/*.ipynb go into commits without their outputs"; \
    else \
      echo "make: .git/config cannot be written (a read-only checkout?), so git's notebook filter is not set up: run make strip before you commit a notebook"; \
    fi; \
  fi

.PHONY: help run test lab report notebooks apex strip filter clean book

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12

run:  ## prepare the environment, build Apex if a CUDA toolchain is here, execute all notebooks
	@py=$$($(ENSURE_RUN)); \
	"$$py" -m coursetools.runner --out $(OUT) --profile $(PROFILE) $(PARAM_ARGS) --check; \
	if "$$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.version.cuda else 1)" 2>/dev/null \
	   && "$$py" -c "import sys; from helpers.environment import find_nvcc; sys.exit(0 if find_nvcc() else 1)"; then \
	  PYTHON=$$py ./build_apex.sh --legacy-amp \
	    || echo "make run: the Apex build failed (its message is above); the notebooks still run and skip the Apex cells."; \
	elif "$$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	  echo "make run: a CUDA GPU but no nvcc here, so Apex is not built; the Apex cells skip with one line each (install the CUDA toolkit matching torch.version.cuda to build it)."; \
	else \
	  echo "make run: no CUDA GPU here, so Apex is not built; the notebooks run in the small 'smoke' profile and skip GPU-only cells."; \
	fi; \
	"$$py" -m coursetools.runner --out $(OUT) --profile $(PROFILE) $(PARAM_ARGS)

test:  ## prepare the environment and run the test suite (unit tests, smoke notebooks, hygiene)
	@py="$$($(ENSURE))"; $(FILTER); "$$py" -m pytest -q $(PYTEST_ARGS)

filter:  ## set up git's nbstripout filter: notebooks are committed without outputs (test, lab do it)
	@py="$$($(ENSURE_RUN))"; $(FILTER)

strip:  ## remove the outputs and execution counts from notebooks/*.ipynb (the working copy)
	@py="$$($(ENSURE_RUN))"; $(FILTER); \
	"$$py" -m nbstripout --keep-id --extra-keys "$(NBSTRIPOUT_KEYS)" notebooks/*.ipynb; \
	echo "make strip: notebooks/*.ipynb have no outputs or execution counts now"

notebooks:  ## execute the notebooks only (no build), e.g. make notebooks PROFILE=smoke
	@py=$$($(ENSURE_RUN)); "$$py" -m coursetools.runner --out $(OUT) --profile $(PROFILE) $(PARAM_ARGS)

report:  ## on a CUDA machine: build Apex if needed, then a full-profile run into reports/<gpu>/
	@py=$$($(ENSURE_RUN)); \
	"$$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
	  || { echo "make report: needs a CUDA GPU (torch sees none); use 'make run' here instead."; exit 2; }; \
	"$$py" -m coursetools.runner --report $(PARAM_ARGS) --check; \
	PYTHON=$$py ./build_apex.sh --legacy-amp; \
	"$$py" -m coursetools.runner --report $(PARAM_ARGS)

book:  ## build the site of the reference run (BOOK_REPORT) into build/book/; runs no notebook
	@py=$$($(ENSURE) --for=book); "$$py" -m coursetools.book $(if $(BOOK_REPORT),--report $(BOOK_REPORT)) --screenshots

lab:  ## open JupyterLab on the notebooks (prints the URL to open; Ctrl-C stops it)
	@py="$$($(ENSURE))"; $(FILTER); \
	exec bash scripts/lab.sh "$$py" requirements.txt "$(LAB_VENV)" "$(LAB_KERNEL)"

apex:  ## build Apex with its CUDA/C++ extensions and the legacy apex.amp install
	@py=$$($(ENSURE_RUN)); PYTHON=$$py ./build_apex.sh --legacy-amp

clean:  ## remove build products (executed notebooks, local results)
	rm -rf build results
