# The README's two commands: `make book` and `make test`. Everything else is a part of them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

VENV       := .venv
PY         := $(VENV)/bin/python
STAMP      := .make
PYTHON     ?= python3
export TUTORIAL_PROFILE ?= ci
# jupyter-book, papermill and nbmake start kernels from PATH: make it this venv's.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help book test setup system venv vendor ipynb main-job html lint lint-workflows test-quick test-unit test-durations test-notebooks test-browser clean lab publish publish-gh-pages

help:
	@echo "make book   set up (Debian packages, .venv), run the main job, build the HTML book into _build/html"
	@echo "make test   set up if needed, then run every test (unit, notebooks with nbmake, book build, browser)"
	@echo "make lab    JupyterLab on the chapters (127.0.0.1:$(LAB_PORT), token in $(STAMP)/lab_token; LAB_PORT=N to move it)"
	@echo "make publish DEST=DIR   copy _build/html into DIR (make publish-gh-pages: a local gh-pages branch)"
	@echo "parts: setup ipynb main-job html lint lint-workflows test-quick test-unit test-notebooks test-browser clean"

# --- set-up (each step done once; redone only when its inputs change) -----------------------
$(STAMP)/system: scripts/install_system_packages.sh
	@mkdir -p $(STAMP)
	bash scripts/install_system_packages.sh
	@touch $@

$(STAMP)/venv: requirements.txt pyproject.toml | $(STAMP)/system
	@mkdir -p $(STAMP)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# jupyter-events pulls in rfc3987-syntax (jsonschema's checker of the "iri" format, which no schema
	# here uses); jsonschema imports it when present, and its import builds an Earley grammar: 2.6 s of
	# CPU in every process that imports nbformat, papermill or jupyter-book (a job run: 7.4 s -> 4.7 s)
	$(PY) -m pip uninstall -q -y rfc3987-syntax lark
	@touch $@

# LeRobot 0.3.3's dataset loader, beside the venv (not in it: it pins older torch and datasets),
# for the test that loads this project's datasets with it
LEROBOT03  := .lerobot03
$(STAMP)/lerobot03: requirements-lerobot03.txt | $(STAMP)/venv
	rm -rf $(LEROBOT03)
	$(PY) -m pip install -q --no-deps --target $(LEROBOT03) -r requirements-lerobot03.txt
	@touch $@

# LeRobot 0.4.4's policies (ACT, Diffusion Policy, VQ-BeT for the model zoo), INTO .venv with
# --no-deps: its declared pins (torch<2.11, rerun-sdk's numpy>=2...) cannot be met beside
# requirements.txt; requirements-lerobot04.txt lists what it needs and explains each override.
# Redone after the venv is: a new torch needs the torchvision built for it.
$(STAMP)/lerobot04: requirements-lerobot04.txt $(STAMP)/venv
	$(PY) -m pip install -q --no-deps -r requirements-lerobot04.txt
	$(PY) -c "from tutorial_utils.policies._torchvision import ensure_importable; ensure_importable(); import lerobot.policies.factory"
	@touch $@

# SmolVLA's stand-in smoke test needs transformers 4.57, which needs huggingface_hub<1.0: beside the
# venv in .smolvla (requirements-smolvla.txt says why), put on PYTHONPATH only by that test's process
SMOLVLA    := .smolvla
$(STAMP)/smolvla: requirements-smolvla.txt $(STAMP)/lerobot04
	rm -rf $(SMOLVLA)
	$(PY) -m pip install -q --no-deps --target $(SMOLVLA) -r requirements-smolvla.txt
	@touch $@

_vendor/.vendored: src/tutorial_utils/report/book.py | $(STAMP)/venv
	$(PY) -m tutorial_utils book vendor

system: $(STAMP)/system
venv: $(STAMP)/venv
vendor: _vendor/.vendored
setup: $(STAMP)/system $(STAMP)/venv $(STAMP)/lerobot03 $(STAMP)/lerobot04 $(STAMP)/smolvla _vendor/.vendored

# --- the book ---------------------------------------------------------------------------------
ipynb: setup
	$(PY) -m tutorial_utils book ipynb

# the main job runs the real CPU chain (record -> train -> evaluate -> promote) in the `cpu`
# profile, reusing finished runs; the book itself is built in the `ci` profile from what it promoted.
MAIN_PROFILE ?= cpu
main-job: setup
	$(PY) -m tutorial_utils doctor --json runs/doctor.json || true
	TUTORIAL_PROFILE=$(MAIN_PROFILE) $(PY) -m tutorial_utils pipeline

# BOOK_EXECUTED=DIR: reuse the chapters nbmake ran in DIR instead of executing them (what `make test` does)
html: setup
	$(PY) -m tutorial_utils book build $(if $(BOOK_EXECUTED),--executed $(BOOK_EXECUTED))

