#!/bin/sh
# The C++ compiler of the V0 build (scripts/vllm_v0_wheel.py sets CXX to this file): the real compiler
# ($RLWB_V0_CXX, else c++) with the build's own arguments, then -g0. vLLM 0.8.5 builds RelWithDebInfo (-O2 -g) and
# its setup.py passes no CMake flags through, so this is where the debug info goes: GCC's last -g option wins, and
# -g never changes the code generated (the .text of _C.abi3.so is the same bytes either way, measured:
# scripts/bench_v0_build.py), while the build is faster and the wheel about 4x smaller.
exec "${RLWB_V0_CXX:-c++}" "$@" -g0
