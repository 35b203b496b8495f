"""`rlwb compare` and `rlwb rerun`: drift, a run's metrics moving away from those of a reference run of the same
notebook and params (exit 1 on drift)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlwb.errors import RunFailed


def tolerance_options(r) -> None:
    """What counts as the same number (`math.isclose`), for every command that compares runs."""
    r.add_argument("--rtol", type=float, default=1e-6)
    r.add_argument("--atol", type=float, default=1e-9)


def add_compare(sub) -> None:
    r = sub.add_parser("compare", help="compare the metrics of two runs (exit 1 on drift)")
    r.add_argument("run_a")
    r.add_argument("run_b")
    tolerance_options(r)
    r.add_argument("--include-timing", action="store_true", help="let timing metrics fail the comparison too")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_compare)


def add_rerun(sub) -> None:
    r = sub.add_parser("rerun", help="rerun notebooks with their latest successful params and compare")
    r.add_argument("notebooks", nargs="*", help="stems (default: all notebooks)")
    r.add_argument("--outputs")
    r.add_argument("--compare-to", default="latest", metavar="latest|RUN_DIR",
                   help="latest (default): rerun each notebook's newest successful run and compare with it; RUN_DIR: "
                        "rerun that archived run (one notebook) and compare with it, e.g. a pinned reference")
    tolerance_options(r)
    r.set_defaults(fn=cmd_rerun)


def cmd_compare(a) -> int:
    from rlwb.reports.drift import compare, compare_table, drift_summary, dump_json, provenance_differences

    ok, rows = compare(a.run_a, a.run_b, a.rtol, a.atol, a.include_timing)
    prov = provenance_differences(a.run_a, a.run_b)
    if a.json:
        print(dump_json({"ok": ok, "rows": rows, "provenance": prov}))
    else:
        print(compare_table(rows))
        print(f"\n{drift_summary(ok, rows, prov)}\n(rtol={a.rtol:g}, atol={a.atol:g})")
    return 0 if ok else 1


def cmd_rerun(a) -> int:
    from rlwb import runner
    from rlwb.paths import outputs_dir
    from rlwb.registry import NOTEBOOKS
    from rlwb.reports.drift import compare, compare_table, drift_summary, provenance_differences, record_drift
    from rlwb.reports.index import build_index
    from rlwb.reports.rerun import latest_ok_run, reference_run

    root = outputs_dir(a.outputs)
    notebooks = [Path(n).stem for n in a.notebooks] or list(NOTEBOOKS)
    reference = None if a.compare_to == "latest" else reference_run(Path(a.compare_to), notebooks)
    status = 0
    for nb in notebooks:
        prev = reference or latest_ok_run(root, nb)
        if prev is None:
            print(f"== {nb}: no successful run to rerun; skipped", file=sys.stderr)
            continue
        print(f"== {nb}: rerunning {prev.name} with its resolved params", file=sys.stderr)
        try:
            new = runner.run(nb, [str(prev / "params.yaml")], None, root)
        except RunFailed as e:
            print(f"{nb}: rerun failed: {e.error}", file=sys.stderr)
            status = 1
            continue
        ok, rows = compare(prev, new, a.rtol, a.atol)
        print(compare_table(rows, only_interesting=True), file=sys.stderr)
        prov = provenance_differences(prev, new)
        record_drift(new, prev, ok, rows, prov)
        if prov:
            print(drift_summary(ok, rows, prov), file=sys.stderr)
        print(f"{nb}: {'no drift' if ok else 'DRIFT'} ({prev.name} -> {new.name})", file=sys.stderr)
        print(new)
        status |= 0 if ok else 1
    index = build_index(root)
    print(f"trends and every run: {index.as_uri()}#trends", file=sys.stderr)
    return status
