"""What a notebook-08 study cost, and what its sequential seed rule saved: a benchmark, not a test.

Why: issue #58 asks for a study cheaper *per unit of information*, with its wall time and runs per hour before and
after. Two things set that cost: the speed of a run (GRPO runs per hour of wall time on the study's cores, and where
the time goes: run.json `time_s`) and the design (how many runs it takes to get the seeds where a level is decided).
This script prints both for each study run given, from its record and params, and nothing it did not measure:

- **runs, wall time, runs/h, CPU**: the training's own (`archive.training_record`; a `--reanalyze` run's record
  carries it as `reanalysis.training`), the wall time summed over the parts it resumed (`chain`), the time between
  parts not counted. Runs/h compare like for like only on the same CPU and the same mix of run lengths.
- **where the time went**: `time_s` of the run that finished the training, as shares of its wall time
  (`rlwb/timing.py` gives each of k concurrent runs 1/k of the clock, so the phases add up to the wall time). For a
  study resumed in parts this is the last part's split only: the record keeps no other.
- **the design's saving**: the sequential rule gives each dose row of a benchmark fit, and its clean twins, the
  seeds that decide it (`sequential/<row>/<arm>/seeds`, up to `max_seeds`); engine points, placebo streams and the
  controls stay at the first pass's seeds. A fixed-n design that gives every row the rule could extend the most
  seeds it gave any (it cannot know which beforehand) trains `fixed_n_runs`; the ratio is that over the runs trained.
  It counts runs, not their cost (a 120-step or multi-epoch run costs more), and it is at equal seeds per decided
  row, not equal power: the rule's rows are tested by the two-look test, whose power at those seeds is below a
  fixed-n t test's (`sequential/<row>/<arm>/power_two_look`), so the ratio is an upper bound on the saving.

    .venv/bin/python scripts/study_cost.py docs/runs/08_mismatch_cost/<run id> [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlwb import archive, params
from rlwb.core.rl.mismatch_doses import dose_kinds
from rlwb.experiments.mismatch_study.design import training_runs

PHASES = ("sampling", "training", "weight_sync", "scoring", "engine_start", "other")


def training_record(run: Path) -> dict:
    """What trained the run's data: a reanalysis's `reanalysis.training`, else the run's own record's."""
    rec = archive.read_record(run, {}) or {}
    return (rec.get("reanalysis") or {}).get("training") or archive.training_record(run, rec)


def extendable(p, r) -> bool:
    """Could the sequential rule give this run's row more seeds? A dose row (a kind of mismatch at a dose) or a
    clean twin at the study's temperature; not an engine point, a placebo stream or a control."""
    return r.kind in {k.name for k in dose_kinds()} or (r.kind == "clean" and r.temperature == p.temperature)


def cost(run: Path) -> dict:
    t, m = training_record(run), json.loads((run / "metrics.json").read_text())
    file = [run / "params.yaml"]
    p = params.load("08_mismatch_cost", file)
    chain = t.get("chain") or [{"duration_s": t.get("duration_s")}]
    wall = sum(float(c["duration_s"]) for c in chain)
    first = training_runs(params.load("08_mismatch_cost", file, {"max_seeds": 0}))
    jobs = int(t.get("jobs") or len(first))
    time_s = t.get("time_s") or {}
    total = sum(float(time_s.get(k, 0.0)) for k in PHASES) or float("nan")
    seeds = [int(v) for k, v in m.items() if k.startswith("sequential/") and k.endswith("/seeds")]
    most = max(seeds + [p.num_seeds])
    wide = training_runs(params.load("08_mismatch_cost", file, {"num_seeds": most, "max_seeds": 0}))
    fixed = sum(extendable(p, r) for r in wide) + sum(not extendable(p, r) for r in first)
    return {"run": run.name, "trained_by": t.get("run_id", run.name), "jobs": jobs, "wall_s": wall, "parts": len(chain),
            "runs_per_h": jobs / wall * 3600, "shares": {k: float(time_s.get(k, 0.0)) / total for k in PHASES},
            "host": t.get("host") or "?", "first_pass": len(first), "most_seeds": most, "fixed_n_runs": fixed,
            "design_ratio": fixed / jobs if most > p.num_seeds else None, "model": p.model}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="notebook-08 run directories (a study or its reanalysis)")
    rows = [cost(Path(r)) for r in ap.parse_args().runs]
    print("| run | trained by | CPU | runs | wall (min, parts) | runs/h | sampling / training / sync / other (last "
          "part) | first pass | fixed n, the same seeds per decided row | design saving (at most) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in rows:
        s = c["shares"]
        other = s["scoring"] + s["engine_start"] + s["other"]
        print(f"| {c['run']} | {c['trained_by']} | {c['host']} | {c['jobs']} | {c['wall_s'] / 60:.0f} ({c['parts']}) | "
              f"{c['runs_per_h']:.0f} | {s['sampling']:.0%} / {s['training']:.0%} / {s['weight_sync']:.0%} / "
              f"{other:.0%} | {c['first_pass']} | "
              + (f"{c['fixed_n_runs']} at {c['most_seeds']} seeds | {c['design_ratio']:.2f}x |"
                 if c["design_ratio"] else f"(fixed n, {c['most_seeds']} seeds) | — |"))
    by_model: dict[str, list[dict]] = {}
    for c in rows:
        by_model.setdefault(c["model"], []).append(c)
    for model, rs in by_model.items():  # per model, in the order given: the later study against the earlier
        for a, b in zip(rs, rs[1:]):
            same = a["host"] == b["host"]
            print(f"\n{model}: runs/h {b['run']} over {a['run']}: {b['runs_per_h'] / a['runs_per_h']:.2f}x, not like "
                  f"for like: " + ("" if same else f"another CPU ({a['host']}, then {b['host']}); ")
                  + "another mix of run lengths")


if __name__ == "__main__":
    main()
