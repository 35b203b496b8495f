"""`rlwb runs`, `rlwb times`, `rlwb index`: what is archived, where each notebook's wall time goes, and the index page
of every run."""

from __future__ import annotations

import json

from rlwb.formatting import number, text_table


def add_runs(sub) -> None:
    r = sub.add_parser("runs", help="list archived runs")
    r.add_argument("--outputs")
    r.add_argument("--notebook", help="only this notebook stem")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_runs)


def add_times(sub) -> None:
    r = sub.add_parser("times", help="wall time per phase (engine start-up, sampling, scoring, training, ...) of "
                                     "the latest run of each notebook")
    r.add_argument("--outputs")
    r.add_argument("--since", help="only runs started at or after this UTC time (ISO, e.g. 2026-11-23T05:00)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_times)


def add_index(sub) -> None:
    r = sub.add_parser("index", help="write <outputs>/index.html")
    r.add_argument("--outputs")
    r.set_defaults(fn=cmd_index)


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


def cmd_index(a) -> int:
    from rlwb.paths import outputs_dir
    from rlwb.reports.index import build_index

    print(build_index(outputs_dir(a.outputs)))
    return 0
