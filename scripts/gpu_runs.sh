#!/usr/bin/env bash
# The GPU runs of record on a machine with torch + transformers and no registry (scripts/gpu_runs.py says what runs).
# Installs the wheels carried in $WHEELS (default .whl/, fetched by `make gpu-wheels`) into a private target, after
# checking that every one scripts/device/wheels.txt names is there (scripts/device/wheels.py pinned), then runs scripts/gpu_runs.py with the rest of the args.
#   scripts/gpu_runs.sh                 # on the GPU machine: every step not done yet, packed under $OUT
#   scripts/gpu_runs.sh --cpu           # the CPU rehearsal (tests/test_gpu_runs.py runs it in a view of the image)
set -euo pipefail
cd "$(dirname "$0")/.."
# the kernel env where `make setup` made one (a user's GPU machine), else the image's python3 (a lent one)
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WHEELS=${WHEELS:-.whl}
SITE=${RLWB_DEVICE_SITE:-/tmp/rlwb-device-site}
if [ ! -d "$WHEELS" ] && "$PY" -c "import papermill, nbconvert, ipykernel, pydantic" 2>/dev/null; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  exec "$PY" scripts/gpu_runs.py "$@"  # everything is installed: no wheels to carry
fi
# exactly the pinned files (a .whl/ left from an older list may hold two versions of one package); none missing
pinned=$("$PY" scripts/device/wheels.py pinned "$WHEELS") || exit 2
set +e
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $pinned \
  > /tmp/rlwb-wheels.log 2>&1
rc=$?
set -e
grep -v "^WARNING: Target directory" /tmp/rlwb-wheels.log || true
[ $rc -eq 0 ] || { echo "gpu_runs: installing the wheels failed (exit $rc)" >&2; exit 2; }
# nbconvert's templates and ipykernel's kernel spec are the wheels' data files, under the target's share/jupyter
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" JUPYTER_PATH="$SITE/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}" \
  PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import papermill, nbconvert, ipykernel, pydantic" || { echo "gpu_runs: the wheels do not import" >&2; exit 2; }
"$PY" -c "import torch, transformers; print('gpu_runs: python', __import__('sys').version.split()[0], 'torch', \
torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and \
torch.cuda.get_device_name(0))"
exec "$PY" scripts/gpu_runs.py "$@"
