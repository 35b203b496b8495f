"""The queue that makes the suite's expensive CLI runs ahead (tests/background.py): a job's commands run in order at
low priority, stop at the first failure, a test's wait moves its job to the front, and the end of a session leaves
no process and no cgroup behind. Plain `python -c` commands stand in for `rlwb run`: what is checked is the queue."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from tests.background import Background
from tests.conftest import REPO, pids_alive

PY = sys.executable


def test_a_job_runs_its_commands_in_order_and_stops_at_the_first_failure(tmp_path):
    bg = Background(REPO)
    try:
        bg.add("ok", [([PY, "-c", "import os; print(os.nice(0))"], {}), ([PY, "-c", "print('second')"], {})],
                tmp_path / "ok")
        bg.add("fails", [([PY, "-c", "import sys; sys.exit('broken')"], {}), ([PY, "-c", "print('never')"], {})],
               tmp_path / "fails")
        bg.start()
        ok, fails = bg.wait("ok"), bg.wait("fails")
        assert [r.returncode for r in ok.results] == [0, 0] and ok.results[1].stdout == "second\n"
        # low priority: a cgroup with a small CPU share where one can be made, else nice 19
        assert int(ok.results[0].stdout) == (0 if bg.cgroup is not None else 19)
        assert [r.returncode for r in fails.results] == [1] and "broken" in fails.results[0].stderr
        assert bg.wait("not queued") is None
    finally:
        bg.close()


def test_a_waited_job_jumps_the_queue_and_closing_leaves_nothing_behind(tmp_path):
    bg = Background(REPO)
    pid_file = tmp_path / "pid"
    # the first job starts a grandchild in a session of its own (as papermill's kernel and rlwb's workers do)
    bg.add("long", [([PY, "-c", f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
                                "'import time; time.sleep(600)'], start_new_session=True); "
                                f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)"], {})],
           tmp_path / "long")
    bg.add("queued", [([PY, "-c", "print('queued')"], {})], tmp_path / "queued")
    bg.add("urgent", [([PY, "-c", "print('urgent')"], {})], tmp_path / "urgent")
    cgroup = bg.cgroup
    try:
        bg.start()
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        grandchild = int(pid_file.read_text())
        assert bg.queue == ["queued", "urgent"]
        threading.Thread(target=bg.wait, args=("urgent",), daemon=True).start()
        deadline = time.monotonic() + 10
        while bg.queue != ["urgent", "queued"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bg.queue == ["urgent", "queued"]  # moved to the front while "long" still runs
    finally:
        bg.close()
    assert bg.jobs["long"].results[0].returncode != 0  # stopped, not finished
    deadline = time.monotonic() + 10
    while pids_alive([grandchild]) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        if cgroup is not None:  # the cgroup holds the grandchild however it detached, and is removed with it
            assert not pids_alive([grandchild]) and not Path(cgroup).exists()
        assert not bg.root.exists()
    finally:  # without a cgroup the detached grandchild is its parent's to stop (rlwb run stops its workers)
        if pids_alive([grandchild]):
            os.kill(grandchild, signal.SIGKILL)
