"""The queue that makes the suite's expensive CLI runs ahead (tests/background.py): a job's commands run in order at
low priority with the environment of collection time, stop at the first failure, a job that cannot start does not
stop the queue, a test's wait moves its job to the front, and the end of a session leaves no process and no cgroup
behind. Plain `python -c` commands stand in for `rlwb run`: what is checked is the queue."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from tests import background
from tests.background import Background
from tests.conftest import REPO, pids_alive

PY = sys.executable
WHERE = "import os; print(os.nice(0), os.environ.get('RLWB_PROBE'), open('/proc/self/cgroup').read())"


def test_a_job_runs_in_order_at_low_priority_and_stops_at_the_first_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(background, "MIN_AVAILABLE_GIB", 0)  # whatever the rest of the session holds
    monkeypatch.setattr(background, "YIELD_BELOW_GIB", 0)
    monkeypatch.setenv("RLWB_PROBE", "collection")
    bg = Background(REPO, tmp_path)
    monkeypatch.setenv("RLWB_PROBE", "set by a running test")  # never reaches a run
    try:
        bg.add("ok", lambda d: [([PY, "-c", WHERE], {}), ([PY, "-c", "print('second')"], {})], tmp_path / "ok")
        bg.add("fails", lambda d: [([PY, "-c", "import sys; sys.exit('broken')"], {}),
                                   ([PY, "-c", "print('never')"], {})], tmp_path / "fails")
        bg.add("cannot start", lambda d: [([str(tmp_path / "no-such-program")], {})], tmp_path / "cannot")
        bg.add("after it", lambda d: [([PY, "-c", "print('still runs')"], {})], tmp_path / "after")
        bg.start()
        ok, fails, cannot, after = (waited(bg, n) for n in ("ok", "fails", "cannot start", "after it"))
        assert [r.returncode for r in ok.results] == [0, 0] and ok.results[1].stdout == "second\n"
        nice, probe, cgroups = ok.results[0].stdout.split(" ", 2)
        assert probe == "collection"
        if bg.cgroup is not None:  # its own cgroup under the queue's, whose CPU share is SHARES
            assert any(line.split(":", 2)[1:] == ["cpu", f"/{bg.cgroup.name}/job-0"] for line in cgroups.splitlines())
            assert (bg.cgroup / "cpu.shares").read_text().strip() == str(background.SHARES)
            assert int(nice) == os.nice(0)
        else:
            assert int(nice) == 19
        assert [r.returncode for r in fails.results] == [1] and "broken" in fails.results[0].stderr
        assert isinstance(cannot.error, FileNotFoundError) and not cannot.results
        assert after.results[0].stdout == "still runs\n"
        assert bg.wait("not queued") is None
    finally:
        bg.close()


def test_a_waited_job_jumps_the_queue_and_closing_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(background, "MIN_AVAILABLE_GIB", 0)
    monkeypatch.setattr(background, "YIELD_BELOW_GIB", 0)
    bg = Background(REPO, tmp_path)
    pid_file = tmp_path / "pid"
    # the first job starts a grandchild in a session of its own (as papermill's kernel and rlwb's workers do)
    bg.add("long", lambda d: [([PY, "-c", "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
                                "'import time; time.sleep(600)'], start_new_session=True); "
                                f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)"], {})],
           tmp_path / "long")
    bg.add("queued", lambda d: [([PY, "-c", "print('queued')"], {})], tmp_path / "queued")
    bg.add("urgent", lambda d: [([PY, "-c", "print('urgent')"], {})], tmp_path / "urgent")
    cgroup, grandchild = bg.cgroup, None
    waiter_saw: list = []
    try:
        bg.start()
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        grandchild = int(pid_file.read_text())
        assert bg.queue == ["queued", "urgent"]
        waiter = threading.Thread(target=lambda: waiter_saw.append(_wait_or_error(bg, "urgent")), daemon=True)
        waiter.start()
        deadline = time.monotonic() + 10
        while bg.queue != ["urgent", "queued"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bg.queue == ["urgent", "queued"]  # moved to the front while "long" still runs
    finally:
        bg.close()
    try:
        assert bg.jobs["long"].results[0].returncode != 0  # stopped, not finished
        waiter.join(timeout=30)
        assert waiter_saw and isinstance(waiter_saw[0], RuntimeError), waiter_saw  # told, not left waiting
        if cgroup is not None:  # the cgroup holds the grandchild however it detached, and is removed with it
            deadline = time.monotonic() + 10
            while pids_alive([grandchild]) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not pids_alive([grandchild]) and not Path(cgroup).exists()
    finally:  # without a cgroup the detached grandchild is its parent's to stop (rlwb run stops its workers)
        if grandchild is not None and pids_alive([grandchild]):
            os.kill(grandchild, signal.SIGKILL)


MARK_AND_SLEEP = ("import pathlib, sys, time; d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True); "
                  "(d / 'marker').write_text('x'); time.sleep(3); print(d)")


def test_a_run_no_test_waits_on_leaves_memory_to_the_tests(tmp_path, monkeypatch):
    """Free memory below YIELD_BELOW_GIB kills a run no test waits on; it does not start again by itself (no loop of
    restarts) nor holds up the jobs behind it, the job a test waits on runs although the stopped one is in front of
    it, and once its own test waits
    the stopped run is made from scratch in a fresh folder (the killed attempt's files stay out of the way)."""
    monkeypatch.setattr(background, "MIN_AVAILABLE_GIB", 0)
    monkeypatch.setattr(background, "YIELD_BELOW_GIB", 0)
    bg = Background(REPO, tmp_path)
    try:
        bg.add("big", lambda d: [([PY, "-c", MARK_AND_SLEEP, str(d)], {})], tmp_path / "big")
        bg.add("waited", lambda d: [([PY, "-c", "print('waited')"], {})], tmp_path / "waited")
        bg.add("next", lambda d: [([PY, "-c", "print('next')"], {})], tmp_path / "next")
        bg.start()
        deadline = time.monotonic() + 60
        while not (tmp_path / "big" / "marker").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        result: list = []
        waiter = threading.Thread(target=lambda: result.append(_wait_or_error(bg, "waited")), daemon=True)
        waiter.start()  # a test waits on the second job while the first runs
        time.sleep(0.5)
        monkeypatch.setattr(background, "YIELD_BELOW_GIB", float("inf"))  # now the tests need the memory
        deadline = time.monotonic() + 30
        while bg.jobs["big"].yielded == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        monkeypatch.setattr(background, "YIELD_BELOW_GIB", 0)  # memory is free again (and MIN_AVAILABLE_GIB is 0)
        waiter.join(timeout=30)
        assert result and result[0].results[0].stdout == "waited\n"
        deadline = time.monotonic() + 30  # the job behind the stopped one is not held up by it
        while not bg.jobs["next"].done.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bg.jobs["next"].results[0].stdout == "next\n"
        time.sleep(2.5)  # yet the stopped job waits for its test: no loop of restarts
        with bg.lock:
            assert bg.jobs["big"].yielded == 1 and bg.queue == ["big"] and bg.jobs["big"].started is None
            assert not bg.jobs["big"].done.is_set()
        job = waited(bg, "big")  # its test waits: it runs, whatever the memory, to the end
        assert job.yielded == 1 and job.dir == tmp_path / "big.retry1"
        assert [r.stdout for r in job.results] == [f"{tmp_path / 'big.retry1'}\n"]
        assert (tmp_path / "big" / "marker").exists()
    finally:
        bg.close()


def waited(bg: Background, name: str, timeout: float = 60):
    """bg.wait(name), failing after `timeout` s instead of hanging the suite."""
    result: list = []
    t = threading.Thread(target=lambda: result.append(_wait_or_error(bg, name)), daemon=True)
    t.start()
    t.join(timeout)
    assert result, f"waited {timeout} s for {name!r}"
    assert not isinstance(result[0], Exception), result[0]
    return result[0]


def _wait_or_error(bg: Background, name: str):
    try:
        return bg.wait(name)
    except RuntimeError as e:
        return e


def test_the_memory_guard_holds_a_job_until_a_test_waits_on_it(tmp_path, monkeypatch):
    monkeypatch.setattr(background, "MIN_AVAILABLE_GIB", float("inf"))  # never enough memory free
    monkeypatch.setattr(background, "YIELD_BELOW_GIB", 0)
    bg = Background(REPO, tmp_path)
    try:
        bg.add("held", lambda d: [([PY, "-c", "print('ran')"], {})], tmp_path / "held")
        bg.start()
        time.sleep(3)  # the runner looks every 2 s
        assert bg.jobs["held"].started is None and bg.queue == ["held"]
        assert waited(bg, "held").results[0].stdout == "ran\n"  # a waiting test would otherwise run it itself
    finally:
        bg.close()


def test_an_unknown_ahead_flag_is_an_error_naming_it():
    import subprocess

    r = subprocess.run([PY, "-m", "pytest", "-q", "-p", "no:randomly", "tests/test_stats.py", "-k", "nothing"],
                       cwd=REPO, capture_output=True, text=True, env={**os.environ, "RLWB_TEST_AHEAD": "yes"})
    assert r.returncode != 0 and "RLWB_TEST_AHEAD='yes'" in r.stdout + r.stderr
