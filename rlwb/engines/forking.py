"""Kernel side of the fork server (`fork_server.py`): engine workers forked from a process that has imported vLLM.

`start(...)` is how `EngineWorker` starts its worker process. Where it forks, it returns a `ForkedProcess`
with `subprocess.Popen`'s surface (`pid`, `stdin`, `stdout`, `poll()`, `wait()`, `returncode`), and
never blocks: the fork server may still be importing when it returns (that is how an engine started ahead
overlaps other work); `pid` and `poll()` find out when the fork happened.

One fork server per engine environment: interpreter, backend, working directory and every environment
variable except rlwb's own `RLWB_*` (which `server.py` never reads). Why the whole environment: libraries
read some variables when they are loaded (OpenMP's thread count, vLLM's platform), so a server imported under
other values could give a worker other numerics. The worker still gets exactly the environment it asked for.
Only on CPU (on CUDA a fork after an engine import is not worth the risk, and the import is a small share of
a GPU engine's start) and for single-threaded OpenMP environments (`enabled`); `RLWB_FORK_SERVER=0` turns it
off (every worker then starts fresh, as before).
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

from rlwb.errors import EngineError

FORK_SERVER = Path(__file__).with_name("fork_server.py")
KEPT = 3  # fork servers kept alive without live workers (each holds an imported engine: ~0.4-0.6 GB RSS)
MAX_MESSAGE = 1 << 20


def enabled(env: dict) -> bool:
    """Start a worker with this environment from a fork server? On CPU, unless RLWB_FORK_SERVER=0, and only
    where OMP_NUM_THREADS=1 (the V1 presets). Why: with more threads, importing torch already runs an OpenMP
    region, and a child forked after that hangs in its first parallel region (GNU libgomp keeps the parent's
    thread pool, which the child does not have; measured with the V0 environment's torch). `fork_server.py`
    also refuses to fork a server that has more than one thread."""
    from rlwb.engines.presets import cuda_available

    flag = os.environ.get("RLWB_FORK_SERVER", "1")
    if flag not in ("0", "1"):
        raise ValueError(f"RLWB_FORK_SERVER={flag!r}: use 1 (fork engine workers from a fork server) or 0 (start "
                         "each one fresh)")
    return flag == "1" and env.get("OMP_NUM_THREADS") == "1" and not cuda_available()


class _ServerGone(RuntimeError):
    """The fork server ended. Never leaves this module: a worker it did not fork fails its start with the reason
    in its log (`ForkedProcess`), and `_fork` retries once on a new server."""


class ForkServer:
    """One `fork_server.py` process and the socket to it. Thread-safe: replies carry the request's id, so
    two lanes' workers can be forked, polled and waited for at once."""

    def __init__(self, python: str, env: dict, cwd: str):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (the server's own errors; workers log elsewhere)
        try:
            self.proc = subprocess.Popen([python, str(FORK_SERVER), str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                         stdin=subprocess.DEVNULL, stdout=self._stderr, stderr=self._stderr,
                                         env=env, cwd=cwd, start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._replies: dict[int, dict] = {}
        self._gone: str | None = None
        self.workers: weakref.WeakSet[ForkedProcess] = weakref.WeakSet()
        self.unsafe: str | None = None  # the server refused to fork (a thread appeared): start workers fresh

    def alive(self) -> bool:
        return self._gone is None and self.proc.poll() is None

    def busy(self) -> bool:
        """Has workers that may still run (closing the server would end them)."""
        return any(w.returncode is None for w in list(self.workers))

    def why_gone(self) -> str:
        code = self.proc.poll()
        try:
            self._stderr.seek(0)
            tail = self._stderr.read()[-4000:].decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            tail = ""
        return (f"the fork server ({self.proc.args[0]}) ended" + (f" with exit code {code}" if code is not None else "")
                + (f":\n{tail}" if tail else ""))

    def request(self, msg: dict, fds: list[int] = ()) -> int:
        rid = next(self._ids)
        data = json.dumps({**msg, "id": rid}).encode()
        with self._send_lock:
            try:
                socket.send_fds(self.sock, [data], list(fds)) if fds else self.sock.send(data)
            except OSError as e:
                self._gone = self._gone or f"{self.why_gone()} (send: {e})"
                raise _ServerGone(self._gone) from None
        return rid

    def reply(self, rid: int, timeout: float | None) -> dict | None:
        """The reply to request `rid`, or None if it has not come within `timeout` seconds (0: do not wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._recv_lock:
                if rid in self._replies:
                    return self._replies.pop(rid)
                if self._gone is not None:
                    raise _ServerGone(self._gone)
                while select.select([self.sock], [], [], 0)[0]:
                    data = self.sock.recv(MAX_MESSAGE)
                    if not data:
                        self._gone = self.why_gone()
                        raise _ServerGone(self._gone)
                    m = json.loads(data)
                    self._replies[m["id"]] = m
                if rid in self._replies:
                    return self._replies.pop(rid)
            if deadline is not None and time.monotonic() >= deadline:
                return None
            wait = 0.05 if deadline is None else max(0.0, min(0.05, deadline - time.monotonic()))
            select.select([self.sock], [], [], wait)  # a wake-up hint only: the read happens under the lock

    def close(self) -> None:
        try:
            self.sock.close()  # the server ends when its end of the socket sees EOF
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


class ForkedProcess:
    """A worker forked by a `ForkServer`, with the part of `subprocess.Popen`'s surface `EngineWorker` uses.

    It is the fork server's child, not ours: its exit status comes from the server (which reaps it). If the
    server refuses to fork (`unsafe`), the worker is started fresh on the same pipes (the spec the kernel wrote
    is still in them) and this object hands everything to that `Popen`."""

    def __init__(self, server: ForkServer, rid: int, stdin, stdout, fresh: tuple):
        self.server, self._rid = server, rid
        self.stdin, self.stdout = stdin, stdout
        self.args = [str(server.proc.args[0]), "server.py (forked)"]
        self.returncode: int | None = None
        self._pid: int | None = None
        self._popen: subprocess.Popen | None = None
        self._fresh = fresh  # (argv, stdin read fd, stdout write fd, stderr file, env): held until the fork reply
        self._lock = threading.Lock()
        server.workers.add(self)

    def _resolved(self) -> None:
        for fd in self._fresh[1:3]:
            os.close(fd)
        self._fresh = ()

    def _forked(self, timeout: float | None) -> bool:
        """Has the fork happened (or failed: then `returncode` is set)? Waits up to `timeout` seconds."""
        with self._lock:
            return self._forked_locked(timeout)

    def _forked_locked(self, timeout: float | None) -> bool:
        if self._pid is not None or self.returncode is not None or self._popen is not None:
            return True
        try:
            r = self.server.reply(self._rid, timeout)
        except _ServerGone as e:  # no worker was forked: say why in the worker's log, where its error points
            self._fresh[3].write(f"rlwb: {e}\n".encode())
            self._fresh[3].flush()
            r = {"error": "gone"}
        if r is None:
            return False
        if "unsafe" in r:
            self.server.unsafe = r["unsafe"]
            argv, in_r, out_w, stderr, env = self._fresh
            self._popen = subprocess.Popen(argv, stdin=in_r, stdout=out_w, stderr=stderr, env=env,
                                           start_new_session=True)
        elif "error" in r:
            self.returncode = 1  # the traceback went to the worker's log
        else:
            self._pid = int(r["pid"])
        self._resolved()
        return True

    @property
    def pid(self) -> int | None:
        """The worker's pid (waits for the fork); None if no worker was ever forked."""
        self._forked(None)
        return self._popen.pid if self._popen is not None else self._pid

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not self._forked(0):
            return None
        if self._popen is not None:
            self.returncode = self._popen.poll()
            return self.returncode
        if self._pid is None:
            return self.returncode
        try:
            r = self.server.reply(self.server.request({"op": "status", "pid": self._pid}), timeout=30)
        except _ServerGone:
            # Its workers notice their parent is gone and end their process groups by SIGKILL.
            r = {"returncode": None if _exists(self._pid) else -signal.SIGKILL}
        if r is not None and r.get("returncode") is not None:
            self.returncode = int(r["returncode"])
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_SERVERS: collections.OrderedDict[tuple, ForkServer] = collections.OrderedDict()
_LOCK = threading.Lock()


def server_for(python: str, env: dict, backend: str) -> ForkServer:
    """The fork server for this environment (started if there is none or it ended); keeps at most `KEPT` idle
    ones, least recently used closed first (a server with live workers is never closed: they would end)."""
    cwd = os.getcwd()
    key = (str(python), backend, cwd, tuple(sorted((k, v) for k, v in env.items() if not k.startswith("RLWB_"))))
    with _LOCK:
        s = _SERVERS.pop(key, None)
        if s is not None and not s.alive():
            s.close()
            s = None
        if s is None:
            s = ForkServer(str(python), env, cwd)
        _SERVERS[key] = s
        for k in list(_SERVERS)[:-1]:
            if len(_SERVERS) <= KEPT:
                break
            if not _SERVERS[k].busy():
                _SERVERS.pop(k).close()
    return s


def start(argv: list[str], env: dict, backend: str, stderr) -> ForkedProcess | subprocess.Popen:
    """Start an engine worker (`argv`: interpreter, server.py) with stdio pipes, `stderr` (a file) and `env`, in
    a new session; returns at once. Forked from its environment's fork server where `enabled` and that server
    forks; otherwise started fresh (a plain `Popen`)."""
    if enabled(env):
        forked = _fork(argv, env, backend, stderr)
        if forked is not None:
            return forked
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                            start_new_session=True)


def _fork(argv: list[str], env: dict, backend: str, stderr) -> ForkedProcess | None:
    """Ask the environment's fork server for a worker; None where that server has refused to fork (`unsafe`)."""
    for attempt in (1, 2):  # a server that ended since it was last used is replaced once
        server = server_for(argv[0], env, backend)
        if server.unsafe:
            return None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            rid = server.request({"op": "fork", "backend": backend, "env": env}, [in_r, out_w, stderr.fileno()])
            break
        except BaseException as e:
            for fd in (in_r, in_w, out_r, out_w):
                os.close(fd)
            if not isinstance(e, _ServerGone):
                raise
            if attempt == 2:
                raise EngineError(f"could not reach a fork server for {argv[0]}: {e}") from None
    return ForkedProcess(server, rid, open(in_w, "wb"), open(out_r, "rb"),  # noqa: SIM115 (the worker's pipes)
                         (argv, in_r, out_w, stderr, env))


def close_all() -> None:
    with _LOCK:
        while _SERVERS:
            _SERVERS.popitem()[1].close()


atexit.register(close_all)
