"""Notebook 08's GRPO runs, timed: this checkout against a baseline commit, interleaved in one script run.

    PYTHONPATH=. .venv/bin/python scripts/bench_08_run.py [--baseline main] [--steps 30] [--reps 2] [--lanes 2]
    PYTHONPATH=. .venv/bin/python scripts/bench_08_run.py --profile    # one lane, two jobs, under cProfile

Each arm is a fresh process training the same representative mix of the study's jobs (`MIX`: real jobs of
params/08_mismatch_cost/study.yaml on the embedded default model, every kind of run the base engine trains) through
`execution.train_study`, the path `rlwb run notebooks/08_mismatch_cost.ipynb` takes, with `concurrent_runs` lanes.
Arm A is the baseline's code (`git archive <baseline> rlwb` into a temporary directory), arm B this checkout's; they
run A, B, A, B, ..., so that both see the same load on a shared machine (the load average is printed beside every
timing). Per arm: wall seconds, the per-phase split (`rlwb.timing`), the mean per-step `t_*` columns, and the runs
per hour of the mix; then B / A per phase, and whether every curve is bitwise the baseline's (bar wall-time columns).

`--profile`: where one run's time goes, this checkout alone: two jobs of the mix (a clean run and a stale dose with
TIS) on one lane, nothing beside them, under cProfile: the mean per-step `t_*` columns, the phases, and the
functions with the most cumulative time (the engine's work shows as the trainer waiting on its worker's pipe).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (label, arm, seed) of study jobs: clean runs, ratio doses, a weights dose in each PPO regime, a stale dose,
# a placebo: the base engine's kinds of run in about the study's proportions (engine points need other engines).
# Twelve, so that 2, 3 and 4 lanes all end on a full round (--b-lanes compares lane counts without a ragged tail)
MIX = [("clean", "none@engine", 0), ("clean", "tis@trainer", 1), ("ratio@0.1", "verl.geo_rs@trainer", 0),
       ("ratio@1", "none@engine", 1), ("weights@0.03", "icepop@trainer", 0), ("weights@0.1+ppo4", "none@trainer", 1),
       ("stale@1", "tis@trainer", 0), ("placebo", "none@engine", 0), ("clean", "none@engine", 2),
       ("ratio@1", "none@engine", 2), ("weights@0.03", "none@engine", 2), ("stale@1", "tis@trainer", 2)]
T_COLS = ["t_rollout", "t_score", "t_update", "t_sync", "t_step"]
PROFILED = [MIX[0], MIX[6]]  # --profile: a clean run and a stale dose with TIS


def child(args) -> None:
    """One arm: train the mix through `train_study` and write what the parent compares."""
    from rlwb import params, timing
    from rlwb.core.models.store import build_default_model
    from rlwb.experiments.mismatch_study import design, execution

    p = params.load("08_mismatch_cost", [str(ROOT / "params/08_mismatch_cost/study.yaml")],
                    {"steps": args.steps, "concurrent_runs": args.lanes})
    wanted = set(PROFILED if args.profile else MIX)
    mix = [j for j in design.training_runs(p) if (j.label, j.arm, j.seed) in wanted]
    assert len(mix) == len(wanted), f"the mix names jobs the study does not have: {len(mix)} of {len(wanted)}"
    execution.training_runs = lambda _p: mix
    model = build_default_model(progress=False)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        prof.enable()
        curves, _, total = execution.train_study(p, model.path, progress=False)
        prof.disable()
        print(f"{total} runs, one lane, {time.perf_counter() - t0:.1f} s; phases (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in timing.totals().items() if v)
              + f"; load average {load0[0]:.2f} -> {os.getloadavg()[0]:.2f} (other work on the cores shows here)")
        print("mean per step (s): " + ", ".join(f"{k[2:]} {v:.3f}" for k, v in curves[T_COLS].mean().items()))
        print(f"steps: {len(curves)}")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        return
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    curves, _, total = execution.train_study(p, model.path, progress=False)
    wall = time.perf_counter() - t0
    curves.to_parquet(args.out + ".parquet")
    steps = curves.groupby(["label", "arm", "seed"])[T_COLS].mean().mean().to_dict()
    Path(args.out).write_text(json.dumps({"wall_s": wall, "runs": total, "phases": timing.totals(),
                                          "t_mean": steps, "load": [load0, os.getloadavg()]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=None, help="commit-ish of arm A (default: where this branch left main, "
                    "git merge-base HEAD main)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=2, help="A, B pairs")
    ap.add_argument("--lanes", type=int, default=2, help="concurrent_runs")
    ap.add_argument("--b-lanes", type=int, default=None,
                    help="concurrent_runs of arm B only (an experiment: more lanes than cores); default --lanes")
    ap.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for arm B only (an experiment: OMP_WAIT_POLICY=PASSIVE)")
    ap.add_argument("--profile", action="store_true", help="profile two jobs on one lane instead (no A/B)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.profile:
        args.lanes = 1
        return child(args)
    import pandas as pd

    tmp = Path(tempfile.mkdtemp(prefix="bench08-"))
    base = tmp / "baseline"
    base.mkdir()
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()

    args.baseline = args.baseline or git("merge-base", "HEAD", "main")
    sha = git("rev-parse", "--short", args.baseline)
    # its code, params and engine scripts; the engines' environments are this checkout's (the same interpreters)
    subprocess.run(f"git archive {args.baseline} rlwb params engines | tar -x -C {base}", shell=True, cwd=ROOT,
                   check=True)
    for env in (".venv", ".venvs"):
        if (ROOT / env).exists():
            (base / env).symlink_to((ROOT / env).resolve())
    print(f"A: {args.baseline} ({sha}), B: this checkout ({ROOT}); {len(MIX)} jobs x {args.steps} steps, "
          f"{args.lanes} lanes (B: {args.b_lanes or args.lanes}), {args.reps} A/B pairs", flush=True)
    results: dict[str, list[dict]] = {"A": [], "B": []}
    for rep in range(args.reps):
        for arm, path in (("A", base), ("B", ROOT)):
            out = tmp / f"{arm}{rep}.json"
            env = {**os.environ, "PYTHONPATH": str(path), **(dict(kv.split("=", 1) for kv in args.b_env)
                                                                if arm == "B" else {})}
            cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            with open(tmp / f"{arm}{rep}.log", "w") as log:
                lanes = args.b_lanes if arm == "B" and args.b_lanes else args.lanes
                subprocess.run([sys.executable, __file__, "--child", "--out", str(out), "--steps", str(args.steps),
                                "--lanes", str(lanes)], env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                               stderr=log)
            cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            r = json.loads(out.read_text())
            # CPU seconds of the arm's whole process tree (trainer and engine workers): on a saturated machine the
            # runs per hour are the cores over this, whatever the others' load does to the wall time
            r["cpu_s"] = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
            r["curves"] = pd.read_parquet(str(out) + ".parquet")
            results[arm].append(r)
            ph = r["phases"]
            print(f"rep {rep} {arm}: wall {r['wall_s']:7.1f} s, {3600 * r['runs'] / r['wall_s']:6.1f} runs/h, "
                  f"cpu {r['cpu_s']:7.1f} s | "
                  + " ".join(f"{k} {ph.get(k, 0):6.1f}" for k in ("engine_start", "sampling", "scoring", "training",
                                                                  "weight_sync"))
                  + " | per step " + " ".join(f"{k[2:]} {v:.3f}" for k, v in r["t_mean"].items())
                  + f" | load {r['load'][0][0]:.2f} -> {r['load'][1][0]:.2f}", flush=True)
    a, b = results["A"], results["B"]

    def mean(rs, f):
        return sum(f(r) for r in rs) / len(rs)

    print("\nmean over reps (B / A):")
    for k in ("wall_s", "cpu_s"):
        print(f"  {k:12s} A {mean(a, lambda r: r[k]):7.1f}  B {mean(b, lambda r: r[k]):7.1f}  "
              f"ratio {mean(b, lambda r: r[k]) / mean(a, lambda r: r[k]):.3f}")
    for k in ("sampling", "scoring", "training", "weight_sync"):
        va, vb = mean(a, lambda r: r["phases"].get(k, 0)), mean(b, lambda r: r["phases"].get(k, 0))
        print(f"  {k:12s} A {va:7.1f}  B {vb:7.1f}  ratio {vb / va if va else float('nan'):.3f}")
    for k in T_COLS:
        va, vb = mean(a, lambda r: r["t_mean"][k]), mean(b, lambda r: r["t_mean"][k])
        print(f"  {k:12s} A {va:7.3f}  B {vb:7.3f}  ratio {vb / va:.3f}")
    ra, rb = mean(a, lambda r: r["runs"] / r["wall_s"]) * 3600, mean(b, lambda r: r["runs"] / r["wall_s"]) * 3600
    print(f"  runs/hour    A {ra:7.1f}  B {rb:7.1f}  speed-up {rb / ra:.3f}")
    ca, cb = a[0]["curves"], b[0]["curves"]
    # the lane count is a column of its own (it differs by construction when --b-lanes is given)
    lanes_differ = args.b_lanes not in (None, args.lanes)
    same = [c for c in ca.columns if not c.startswith("t_") and c in cb.columns
            and not (c == "concurrent_runs" and lanes_differ)]
    extra = sorted(set(ca.columns) ^ set(cb.columns))
    eq = ca[same].equals(cb[same])
    but = "t_* and concurrent_runs" if lanes_differ else "t_*"
    print(f"\ncurves bitwise equal A vs B (every column but {but}): {eq}" + (f"; columns only one has: {extra}"
                                                                           if extra else ""))
    if not eq:
        diff = [c for c in same if not ca[c].equals(cb[c])]
        print("  differing columns:", diff)
    sys.exit(0 if eq else 1)


if __name__ == "__main__":
    main()
