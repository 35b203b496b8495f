"""Engine worker process: one inference engine behind a framed JSON protocol on stdin/stdout. This is the loop (read
a request, call the backend, write the reply) and the worker's lifetime; the engines are its backends,
`vllm_backend.py` (vLLM V0 / V1) and `hf_backend.py` (transformers, the reference).

Runs under the *engine's* interpreter (a vLLM 0.8.5 venv, a vLLM V1 venv, or the kernel's venv for the
HF reference), so it imports only the standard library, its sibling engine-side modules, torch, transformers and
vLLM - never rlwb. `rlwb.engines.worker.EngineWorker` starts it and speaks the protocol (`protocol.py`, copied
semantics).

Why pipes and not a port: no listening socket (nothing to secure or collide), and the worker dies with
its parent's pipe. Why stdout is moved: vLLM and its libraries print; the real stdout fd is duplicated
for the protocol and fd 1 is pointed at stderr, so no stray print can corrupt a frame.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import protocol  # noqa: E402  (the same module the kernel imports as rlwb.engines.protocol)
from hf_backend import HfBackend  # noqa: E402
from vllm_backend import VllmBackend  # noqa: E402


def _die_with_parent() -> None:
    """If the kernel that started us dies (even by SIGKILL), end this whole process group: vLLM's
    engine-core children included. The worker is its group's leader (started with a new session)."""
    import signal
    import threading

    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def main() -> None:
    _die_with_parent()
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # anything printed from here on goes to stderr, never into a frame
    sys.stdout = sys.stderr

    spec = protocol.read_frame(proto_in)
    t0 = time.time()
    try:
        backend = HfBackend(spec) if spec["backend"] == "hf" else VllmBackend(spec)
        info = backend.info()
        info["start_s"] = round(time.time() - t0, 2)
        info["pid"] = os.getpid()
        info["python"] = sys.version.split()[0]
        protocol.write_frame(proto_out, {"ok": True, "result": info})
    except Exception as e:
        protocol.write_frame(proto_out, {"ok": False, "error": f"{type(e).__name__}: {e}",
                                         "traceback": traceback.format_exc()})
        return
    while True:
        try:
            msg = protocol.read_frame(proto_in)
        except EOFError:  # the kernel closed the pipe: it is gone
            break
        op, args = msg.get("op"), msg.get("args") or {}
        try:
            if op == "generate":
                result = backend.generate(args["requests"], bool(args.get("full", False)), bool(args.get("text", True)))
            elif op == "update_weights":
                result = backend.update_weights(args["path"], args.get("reset"))
            elif op == "reset_prefix_cache":
                result = backend.reset_prefix_cache()
            elif op == "weights_checksum":
                result = backend.weights_checksum()
            elif op == "weights_checksums":
                result = backend.weights_checksums()
            elif op == "stats":
                result = backend.stats()
            elif op == "record_routing":
                result = backend.record_routing(bool(args.get("on", True)))
            elif op == "take_routing":
                result = backend.take_routing()
            elif op == "info":
                result = backend.info()
            elif op == "close":
                protocol.write_frame(proto_out, {"ok": True, "result": None})
                break
            else:
                raise ValueError(f"unknown op {op!r}")
            protocol.write_frame(proto_out, {"ok": True, "result": result})
        except Exception as e:
            protocol.write_frame(proto_out, {"ok": False, "error": f"{type(e).__name__}: {e}",
                                             "traceback": traceback.format_exc()})
    # vLLM's background threads can keep a normal exit waiting; take engine-core children down too.
    sys.stderr.flush()
    import signal

    os.killpg(os.getpgid(0), signal.SIGKILL)


if __name__ == "__main__":
    main()
