"""Framing for the engine worker pipes: 8-byte big-endian length, then one JSON document.

numpy arrays travel as `{"__nd__": [dtype, shape, base64 bytes]}`, so full-vocabulary logprobs (with
their -inf entries for tokens that top-k/top-p removed) cross the pipe exactly, bit for bit.
Imported by the kernel (`rlwb.engines.protocol`) and by `server.py` in the engine's own interpreter,
so it depends on the standard library and numpy only.
"""

from __future__ import annotations

import base64
import json
import struct

import numpy as np

MAX_FRAME = 1 << 31


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def _default(o):
    if isinstance(o, np.ndarray):
        a = np.ascontiguousarray(o)
        return {"__nd__": [a.dtype.str, list(a.shape), base64.b64encode(a.tobytes()).decode("ascii")]}
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"cannot send {type(o).__name__} over the engine protocol")


def _hook(d):
    if "__nd__" in d and len(d) == 1:
        dtype, shape, data = d["__nd__"]
        return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype)).reshape(shape).copy()
    return d


def encode(obj) -> bytes:
    body = json.dumps(obj, default=_default, allow_nan=True).encode("utf-8")
    return struct.pack(">Q", len(body)) + body


def write_frame(stream, obj) -> None:
    stream.write(encode(obj))
    if hasattr(stream, "flush"):
        stream.flush()


def _read_exact(stream, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = stream.read(n - got)
        if not b:
            raise EOFError("engine pipe closed")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_frame(stream):
    (n,) = struct.unpack(">Q", _read_exact(stream, 8))
    if n > MAX_FRAME:
        raise ValueError(f"engine protocol frame of {n} bytes: the stream is corrupt")
    return json.loads(_read_exact(stream, n).decode("utf-8"), object_hook=_hook)
