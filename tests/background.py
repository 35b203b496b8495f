"""The suite's expensive CLI runs, made ahead in the background on the CPU the other tests leave idle.

Why: in one pytest process the suite keeps about 1.3 of 2 cores busy (scripts/suite_cpu.py; 1,046 of 3,163
CPU-seconds idle in a fresh run of 2026-11-26), while the notebook smoke runs alone are ~7 minutes of `rlwb run`
subprocesses that wait on nothing in the test process. xdist does not use that idle core well: two workers put four
OpenMP threads on two cores and hold every session engine twice (tests/README.md). Here one process runs the tests
as before, and at collection `Background` queues the runs the selected tests will assert on (`conftest.AHEAD`), in
the order the (shuffled) tests need them. One run at a time goes in the background; a test that reaches a run
waits for it (moving it to the front of the queue), then asserts on it exactly as on a run it started itself.

Low priority has to survive new sessions: papermill's kernel and rlwb's engine workers each start a session of their
own, and with the kernel's autogroup scheduling every session is an equal peer of the whole test process whatever
its nice value. So each run goes into a cgroup of its own under one with a small CPU share (cgroup v1's
`cpu.shares`, 128 against the 1,024 of every session at the root): a child cannot leave it by starting a session,
and the group is stopped whole. Where no cgroup can be made (not root, no cgroup v1 cpu controller) the command runs
at nice 19, which its kernel and engine workers, in sessions of their own, do not keep: there the background
competes with the tests as an equal (correct, only less fast). The children's environment is the one pytest had at
collection, never a variable a running test has set; the OOM killer takes a background run before the tests' own
engines. A run starts only while `MIN_AVAILABLE_GIB` of memory is free, unless a test is already waiting on it (that
test would otherwise start the same run itself); a run no test waits on is killed when free memory falls below
`YIELD_BELOW_GIB`, and made again, from scratch, when its test waits on it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (the machines CI runs on)
SHARES = 128  # of the 1,024 each session at the root gets: ~1/9 of a contended core, all of an idle one
MIN_AVAILABLE_GIB = 6.0  # a smoke run's kernel and engines take ~2-5 GiB (the busiest: three engines at ~1.4 GiB)
YIELD_BELOW_GIB = 3.0  # a run no test waits on is killed (and made again when its test waits) when free memory falls
# below this, checked each second: a vLLM V1 worker the tests start needs ~1.7 GiB and refuses to start with less
# than its 1 GiB KV cache free
COMMAND_TIMEOUT = 1200  # s per command, as in the foreground (`conftest.rlwb`'s callers)


def available_gib() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


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


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove_cgroup(path: Path | None) -> None:
    """Kill what is left in cgroup `path` and remove it (a killed process leaves the group a moment later)."""
    if path is None:
        return
    deadline = time.monotonic() + 10
    while True:
        _kill(_cgroup_pids(path))
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)


@dataclass
class Job:
    """One background job: CLI command lines run one after another in `dir` (a job stops at the first that fails)."""

    name: str
    make: Callable[[Path], list[tuple[list[str], dict]]]  # the command lines, given the folder they write into
    dir: Path
    yielded: int = 0  # times it was stopped to leave memory to the tests (each retry gets a fresh folder)
    results: list[subprocess.CompletedProcess] = field(default_factory=list)
    error: BaseException | None = None  # what kept the runner from running a command (it then goes on to the next job)
    proc: subprocess.Popen | None = None
    cgroup: Path | None = None
    started: float | None = None
    waited: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Background:
    """The queue of jobs and the one thread that runs them in order (see the module docstring). `root` holds the
    command logs; each job writes into the folder it is given."""

    def __init__(self, cwd: Path, root: Path):
        self.cwd, self.root = cwd, root
        self.env = dict(os.environ)  # pytest's environment at collection (a test's monkeypatch never reaches a run)
        for old in CGROUP_CPU.glob("rlwb-tests-*-*"):  # left by a session that was killed: removed once empty
            if not Path(f"/proc/{old.name.split('-')[2]}").exists():
                for child in [c for c in old.iterdir() if c.is_dir()] + [old]:
                    try:
                        child.rmdir()
                    except OSError:
                        pass
        name = f"rlwb-tests-{os.getpid()}-{id(self):x}"  # this process, this queue
        self.cgroup = _make_cgroup(CGROUP_CPU / name, SHARES) if CGROUP_CPU.is_dir() else None
        self.jobs: dict[str, Job] = {}
        self.queue: list[str] = []
        self.lock = threading.Condition()
        self.closing = False
        self.launched: list[tuple[subprocess.Popen, Path | None]] = []
        self.thread = threading.Thread(target=self._loop, name="rlwb-tests-ahead", daemon=True)

    def add(self, name: str, make: Callable[[Path], list[tuple[list[str], dict]]], dir: Path) -> None:
        """Queue job `name`: the command lines `make(folder)` run one after another, into `dir` (or a fresh folder
        beside it when the job is run again after leaving memory to the tests)."""
        self.jobs[name] = Job(name, make, dir)
        self.queue.append(name)

    def start(self) -> None:
        if self.queue:
            self.thread.start()

    def wait(self, name: str) -> Job | None:
        """The finished job `name` (moved to the front of the queue first, if it has not started), or None if this
        session queued no such job. Raises if the runner thread is gone with the job unfinished."""
        job = self.jobs.get(name)
        if job is None:
            return None
        with self.lock:
            job.waited = True
            if name in self.queue:
                self.queue.remove(name)
                self.queue.insert(0, name)
            self.lock.notify_all()
        while not job.done.wait(timeout=5):
            if not self.thread.is_alive():
                raise RuntimeError(f"the background runner stopped before {name!r} ran (session closing?)")
        return job

    def launch(self, name: str, args: list[str], env: dict, log: Path) -> subprocess.Popen:
        """Start `args` now, beside the queue, with the same low priority (its own cgroup `name`); the caller waits
        for it. Stopped by `close` if still running."""
        cgroup = _make_cgroup(self.cgroup / name) if self.cgroup is not None else None
        with open(log, "w") as f:
            proc = subprocess.Popen(args, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                    process_group=0, preexec_fn=self._child_setup(cgroup), env={**self.env, **env})
        self.launched.append((proc, cgroup))
        return proc

    # the thread ---------------------------------------------------------------------------------------------------

    def _next(self) -> Job | None:
        """The job to run next: the first one a test waits on, wherever it is in the queue; else the first one never
        stopped for memory (such a job waits for its test, and does not hold up the others), if enough memory is
        free."""
        with self.lock:
            while not self.closing:
                waited = [name for name in self.queue if self.jobs[name].waited]
                fresh = [name for name in self.queue if not self.jobs[name].yielded]
                if waited:
                    name = waited[0]
                elif fresh and available_gib() >= MIN_AVAILABLE_GIB:
                    name = fresh[0]
                else:
                    self.lock.wait(timeout=2)
                    continue
                self.queue.remove(name)
                job = self.jobs[name]
                job.started = time.monotonic()
                return job
            return None

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            try:
                self._run(job)
            except BaseException as e:  # noqa: BLE001 (handed to the test that waits on this job)
                job.error = e
            finally:
                _remove_cgroup(job.cgroup)
                if job.started is not None or self.closing:  # not queued again (`_requeue`)
                    job.done.set()

    def _run(self, job: Job) -> None:
        job.dir.mkdir(parents=True, exist_ok=True)
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        index = list(self.jobs).index(job.name)
        if self.cgroup is not None:
            job.cgroup = _make_cgroup(self.cgroup / f"job-{index}")
        for i, (args, env) in enumerate(job.make(job.dir)):
            out, err = logs / f"job-{index}-{job.yielded}-{i}.out", logs / f"job-{index}-{job.yielded}-{i}.err"
            with open(out, "w") as o, open(err, "w") as e:
                with self.lock:  # `close` sees this process, or this command never starts
                    if self.closing:
                        return
                    job.proc = subprocess.Popen(args, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=o, stderr=e,
                                                process_group=0, preexec_fn=self._child_setup(job.cgroup),
                                                env={**self.env, **env})
                deadline = time.monotonic() + COMMAND_TIMEOUT
                while True:
                    try:
                        job.proc.wait(timeout=1)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if time.monotonic() > deadline:
                        self._stop(job.proc, job.cgroup)
                        break
                    # (a test that starts waiting just after this check gets the run from scratch: slower, not hung)
                    if not job.waited and available_gib() < YIELD_BELOW_GIB:
                        self._stop(job.proc, job.cgroup, graceful=job.cgroup is None)  # the memory back at once
                        self._requeue(job)
                        return
            job.results.append(subprocess.CompletedProcess(args, job.proc.returncode, out.read_text(errors="replace"),
                                                           err.read_text(errors="replace")))
            if job.proc.returncode != 0:
                return

    def _requeue(self, job: Job) -> None:
        """Back to the front of the queue, to run again from scratch in a fresh folder (what the stopped run left
        stays in the old one, out of the tests' way) once a test waits on it: one stop per job, never a loop of
        restarts that each take the memory back."""
        _remove_cgroup(job.cgroup)
        with self.lock:
            job.yielded += 1
            job.dir = job.dir.with_name(f"{job.dir.name.split('.retry')[0]}.retry{job.yielded}")
            job.results, job.proc, job.started = [], None, None
            if not self.closing:
                self.queue.insert(0, job.name)

    @staticmethod
    def _child_setup(cgroup: Path | None):
        def setup() -> None:  # in the forked child, before exec
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))
            else:
                os.nice(19)
            with open("/proc/self/oom_score_adj", "w") as f:  # under memory pressure, this run goes first
                f.write("1000")
            # PR_SET_PDEATHSIG: SIGTERM when the thread that started it ends (the runner thread outlives its
            # commands; `launch` runs on the main thread) or pytest dies, even by SIGKILL
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)

        return setup

    @staticmethod
    def _stop(proc: subprocess.Popen, cgroup: Path | None, graceful: bool = True) -> None:
        """SIGTERM a command (rlwb archives the run as failed and stops its workers), then SIGKILL whatever is left of
        it: itself, and its cgroup (the kernel and workers in sessions of their own). Not graceful: SIGKILL at once."""
        if cgroup is not None and not graceful:
            _kill(_cgroup_pids(cgroup))
        if proc.poll() is None and graceful:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            _kill([proc.pid])
            proc.wait()
        if cgroup is not None:
            _kill(_cgroup_pids(cgroup))

    def close(self) -> None:
        """End of session: drop the queued jobs, stop the running command and what was launched, remove the
        cgroups. The jobs' folders stay (in pytest's temporary directory, as a test's own runs would)."""
        with self.lock:
            self.closing = True
            self.lock.notify_all()
            running = [(job.proc, job.cgroup) for job in self.jobs.values()
                       if job.proc is not None and not job.done.is_set()]
        for proc, cgroup in running + self.launched:
            self._stop(proc, cgroup)
        if self.thread.is_alive():
            self.thread.join(timeout=60)
        for _, cgroup in self.launched:
            _remove_cgroup(cgroup)
        if self.cgroup is not None:
            try:
                children = [c for c in self.cgroup.iterdir() if c.is_dir()]
            except OSError:
                children = []
            for child in children:
                _remove_cgroup(child)
            _remove_cgroup(self.cgroup)
