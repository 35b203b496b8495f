"""rlwb.timing: exclusive phase times, the run's split, and `rlwb times`' table (real runs: test_notebooks)."""

import pytest

from rlwb import timing
from rlwb.reports.times import time_table


def test_nested_phases_count_exclusive_time(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    timing.reset()
    with timing.phase("training"):
        clock[0] += 5
        with timing.phase("weight_sync"):
            clock[0] += 2
        clock[0] += 1
    assert timing.totals()["training"] == 6 and timing.totals()["weight_sync"] == 2  # the inner 2 s counted once
    assert timing.totals()["sampling"] == 0 and set(timing.totals()) == set(timing.PHASES)
    with pytest.raises(ValueError, match="unknown timing phase"), timing.phase("lunch"):
        pass
    timing.reset()


def test_split_adds_the_report_and_calls_the_rest_other():
    s = timing.split({"engine_start": 20.0, "sampling": 5.0, "archiving": 1.0}, total_s=40.0, report_s=3.0)
    assert s["archiving"] == 4.0 and s["other"] == 11.0 and s["total"] == 40.0
    assert sum(v for k, v in s.items() if k != "total") == pytest.approx(40.0)


def test_time_table_takes_the_latest_finished_run_per_notebook():
    runs = [  # newest first, as archive.list_runs returns them
        {"notebook": "01_x", "run_id": "b", "status": "failed", "started_at": "2026-11-23T05:00:00Z"},
        {"notebook": "01_x", "run_id": "a", "status": "ok", "started_at": "2026-11-23T04:00:00Z",
         "time_s": timing.split({"sampling": 2.0}, 10.0, 1.0)},
        {"notebook": "00_y", "run_id": "c", "status": "ok", "started_at": "2026-11-22T04:00:00Z", "duration_s": 7.0},
    ]
    rows = time_table(runs)
    assert [r["run_id"] for r in rows] == ["c", "a", ""] and rows[1]["sampling"] == 2.0
    assert rows[-1]["total"] == 17.0 and rows[-1]["sampling"] is None  # an older run has no split
    assert [r["run_id"] for r in time_table(runs, since="2026-11-23T00:00:00")] == ["a", ""]


def test_overlapping_threads_share_the_wall_clock(monkeypatch):
    """Two threads each inside a phase for the same 4 s: 2 s each, so the split never exceeds the wall time."""
    import threading

    clock = [100.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    timing.reset()
    entered, leave = threading.Event(), threading.Event()

    def other():
        with timing.phase("sampling"):
            entered.set()
            leave.wait(5)

    with timing.phase("training"):
        clock[0] += 1  # alone: 1 s to training
        t = threading.Thread(target=other)
        t.start()
        entered.wait(5)
        clock[0] += 4  # both inside a phase: 2 s each
        leave.set()
        t.join()
        clock[0] += 1  # alone again
    got = timing.totals()
    assert got["training"] == 4 and got["sampling"] == 2 and sum(got.values()) == 6
    timing.reset()
