"""`rlwb runs` and `rlwb times`: what is archived, and where each notebook's wall time goes."""

from __future__ import annotations

import json

from rlwb.formatting import number, text_table


def cmd_runs(a) -> int:
    from rlwb.archive import list_runs
    from rlwb.paths import outputs_dir
    from rlwb.registry import headline

    runs = list_runs(outputs_dir(a.outputs))
    if a.notebook:
        runs = [r for r in runs if r["notebook"] == a.notebook]
    if a.json:
        print(json.dumps(runs, indent=2, default=str))
        return 0
    rows = [("notebook", "run id", "status", "duration_s", "headline")]
    for r in runs:
        keys = headline(r["notebook"])[:1]
        head = ", ".join(f"{k}={number(r['metrics'].get(k))}" for k in keys)
        rows.append((r["notebook"], r["run_id"], r.get("status", "?"), number(r.get("duration_s")), head))
    print(text_table(rows, "<<<<<", rstrip=True))
    if len(rows) == 1:
        print("(no runs archived yet)")
    return 0


def cmd_times(a) -> int:
    from rlwb.archive import list_runs
    from rlwb.paths import outputs_dir
    from rlwb.reports.times import time_table

    rows = time_table(list_runs(outputs_dir(a.outputs)), since=a.since)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("(no finished runs" + (f" since {a.since})" if a.since else ")"))
        return 0
    cols = list(rows[0])
    table = [cols] + [[r["notebook"], r["run_id"]] + [("–" if r[c] is None else f"{r[c]:.0f}") for c in cols[2:]]
                      for r in rows]
    print("seconds of wall time per phase, latest finished run of each notebook")
    print(text_table(table, "<<" + ">" * (len(cols) - 2)))
    return 0
