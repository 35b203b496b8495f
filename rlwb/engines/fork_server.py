"""Fork server: one process per engine environment that has imported the engine once and forks workers from it.

Why: importing vLLM is most of an engine's start on CPU (about 7 of 8 s for V1, measured on 2 cores), and a
notebook starts many engines of one environment (notebook 06: a dozen knobs on one baseline). A worker forked
from a process that has already imported vLLM skips that import and shares its pages copy-on-write; what it
runs afterwards is `server.main()`, exactly as a worker started fresh.

Runs under the engine's interpreter, beside `server.py`, on the standard library only (it imports the
engine itself, never rlwb). The kernel side is `rlwb.engines.forking`. Requests arrive on a SOCK_SEQPACKET
socket (fd number in argv), one JSON message each, file descriptors attached with SCM_RIGHTS:

- `{"id", "op": "fork", "backend", "env"}` + fds (stdin, stdout, stderr of the worker): imports the backend's
  modules on the first fork (their output goes to that worker's log), forks, and the child becomes a new session
  leader with those fds as 0/1/2 and `env` as its environment, then runs `server.main()`. Reply `{"id", "pid"}`;
  `{"id", "unsafe"}` if this process has more than one thread (the kernel then starts the worker fresh);
  `{"id", "error"}` if an import failed (the traceback is in the worker's log).
- `{"id", "op": "status", "pid"}`: reaps the child if it ended; reply `{"id", "returncode"}` (None while it
  runs, minus the signal number if a signal ended it, as `subprocess.Popen.returncode`).

Fork safety: with OMP_NUM_THREADS=1 (the only environments the kernel sends here) the imports start no thread
(/proc/self/task shows only the main thread after `from vllm import LLM` in vLLM 0.32) and no OpenMP pool (no
torch op runs here). The server checks that before every fork and refuses otherwise (the kernel then starts the
worker fresh). The server exits when the kernel's end of the socket closes (the
kernel ended, even by SIGKILL); its workers then see their parent change and end their process groups
(`server._die_with_parent`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MAX_MESSAGE = 1 << 20
PRELOAD = {  # what `server.py` imports to build each backend
    "vllm": ["vllm", "vllm_ext", "server"],
    "hf": ["torch", "transformers", "server"],
}


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _preload(backend: str, log_fd: int) -> None:
    """Import the backend's modules with fds 1 and 2 on the first worker's log, so what the import prints
    (and a failing import's traceback) lands where a fresh worker's would."""
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    try:
        for name in PRELOAD[backend]:
            __import__(name)
        if backend == "vllm":
            from vllm import LLM, SamplingParams  # noqa: F401  (the lazily imported entry points)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _child(sock: socket.socket, fds: list[int], env: dict) -> None:
    """In the forked child: become the worker `server.py` would be, then never return."""
    code = 1
    try:
        sock.close()
        os.setsid()  # its own process group: closing the worker ends vLLM's engine-core children too
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "server.py")]
        import server

        server.main()
        code = 0
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _returncode(pid: int) -> int | None:
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped already (asked twice): not ours to know any more
        return None
    if done == 0:
        return None
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(sock: socket.socket) -> None:
    preloaded: set[str] = set()
    ended: dict[int, int] = {}
    broken = False  # a failed import leaves half-imported modules behind: answer, then end (the kernel starts anew)
    unsafe: str | None = None  # set once: a thread appeared (an import started one); never fork again
    while not broken:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 3)
        except (ConnectionResetError, OSError):
            return
        if not data:  # the kernel closed its end
            return
        msg = json.loads(data)
        reply: dict = {"id": msg["id"]}
        try:
            if msg["op"] == "fork":
                if len(fds) != 3:
                    raise ValueError(f"fork needs 3 file descriptors, got {len(fds)}")
                backend = msg["backend"]
                if backend not in preloaded:
                    broken = True
                    _preload(backend, fds[2])
                    broken = False
                    preloaded.add(backend)
                if unsafe is None and _threads() != 1:
                    unsafe = f"the fork server has {_threads()} threads after its imports: forking it is not safe"
                if unsafe is not None:  # the kernel starts this worker fresh, and the next ones of this environment
                    reply["unsafe"] = unsafe
                else:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _child(sock, fds, msg["env"])
                    reply["pid"] = pid
            elif msg["op"] == "status":
                pid = int(msg["pid"])
                if pid not in ended:
                    code = _returncode(pid)
                    if code is not None:
                        ended[pid] = code
                reply["returncode"] = ended.get(pid)
            else:
                raise ValueError(f"unknown op {msg['op']!r}")
        except Exception as e:
            if fds:
                try:
                    os.write(fds[2], traceback.format_exc().encode())
                except OSError:
                    pass
            reply["error"] = f"{type(e).__name__}: {e}"
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock)


if __name__ == "__main__":
    main()
