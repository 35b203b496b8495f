"""The benchmark-dose fit with the point fit's BLAS on one thread (`bmd_models._one_blas_thread`, since `aa91c25`)
against BLAS's own thread pool: a benchmark, not a test (docs/setup.md quotes it).

    .venv/bin/python scripts/bench_bmd_blas.py [--truth linear] [--studies 10] [--reps 2]

Each arm fits the same simulated coverage studies (`bmd_coverage.simulate_coverage`, the suite's coverage cells at
fewer studies: 10 seeds, 300 resamples); the arms alternate in one process (pool, one, pool, one, ...) so both see
the same load, and each repetition prints the load average beside its time. Prints per-arm seconds, the ratio
pool / one, and whether the two arms' coverage tallies are the same (the bitwise check of every bound is
`tests/test_bmd_models.py::test_the_polish_runs_blas_on_one_thread_and_fits_the_same_to_the_bit`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

from rlwb.core.measure import bmd_coverage as cov
from rlwb.core.measure import bmd_models as bm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truth", default="linear", choices=list(cov.TRUTHS))
    ap.add_argument("--studies", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    one = bm._one_blas_thread
    times: dict[str, list[float]] = {"pool": [], "one": []}
    tallies = {}
    for rep in range(args.reps):
        for arm, ctx in (("pool", contextlib.nullcontext), ("one", one)):
            bm._one_blas_thread = ctx
            t = time.perf_counter()
            c = cov.simulate_coverage(args.truth, seeds=10, studies=args.studies, n_boot=300, seed=4)
            times[arm].append(time.perf_counter() - t)
            tallies.setdefault(arm, (c.bounded, c.hits))
            print(f"rep {rep} {arm:4s} {times[arm][-1]:7.1f} s  load {os.getloadavg()[0]:.2f}  "
                  f"bounded {c.bounded} covered {c.hits}", flush=True)
    bm._one_blas_thread = one
    pool, single = sum(times["pool"]), sum(times["one"])
    print(f"{args.truth}, {args.studies} studies x {args.reps}: pool {pool:.1f} s, one thread {single:.1f} s, "
          f"ratio {pool / single:.2f}x; tallies the same: {tallies['pool'] == tallies['one']}")


if __name__ == "__main__":
    main()
