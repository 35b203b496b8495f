"""The suite's expensive CLI runs, started ahead in the background on the CPU the other tests leave idle.

Why: in one pytest process the suite keeps about 1.3 of 2 cores busy (scripts/suite_cpu.py; 1,085 of 3,218
CPU-seconds idle in a fresh run of 2026-11-26), while the notebook smoke runs alone are ~7 minutes of `rlwb run`
subprocesses that wait on nothing in the test process. xdist does not use that idle core well: two workers put four
OpenMP threads on two cores and hold every session engine twice (tests/README.md). Here one process runs the tests
as before, and at collection `Background` queues the runs the selected tests will assert on (`conftest.AHEAD`), in
the order the (shuffled) tests need them. One run at a time goes in the background; a test that reaches a run
waits for it (or moves it to the front of the queue), then asserts on it exactly as on a run it started itself.

Low priority has to survive new sessions: papermill's kernel and rlwb's engine workers each start a session of their
own, and with the kernel's autogroup scheduling every session is an equal peer of the whole test process whatever
its nice value. So each run goes into a cgroup of its own under one with a small CPU share (cgroup v1's
`cpu.shares`, 128 against the 1,024 of every session at the root): a child cannot leave it by starting a session,
and the group is killed whole. Where no cgroup can be made (not root, no cgroup v1 cpu controller), runs go at nice
19 in the test's own session instead. A run starts only while `MIN_AVAILABLE_GIB` of memory is free, unless a test
is already waiting on it (that test would otherwise start the same run itself).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (the machines CI runs on)
SHARES = 128  # of the 1,024 each session at the root gets: ~1/9 of a contended core, all of an idle one
MIN_AVAILABLE_GIB = 6.0  # a run holds a kernel and up to five engines (~1.4 GiB each for vLLM V1)


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def _make_cgroup(path: Path, shares: int | None = None) -> Path | None:
    try:
        path.mkdir(exist_ok=True)
        if shares is not None:
            (path / "cpu.shares").write_text(str(shares))
        return path
    except OSError:
        return None


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


@dataclass
class Job:
    """One background job: CLI command lines run one after another in `dir` (a run stops at the first that fails)."""

    name: str
    commands: list[tuple[list[str], dict]]
    dir: Path
    timeout: float
    results: list[subprocess.CompletedProcess] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    cgroup: Path | None = None
    started: float | None = None
    waited: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Background:
    """The queue of jobs and the one thread that runs them in order (see the module docstring)."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.root = Path(tempfile.mkdtemp(prefix="rlwb-tests-ahead-"))
        for old in CGROUP_CPU.glob("rlwb-tests-*-*"):  # left by a session that was killed: removed once empty
            if not Path(f"/proc/{old.name.split('-')[2]}").exists():
                for child in [c for c in old.iterdir() if c.is_dir()] + [old]:
                    try:
                        child.rmdir()
                    except OSError:
                        pass
        name = f"rlwb-tests-{os.getpid()}-{self.root.name.rsplit('-', 1)[-1]}"  # this process, this queue
        self.cgroup = _make_cgroup(CGROUP_CPU / name, SHARES) if CGROUP_CPU.is_dir() else None
        self.jobs: dict[str, Job] = {}
        self.queue: list[str] = []
        self.lock = threading.Condition()
        self.closing = False
        self.launched: list[tuple[subprocess.Popen, Path | None]] = []
        self.thread = threading.Thread(target=self._loop, name="rlwb-tests-ahead", daemon=True)

    def add(self, name: str, commands: list[tuple[list[str], dict]], dir: Path, timeout: float = 1800) -> None:
        self.jobs[name] = Job(name, commands, dir, timeout)
        self.queue.append(name)

    def start(self) -> None:
        if self.queue:
            self.thread.start()

    def wait(self, name: str) -> Job | None:
        """The finished job `name` (moved to the front of the queue first, if it has not started), or None if this
        session queued no such job."""
        job = self.jobs.get(name)
        if job is None:
            return None
        with self.lock:
            job.waited = True
            if name in self.queue:
                self.queue.remove(name)
                self.queue.insert(0, name)
            self.lock.notify_all()
        job.done.wait()
        return job

    def launch(self, name: str, args: list[str], env: dict, log: Path) -> subprocess.Popen:
        """Start `args` now, beside the queue, with the same low priority (its own cgroup `name`); the caller waits
        for it. Stopped by `close` if still running."""
        cgroup = _make_cgroup(self.cgroup / name) if self.cgroup is not None else None
        with open(log, "w") as f:
            proc = subprocess.Popen(args, cwd=self.cwd, stdout=f, stderr=subprocess.STDOUT, process_group=0,
                                    preexec_fn=self._child_setup(cgroup), env={**os.environ, **env})
        self.launched.append((proc, cgroup))
        return proc

    # the thread ---------------------------------------------------------------------------------------------------

    def _next(self) -> Job | None:
        with self.lock:
            while not self.closing:
                if self.queue:
                    job = self.jobs[self.queue[0]]
                    if job.waited or available_gib() >= MIN_AVAILABLE_GIB:
                        self.queue.pop(0)
                        job.started = time.monotonic()
                        return job
                self.lock.wait(timeout=2)
            return None

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._run(job)
            finally:
                job.done.set()

    def _run(self, job: Job) -> None:
        job.dir.mkdir(parents=True, exist_ok=True)
        if self.cgroup is not None:
            job.cgroup = _make_cgroup(self.cgroup / f"job-{list(self.jobs).index(job.name)}")
        for i, (args, env) in enumerate(job.commands):
            out, err = job.dir / f".ahead-{i}.out", job.dir / f".ahead-{i}.err"
            with open(out, "w") as o, open(err, "w") as e:
                job.proc = subprocess.Popen(args, cwd=self.cwd, stdout=o, stderr=e, process_group=0,
                                            preexec_fn=self._child_setup(job.cgroup),
                                            env={**os.environ, **env})
                try:
                    job.proc.wait(timeout=job.timeout)
                except subprocess.TimeoutExpired:
                    self._stop(job)
            r = subprocess.CompletedProcess(args, job.proc.returncode, out.read_text(errors="replace"),
                                            err.read_text(errors="replace"))
            out.unlink()
            err.unlink()
            job.results.append(r)
            if r.returncode != 0 or self.closing:
                break
        self._remove_cgroup(job)

    @staticmethod
    def _child_setup(cgroup: Path | None):
        def setup() -> None:  # in the forked child, before exec
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            else:
                os.nice(19)
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: dies with pytest

        return setup

    def _stop(self, job: Job) -> None:
        """SIGTERM the job's command (rlwb archives the run as failed and stops its workers), then SIGKILL whatever
        is left of it: its process group, and its cgroup (the kernel and workers in sessions of their own)."""
        proc = job.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        for pid in ([proc.pid] + (_cgroup_pids(job.cgroup) if job.cgroup else [])):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()

    def _remove_cgroup(self, job: Job) -> None:
        if job.cgroup is None:
            return
        for pid in _cgroup_pids(job.cgroup):  # a worker the run left behind (it would fail its own test's checks)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                job.cgroup.rmdir()
                return
            except OSError:
                time.sleep(0.1)

    def close(self) -> None:
        """End of session: stop the running job, drop the queued ones, remove the cgroups and the jobs' folders."""
        with self.lock:
            self.closing = True
            self.lock.notify_all()
        for job in self.jobs.values():
            if job.started is not None and not job.done.is_set():
                self._stop(job)
        for proc, _ in self.launched:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=30)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        if self.thread.is_alive():
            self.thread.join(timeout=60)
        if self.cgroup is not None:
            for child in (c for c in self.cgroup.iterdir() if c.is_dir()):
                for pid in _cgroup_pids(child):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    child.rmdir()
                except OSError:
                    pass
            try:
                self.cgroup.rmdir()
            except OSError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)
