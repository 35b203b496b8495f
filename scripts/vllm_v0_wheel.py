"""Find or build the vLLM 0.8.5 CPU wheel (the V0 engine) in rlwb's wheel cache, keyed by what it depends on.

Run with the V0 environment's interpreter (it reads that environment's torch):

    python scripts/vllm_v0_wheel.py ensure CACHE_DIR      → prints the wheel's path (built if needed)
    python scripts/vllm_v0_wheel.py key [--torch V] [--isa avx2|avx512] [--python cp311] ...
                                                         → prints the key and the facts it hashes
    python scripts/vllm_v0_wheel.py explain-log LOG      → the one-line diagnosis of a failed build's log

Why a key. A wheel is native code built against one torch ABI, one glibc / libstdc++, one compiler and
one instruction set. The old cache (`wheels/vllm-0.8.5+cpu-*.whl`, any file that matched) installed a
wheel built on an AVX-512 machine onto an AVX2 machine, or one built against another torch, and failed at
run time far from the cause. Now every cached wheel lives in `wheels/vllm-0.8.5+cpu/<key>/` beside a
`key.json` listing the facts; a wheel whose key differs from this machine's is never looked at (it is
rebuilt), and one that was built here but does not load is removed and rebuilt.

Why the AVX2 kernels by default (`VLLM_CPU_DISABLE_AVX512=true`, `--isa avx2`). vLLM 0.8.5's
`cmake/cpu_extension.cmake` fetches oneDNN from GitHub with FetchContent whenever the CPU reports avx512f
(`if (AVX512_FOUND AND NOT AVX512_DISABLED)`), and these machines reach only package registries: no
registry ships a oneDNN source tree that `FETCHCONTENT_SOURCE_DIR_ONEDNN` could point at (PyPI's `onednn`
packages are binaries without the CMake project FetchContent needs). Building the AVX2 kernels needs no
download and runs on every x86-64 CPU vLLM supports, so AVX2-only and AVX-512 machines build the same V0
kernels and get the same V0 numerics. What is given up: oneDNN's W8A8 GEMMs and AVX-512 speed in V0, which
rlwb uses as the reference for V0's semantics, not for speed. `RLWB_V0_ISA=avx512` opts back in on a
machine that can reach GitHub (the key then says avx512, and the wheel is never installed on an AVX2 CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VLLM_VERSION = "0.8.5"
# Bump when the build procedure below changes in a way the facts in `wheel_facts` do not capture.
BUILD_RECIPE = 3  # 3: compiled without debug info (`build_process_env`)
ISAS = ("avx2", "avx512")
HERE = Path(__file__).resolve().parent
# The compiler the build runs: the caller's (CXX, else c++) with -g0 last. vLLM 0.8.5 builds RelWithDebInfo
# (-O2 -g); its other build types change the code (Release: -O3) and CXXFLAGS go before the build type's -g, so the
# debug info is dropped by a wrapper (GCC's last -g option wins). GCC means -g never to change the code it generates
# (its -fcompare-debug checks that); measured: the same `.text` bytes in `_C.abi3.so`, while the build is faster and
# the wheel 4.5x smaller (`scripts/bench_v0_build.py`). Its bytes are part of the key (`wheel_facts`).
CXX_WITHOUT_DEBUG_INFO = HERE / "cxx_without_debug_info.sh"
# The caller's variables that change what vLLM 0.8.5's build compiles or links (its setup.py, envs.py and CMake
# files, and CMake itself; read 2026-11-30): passed on, and their values part of the key (`caller_build_vars`), so a
# wheel built with any of them is another wheel, never taken for the plain one.
CALLER_BUILD_VARS = ("CMAKE_BUILD_TYPE", "CXXFLAGS", "LDFLAGS", "CMAKE_TOOLCHAIN_FILE", "CMAKE_CXX_COMPILER_LAUNCHER",
                     "CPATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "VLLM_CPU_AVX512BF16", "VLLM_USE_PRECOMPILED",
                     "VLLM_PRECOMPILED_WHEEL_LOCATION")


def caller_build_vars(environ: dict[str, str]) -> dict[str, str]:
    return {k: environ[k] for k in CALLER_BUILD_VARS if k in environ}


def log(msg: str) -> None:
    print(f"\033[1m[setup]\033[0m {msg}", file=sys.stderr, flush=True)


def cpu_flags() -> set[str]:
    """rlwb's one reader of /proc/cpuinfo (`rlwb/host.py`), loaded by path: this runs in the V0 environment, where
    rlwb is not installed."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "rlwb" / "host.py"
    spec = importlib.util.spec_from_file_location("rlwb_host", path)
    host = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host)
    return host.cpu_flags()


