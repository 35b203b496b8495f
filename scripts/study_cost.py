"""What a notebook-08 study cost, and what its sequential seed rule saved: a benchmark, not a test.

Why: issue #58 asks for a study cheaper *per unit of information*, with its wall time and runs per hour before and
after. Two things set that cost: the speed of a run (GRPO runs per hour of wall time on the study's cores, and where
the time goes: run.json `time_s`) and the design (how many runs it takes to get the seeds where a level is decided).
This script prints both for each study run given, from its record and params, and nothing it did not measure:

- **runs, wall time, runs/h**: the training's own (a `--reanalyze` run's record carries the run that trained its
  data, `reanalysis.training`, with every part it resumed, `chain`); the wall time is the sum of the parts', the
  time between parts not counted.
- **where the time went**: `time_s` of the training run, as shares of its wall time (two runs train at once, so
  the phases' shares are of the sum over both).
- **the design's saving**: the sequential rule gives each dose row the seeds that decide it (`sequential/<row>/
  <arm>/seeds`); a fixed-n design that gives every row at least that many must run every row at the largest, so
  the ratio is `training_runs` at that n (no second pass) over the runs trained. It counts runs, not their cost
  (a 120-step or multi-epoch run costs more), and it is at equal seeds per decided row, not at equal power
  everywhere (the fixed-n design would have more seeds at the rows the first pass already decided).

    .venv/bin/python scripts/study_cost.py docs/runs/08_mismatch_cost/<run id> [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlwb import params
from rlwb.experiments.mismatch_study.design import training_runs

PHASES = ("sampling", "training", "weight_sync", "scoring", "engine_start", "other")


def training_record(run: Path) -> dict:
    """The record of what trained the run's data: its own, or, for a reanalysis, `reanalysis.training`."""
    rec = json.loads((run / "run.json").read_text())
    return (rec.get("reanalysis") or {}).get("training") or rec


def cost(run: Path) -> dict:
    t, m = training_record(run), json.loads((run / "metrics.json").read_text())
    p = params.load("08_mismatch_cost", [run / "params.yaml"])
    chain = t.get("chain") or [{"duration_s": t.get("duration_s")}]
    wall = sum(float(c["duration_s"]) for c in chain)
    jobs = int(t.get("jobs") or len(training_runs(p)))
    time_s = t.get("time_s") or {}
    total = sum(float(time_s.get(k, 0.0)) for k in PHASES) or float("nan")
    seeds = [int(v) for k, v in m.items() if k.startswith("sequential/") and k.endswith("/seeds")]
    most = max(seeds + [p.num_seeds])
    fixed = len(training_runs(params.load("08_mismatch_cost", [run / "params.yaml"],
                                          {"num_seeds": most, "max_seeds": 0})))
    return {"run": run.name, "trained_by": t.get("run_id", run.name), "jobs": jobs, "wall_s": wall, "parts": len(chain),
            "runs_per_h": jobs / wall * 3600, "shares": {k: float(time_s.get(k, 0.0)) / total for k in PHASES},
            "first_pass": len(training_runs(params.load("08_mismatch_cost", [run / "params.yaml"], {"max_seeds": 0}))),
            "most_seeds": most, "fixed_n_runs": fixed, "design_ratio": fixed / jobs if most > p.num_seeds else None,
            "model": p.model}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="notebook-08 run directories (a study or its reanalysis)")
    rows = [cost(Path(r)) for r in ap.parse_args().runs]
    print("| run | trained by | runs | wall (min, parts) | runs/h | sampling / training / sync / other | first pass | "
          "fixed n for the same seeds per decided row | design saving |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in rows:
        s = c["shares"]
        other = s["scoring"] + s["engine_start"] + s["other"]
        print(f"| {c['run']} | {c['trained_by']} | {c['jobs']} | {c['wall_s'] / 60:.0f} ({c['parts']}) | "
              f"{c['runs_per_h']:.0f} | {s['sampling']:.0%} / {s['training']:.0%} / {s['weight_sync']:.0%} / "
              f"{other:.0%} | {c['first_pass']} | "
              + (f"{c['fixed_n_runs']} at {c['most_seeds']} seeds | {c['design_ratio']:.2f}x |"
                 if c["design_ratio"] else f"(fixed n, {c['most_seeds']} seeds) | — |"))
    by_model: dict[str, list[dict]] = {}
    for c in rows:
        by_model.setdefault(c["model"], []).append(c)
    for model, rs in by_model.items():  # per model, in the order given: the later study against the earlier
        for a, b in zip(rs, rs[1:]):
            speed = b["runs_per_h"] / a["runs_per_h"]
            print(f"\n{model}: runs/h {b['run']} over {a['run']}: {speed:.2f}x (the designs' mixes of run lengths "
                  f"differ)" + (f"; per unit of information (the seeds each decided row got), with the design's saving: "
                                f"{speed * b['design_ratio']:.2f}x cheaper" if b["design_ratio"] else ""))


if __name__ == "__main__":
    main()