book: setup main-job html
	@echo "book: $(CURDIR)/_build/html/index.html"

# --- the other doors: JupyterLab, and a copy of the built site ----------------------------------
# JupyterLab on 127.0.0.1 only; the token is in $(STAMP)/lab_token (0600) and is never printed.
# From a laptop: ssh -N -L 8888:127.0.0.1:8888 user@server, then open http://127.0.0.1:8888/lab
LAB_PORT ?= 8888
lab: venv
	$(PY) -m tutorial_utils lab --port $(LAB_PORT)

# copy _build/html into DEST (built beside it, then renamed into place); run `make html` first
# DEST reaches the command through the environment, unexpanded ($(value ...)): no byte of it is
# ever shell or make syntax (a quote, a `;`, a `$` stay part of the folder name)
unexport DEST
publish: export TUTORIAL_PUBLISH_DEST = $(value DEST)
publish:
	@test -n "$$TUTORIAL_PUBLISH_DEST" || { echo "usage: make publish DEST=/some/dir   (copies _build/html there)" >&2; exit 2; }
	$(PY) -m tutorial_utils lab publish "$$TUTORIAL_PUBLISH_DEST"

# write _build/html to the local gh-pages branch (with .nojekyll); pushing it is up to you:
# git push origin gh-pages
publish-gh-pages:
	@test -f _build/html/index.html || { echo "_build/html/index.html is missing: run make html first" >&2; exit 1; }
	$(VENV)/bin/ghp-import --no-jekyll --branch gh-pages --message "book: $$(git rev-parse --short HEAD)" _build/html
	@echo "gh-pages updated (not pushed): git push origin gh-pages"

# --- tests --------------------------------------------------------------------------------------
# ruff's settings are in pyproject.toml; a formatting or lint error fails `make test`
lint: venv
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m ruff check src tests benchmarks
	$(MAKE) --no-print-directory lint-workflows

# the CI workflow (.github/workflows), checked offline by actionlint (bundled in .venv)
lint-workflows: venv
	$(VENV)/bin/actionlint -no-color .github/workflows/*.yml

# the unit tests minus the `slow` and `browser` ones, on 2 workers: under 2 minutes on 2 cores. A test
# is slow when marked by hand or measured at 2 s or more (tests/durations.json, from test-durations)
test-quick: setup
	$(PY) -m pytest tests -m "not slow and not browser" -n 2 -p no:cacheprovider -q

# measure every unit test's duration again (on a quiet machine) into tests/durations.json
test-durations: setup
	$(PY) -m pytest tests -m "not browser" -n 2 -p no:cacheprovider -q --record-durations

# every unit test but the browser ones (LIBERO and slow included), on 2 workers: 13-16 min on this
# project's 2-core machine; the 25 slowest are listed at the end
test-unit: setup
	$(PY) -m pytest tests -m "not browser" -n 2 -p no:cacheprovider --durations=25

# every notebook (chapters and jobs) run by nbmake on 2 workers, in twins written to $(EXECUTED);
# --overwrite keeps their outputs there, and `make test` builds the book from them (book build
# --executed) instead of executing each chapter a second time. Not under _build: nbmake skips
# any path with a _build folder in it. Each notebook's time is listed at the end (--durations=0).
EXECUTED   := .executed
# The order nbmake starts them in: xdist's load scheduler hands each worker two notebooks at a time,
# so the longest (the zoo job ~4 min, the sweep job and chapter 8 ~2.5 min each, in the ci profile)
# go first, to different workers, and the short chapters fill in behind them. In alphabetical order
# the zoo job queued behind the sweep job on one worker while the other stood idle for 6 minutes.
NB_FIRST   := notebooks/jobs/zoo notebooks/09_model_zoo notebooks/jobs/sweep notebooks/08_training_platform \
              notebooks/jobs/evaluate
test-notebooks: setup
	rm -rf $(EXECUTED)
	$(PY) -m tutorial_utils book ipynb --dest $(EXECUTED) >/dev/null
	cd $(EXECUTED) && $(CURDIR)/$(PY) -m pytest --nbmake --nbmake-timeout=900 --overwrite -n 2 -p no:cacheprovider -q --durations=0 \
	    $(addsuffix .ipynb,$(NB_FIRST)) $$(find notebooks -name '*.ipynb' | sort | grep -vxF $(foreach n,$(NB_FIRST),-e $(n).ipynb))

# the browser tests on 2 workers, each with its own Chromium and page server (146-176 s here
# against 171-210 s on one)
test-browser: html
	REQUIRE_BOOK=1 $(PY) -m pytest tests -m browser -n 2 -p no:cacheprovider

test: setup
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory test-unit
	$(MAKE) --no-print-directory test-notebooks
	$(MAKE) --no-print-directory test-browser BOOK_EXECUTED=$(EXECUTED)

clean:
	rm -rf _build $(STAMP) $(EXECUTED)
