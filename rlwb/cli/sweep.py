"""`rlwb sweep`: a grid of parameter overrides for one notebook, each cell an archived run."""

from __future__ import annotations

import sys
from pathlib import Path

from rlwb.errors import ParamError


def add_sweep(sub) -> None:
    r = sub.add_parser("sweep", help="a grid of parameter overrides for one notebook, each cell an archived run, "
                                     "plus a summary (grid format: rlwb/sweep.py)")
    r.add_argument("grid", help="grid YAML, e.g. params/sweeps/k3_vs_temperature.yaml")
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs)")
    r.add_argument("--ray", metavar="ADDRESS", help="run the cells as Ray tasks on an existing cluster "
                                                    "(auto: the cluster this machine belongs to)")
    r.add_argument("--resume", nargs="?", const="latest", metavar="SWEEP_DIR",
                   help="run only the cells without a successful run (default: the newest sweep of this grid)")
    r.set_defaults(fn=cmd_sweep)


def cmd_sweep(a) -> int:
    from rlwb import sweep
    from rlwb.archive import check_writable
    from rlwb.paths import outputs_dir

    root = outputs_dir(a.outputs)
    check_writable(root)
    resume = None
    if a.resume:
        resume = sweep.latest_sweep_dir(root, Path(a.grid)) if a.resume == "latest" else Path(a.resume)
        if resume is None:
            raise ParamError(f"--resume: no earlier sweep of {a.grid} under {root / 'sweeps'}")
    try:
        sweep_dir = sweep.run_sweep(a.grid, root, resume=resume, ray_address=a.ray)
    except KeyboardInterrupt:
        last = resume or sweep.latest_sweep_dir(root, Path(a.grid))
        state = sweep.read_state(last) if last else {"cells": []}
        done = sum(c["status"] == "ok" for c in state["cells"])
        print(f"rlwb sweep: interrupted; {done} of {len(state['cells'])} cells archived in {last}. "
              f"Run the rest with: rlwb sweep {a.grid} --resume", file=sys.stderr)
        return 130
    state = sweep.read_state(sweep_dir)
    failed = [c for c in state["cells"] if c["status"] != "ok"]
    print(f"{len(state['cells']) - len(failed)} of {len(state['cells'])} cells ok; summary: "
          f"{sweep_dir / 'report.html'}", file=sys.stderr)
    print(sweep_dir)
    return 1 if failed else 0
