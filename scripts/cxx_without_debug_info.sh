#!/bin/sh
# The C++ compiler of the V0 build (scripts/vllm_v0_wheel.py sets CXX to this file and RLWB_V0_CXX to the caller's
# CXX): the real compiler with the build's own arguments, then -g0. vLLM 0.8.5 builds RelWithDebInfo (-O2 -g) by
# default; its only other build types change the code (Release: -O3) and CXXFLAGS go before the build type's -g, so
# the debug info is dropped here: GCC's last -g option wins. GCC means -g never to change the code it generates
# (its -fcompare-debug checks that); measured on the V0 build: the same .text bytes in _C.abi3.so either way
# (scripts/bench_v0_build.py). RLWB_V0_CXX is split on spaces like CMake's CXX ("ccache g++", "g++ -m64").
[ "${RLWB_V0_CXX:-c++}" = "$0" ] && { echo "cxx_without_debug_info.sh: RLWB_V0_CXX names this file" >&2; exit 2; }
# shellcheck disable=SC2086
exec ${RLWB_V0_CXX:-c++} "$@" -g0
