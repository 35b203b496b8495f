"""`rlwb figures`, `compare`, `index`, `rerun`: figures from data/ alone, runs against runs, the index page."""

from __future__ import annotations

import sys
from pathlib import Path

from rlwb.errors import RunFailed


def cmd_figures(a) -> int:
    from rlwb.reports.figures import regenerate_figures

    for path in regenerate_figures(a.run_dir, a.style):
        print(path)
    return 0


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


def cmd_index(a) -> int:
    from rlwb.paths import outputs_dir
    from rlwb.reports.index import build_index

    print(build_index(outputs_dir(a.outputs)))
    return 0


def cmd_rerun(a) -> int:

    from rlwb import runner
    from rlwb.paths import NOTEBOOKS_DIR, outputs_dir
    from rlwb.reports.drift import compare, compare_table, drift_summary, provenance_differences, record_drift
    from rlwb.reports.index import build_index
    from rlwb.reports.rerun import latest_ok_run, reference_run

    root = outputs_dir(a.outputs)
    notebooks = [Path(n).stem for n in a.notebooks] or sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9]*.ipynb"))
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
