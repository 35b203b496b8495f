#!/bin/sh
# The C++ compiler of the V0 build: the caller's compiler (RLWB_V0_CXX, split on spaces as CMake splits CXX) with
# the build's own arguments, then -g0. Why, and why not a CMake setting: scripts/vllm_v0_wheel.py.
[ -z "$RLWB_V0_WRAPPED" ] || { echo "cxx_without_debug_info.sh: RLWB_V0_CXX leads back to this file" >&2; exit 2; }
set -f  # split RLWB_V0_CXX on spaces, never expand it as a glob
# shellcheck disable=SC2086
RLWB_V0_WRAPPED=1 exec ${RLWB_V0_CXX:-c++} "$@" -g0