def host_supports(isa: str, flags: set[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return {"avx2": "avx2" in flags, "avx512": "avx512f" in flags}[isa]


def build_env(isa: str) -> dict[str, str]:
    """The environment variables vLLM's CMake reads; part of the key."""
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_DISABLE_AVX512": "true" if isa == "avx2" else "false"}


def compiler_version() -> str:
    """The compiler's first `--version` line, then CXX's own arguments ("ccache g++", "g++ -march=native": CMake
    takes a CXX with arguments, and they change the code)."""
    words = shlex.split(os.environ.get("CXX", "c++")) or ["c++"]
    try:
        out = subprocess.run([*words, "--version"], capture_output=True, text=True, check=True).stdout
        return " ".join([out.splitlines()[0].strip(), *words[1:]])
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "none"


def wheel_facts(*, torch: str, isa: str, python: str, machine: str, libc: str, compiler: str,
                sdist_sha256: str, build_vars: dict[str, str] | None = None) -> dict:
    """Everything the built wheel depends on. Two machines with equal facts can share a wheel."""
    if isa not in ISAS:
        raise SystemExit(f"vllm_v0_wheel: unknown ISA {isa!r} (RLWB_V0_ISA must be one of {', '.join(ISAS)})")
    return {"vllm": VLLM_VERSION, "sdist_sha256": sdist_sha256, "torch": torch, "python": python,
            "machine": machine, "libc": libc, "compiler": compiler, "isa": isa, "build_env": build_env(isa),
            "build_recipe": BUILD_RECIPE,
            "compiler_wrapper": hashlib.sha256(CXX_WITHOUT_DEBUG_INFO.read_bytes()).hexdigest()[:16],
            "caller_build_vars": dict(sorted((build_vars or {}).items()))}


def wheel_key(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def this_machine_facts(isa: str, sdist_sha256: str) -> dict:
    from importlib.metadata import version

    return wheel_facts(torch=version("torch"), isa=isa, python=f"cp{sys.version_info[0]}{sys.version_info[1]}",
                       machine=platform.machine(), libc="-".join(platform.libc_ver()), compiler=compiler_version(),
                       sdist_sha256=sdist_sha256, build_vars=caller_build_vars(dict(os.environ)))


# A build that reaches for the network fails deep inside CMake or git; these lines name what it tried.
_NET_PATTERNS = [
    re.compile(r"unable to access '(?P<what>[^']+)'"),
    re.compile(r"Could not resolve host:? (?P<what>[\w.-]+)"),
    re.compile(r"[Ee]rror: downloading '(?P<what>[^']+)' failed"),
    re.compile(r"Failed to connect to (?P<what>[\w.-]+)"),
    re.compile(r"Temporary failure in name resolution.*?(?P<what>https?://\S+)?$"),
]


def explain_log(text: str) -> str | None:
    """One line saying what a failed build tried to download, or None when it was not a network failure."""
    for pat in _NET_PATTERNS:
        m = pat.search(text)
        if m:
            what = m.group("what") or "a URL"
            return (f"the vLLM {VLLM_VERSION} build tried to download {what} and the network is unreachable "
                    "(only package registries are). rlwb builds the AVX2 kernels to avoid vLLM's oneDNN download "
                    "(RLWB_V0_ISA=avx2, the default); RLWB_V0_ISA=avx512 needs access to github.com")
    return None


def sdist_path(cache: Path) -> Path:
    out = subprocess.run([sys.executable, str(HERE / "fetch_sdist.py"), "vllm", VLLM_VERSION, str(cache / "sdist")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"could not fetch the vLLM {VLLM_VERSION} sdist: {out.stderr.strip() or out.stdout.strip()}")
    return Path(out.stdout.strip())


def _is_the_wrapper(cxx: str) -> bool:
    words = shlex.split(cxx)
    found = shutil.which(words[0]) if words else None
    return bool(found) and Path(found).resolve() == CXX_WITHOUT_DEBUG_INFO.resolve()


def build_process_env(isa: str, environ: dict[str, str], *, debug_info: bool = False) -> dict[str, str]:
    """The environment `pip wheel` builds in: the caller's (its build variables are in the key:
    `caller_build_vars`), plus vLLM's variables and the compiler without debug info. `debug_info=True` is vLLM's own
    RelWithDebInfo build, the baseline of `scripts/bench_v0_build.py`."""
    env = dict(environ, **build_env(isa), MAX_JOBS=environ.get("MAX_JOBS", "2"))
    if not debug_info:
        real = environ.get("CXX", "c++")
        if _is_the_wrapper(real):  # a build started from inside one: the compiler it wraps
            real = environ.get("RLWB_V0_CXX", "c++")
        env.update(RLWB_V0_CXX=real, CXX=str(CXX_WITHOUT_DEBUG_INFO))
    env["PATH"] = f"{Path(sys.executable).parent}:{environ.get('PATH', '')}"  # the venv's cmake>=3.26 first
    return env


def build(sdist: Path, dest: Path, isa: str, log_path: Path, *, debug_info: bool = False) -> Path:
    """pip wheel the sdist into `dest`; on failure print one diagnosis line and the log's path, then exit 1."""
    env = build_process_env(isa, dict(os.environ), debug_info=debug_info)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log(f"building vLLM {VLLM_VERSION} for CPU ({isa} kernels) from its sdist (~2-4 min on 2 cores); "
        f"log: {log_path}")
    t0 = time.time()
    with open(log_path, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                                 str(sdist), "-w", str(dest)], env=env, stdout=f, stderr=subprocess.STDOUT)
        last = t0
        while proc.poll() is None:  # a heartbeat every minute, so a log shows the build is alive
            time.sleep(1)
            if time.time() - last >= 60:
                last = time.time()
                log(f"  still building ({last - t0:.0f} s)")
    if proc.returncode != 0:
        text = log_path.read_text(errors="replace")
        why = explain_log(text)
        if why is None:
            tail = "\n".join(text.splitlines()[-25:])
            print(tail, file=sys.stderr)
            why = "the build failed (last lines above)"
        raise SystemExit(f"vLLM {VLLM_VERSION} build failed: {why}. Full log: {log_path}")
    wheels = sorted(dest.glob(f"vllm-{VLLM_VERSION}+cpu-*.whl"))
    if not wheels:
        raise SystemExit(f"vLLM {VLLM_VERSION} build produced no wheel in {dest}. Full log: {log_path}")
    log(f"built {wheels[0].name} in {time.time() - t0:.0f} s")
    return wheels[0]


def ensure(cache: Path, isa: str, rebuild: bool = False) -> Path:
    if not host_supports("avx2"):
        raise SystemExit("vLLM's CPU backend needs an x86-64 CPU with AVX2 (no avx2 in /proc/cpuinfo); "
                         "rlwb's V0 engine cannot be built on this machine")
    if not host_supports(isa):
        raise SystemExit(f"RLWB_V0_ISA={isa} but this CPU lacks it; use RLWB_V0_ISA=avx2")
    sdist = sdist_path(cache)
    facts = this_machine_facts(isa, hashlib.sha256(sdist.read_bytes()).hexdigest())
    key = wheel_key(facts)
    home = cache / "wheels" / f"vllm-{VLLM_VERSION}+cpu"
    slot = home / key
    found = sorted(slot.glob("*.whl")) if (slot / "key.json").exists() else []
    if found and not rebuild:
        log(f"using cached V0 wheel {found[0]} (key {key})")
        return found[0]
    others = [p.name for p in home.glob("*") if p.is_dir() and p.name != key]
    legacy = sorted((cache / "wheels").glob(f"vllm-{VLLM_VERSION}+cpu-*.whl"))
    if others or legacy:
        log(f"cached V0 wheels built for other machines or settings are ignored "
            f"({len(others) + len(legacy)} found; this machine's key is {key})")
    shutil.rmtree(slot, ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=home))
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    whl = build(sdist, work, isa, cache / "logs" / f"vllm-{VLLM_VERSION}-cpu-{key}-{stamp}.log")
    (work / "key.json").write_text(json.dumps({"key": key, "facts": facts, "built_at": stamp}, indent=2))
    work.rename(slot)  # atomic: a slot either holds a finished wheel with its key or does not exist
    return slot / whl.name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("ensure", help="print the cached wheel's path, building it if this machine has none")
    e.add_argument("cache", type=Path)
    e.add_argument("--rebuild", action="store_true", help="build even if a wheel with this key is cached")
    k = sub.add_parser("key", help="print the wheel key for the given facts (defaults: this machine)")
    k.add_argument("--torch")
    k.add_argument("--isa", default=os.environ.get("RLWB_V0_ISA", "avx2"))
    k.add_argument("--python", default=f"cp{sys.version_info[0]}{sys.version_info[1]}")
    k.add_argument("--machine", default=platform.machine())
    k.add_argument("--libc", default="-".join(platform.libc_ver()))
    k.add_argument("--compiler", default=None)
    k.add_argument("--sdist-sha256", default="unknown")
    x = sub.add_parser("explain-log", help="diagnose a failed build's log in one line")
    x.add_argument("log", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "ensure":
        print(ensure(a.cache, os.environ.get("RLWB_V0_ISA", "avx2"), rebuild=a.rebuild))
    elif a.cmd == "key":
        if a.torch is None:
            from importlib.metadata import version

            a.torch = version("torch")
        facts = wheel_facts(torch=a.torch, isa=a.isa, python=a.python, machine=a.machine, libc=a.libc,
                            compiler=a.compiler or compiler_version(), sdist_sha256=a.sdist_sha256,
                            build_vars=caller_build_vars(dict(os.environ)))
        print(json.dumps({"key": wheel_key(facts), "facts": facts}, indent=2))
    else:
        print(explain_log(a.log.read_text(errors="replace")) or "not a network failure")


if __name__ == "__main__":
    main()
