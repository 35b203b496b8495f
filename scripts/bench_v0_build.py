"""The V0 wheel's build with and without debug info, in one run (a benchmark, not a test).

Why: `make setup` from an empty cache waits on the vLLM 0.8.5 build, the longest chain of the setup that CI times.
vLLM builds RelWithDebInfo (-O2 -g); `scripts/vllm_v0_wheel.py` compiles with -g0 last
(`scripts/cxx_without_debug_info.sh`). This builds the cached sdist both ways, alternating, and prints each build's
wall time, the ratio, the wheels' sizes and whether the compiled kernels are the same machine code (the `.text`
section of `vllm/_C.abi3.so`; `.rodata` differs between any two builds, since it holds source paths under pip's
random build directory). Run it with the V0 environment's interpreter on idle cores:

    .venvs/vllm-v0/bin/python scripts/bench_v0_build.py [--pairs 2] [--cache ~/.cache/rlwb]

Each pair builds both ways, the first pair with debug info first, the next without first, and so on; the ratio is
of each setting's fastest build.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_v0_wheel  # noqa: E402  (a script beside this one, not a package)


def text_sha(wheel: Path, workdir: Path) -> str:
    """sha256 of the `.text` section of the wheel's `vllm/_C.abi3.so`: the kernels' machine code."""
    so = workdir / f"{wheel.parent.name}-_C.abi3.so"
    with zipfile.ZipFile(wheel) as z:
        so.write_bytes(z.read("vllm/_C.abi3.so"))
    text = workdir / f"{so.name}.text"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.text", str(so), str(text)], check=True)
    return hashlib.sha256(text.read_bytes()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="builds per setting, their order alternated (default 2)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("RLWB_CACHE", "~/.cache/rlwb")).expanduser())
    args = ap.parse_args(argv)
    sdist = vllm_v0_wheel.sdist_path(args.cache)
    times: dict[bool, list[float]] = {True: [], False: []}
    shas, sizes = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-v0-build-") as tmp:
        work = Path(tmp)
        for i in range(args.pairs):
            for debug_info in ((True, False) if i % 2 == 0 else (False, True)):
                dest = work / f"{'g' if debug_info else 'g0'}-{i}"
                t0 = time.perf_counter()
                whl = vllm_v0_wheel.build(sdist, dest, "avx2", work / f"{dest.name}.log", debug_info=debug_info)
                times[debug_info].append(time.perf_counter() - t0)
                print(f"pair {i + 1}: {'with' if debug_info else 'without'} debug info "
                      f"{times[debug_info][-1]:.0f} s", flush=True)
                shas.setdefault(debug_info, set()).add(text_sha(whl, work))
                sizes[debug_info] = whl.stat().st_size
    with_g, without = min(times[True]), min(times[False])
    print(f"build with debug info (vLLM's RelWithDebInfo): {', '.join(f'{t:.0f}' for t in times[True])} s, "
          f"wheel {sizes[True] / 1e6:.1f} MB")
    print(f"build without (-g0 last):                      {', '.join(f'{t:.0f}' for t in times[False])} s, "
          f"wheel {sizes[False] / 1e6:.1f} MB")
    print(f"ratio (fastest of each): {with_g / without:.2f}x faster without; wheel {sizes[True] / sizes[False]:.1f}x "
          "smaller")
    same = shas[True] == shas[False] and len(shas[True]) == 1
    hashes = ", ".join(sorted(shas[True] | shas[False]))
    print(f"_C.abi3.so .text: {'the same bytes' if same else 'DIFFERS'} ({hashes})")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
