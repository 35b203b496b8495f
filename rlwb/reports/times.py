"""`rlwb times`: wall time per phase of the latest finished run of each notebook."""

from __future__ import annotations


def time_table(runs: list[dict], since: str | None = None) -> list[dict]:
    """The latest finished run of each notebook (started at or after `since`, an ISO UTC time, when given):
    its wall time split by phase (`time_s` in run.json; runs archived before the split have the total only),
    then a total row. Rows are dicts: notebook, run_id, then the phases of `rlwb.timing`, other and total. Bench runs
    (`rlwb bench`) are not notebooks: the total is what the notebooks' runs took (`make reports`)."""
    from rlwb.archive import BENCH
    from rlwb.timing import PHASES

    latest: dict[str, dict] = {}
    for r in runs:  # newest first
        if r["notebook"] == BENCH or r.get("status") != "ok" or r["notebook"] in latest or \
                (since and (r.get("started_at") or "") < since):
            continue
        latest[r["notebook"]] = r
    cols = [*PHASES, "other", "total"]
    rows = []
    for nb in sorted(latest):
        r = latest[nb]
        split = r.get("time_s") or {"total": r.get("duration_s")}
        rows.append({"notebook": nb, "run_id": r["run_id"], **{c: split.get(c) for c in cols}})
    if rows:
        rows.append({"notebook": "all", "run_id": "", **{c: (sum(x[c] for x in rows) if all(x[c] is not None
                                                               for x in rows) else None) for c in cols}})
    return rows
