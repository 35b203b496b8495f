"""JSON files written atomically and read forgivingly: a leaf utility that every layer may import (the archive's
run.json and metrics.json, an experiment's kept jobs). Why atomic: a run killed mid-write must leave the previous
file or the new one, never half of one, because a later resume or report reads it."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

__all__ = ["atomic_write", "json_text", "read_json", "write_json"]


def atomic_write(path: Path, write) -> Path:
    """`write(tmp)` fills a sibling temp file, then it is renamed over `path`. The temp file is the writer's own
    (process and thread): threads of one process writing one file (a study's lanes updating run.json) never share
    one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.unlink(missing_ok=True)
    write(tmp)
    os.replace(tmp, path)
    return path


def json_text(obj) -> str:
    """The text `write_json` writes for `obj` (what a file's size will be: `rlwb publish` plans with it)."""
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"


def write_json(path: Path, obj) -> None:
    """Atomic (`atomic_write`): the previous file or the new one, never half of one."""
    atomic_write(path, lambda t: t.write_text(json_text(obj)))


def read_json(path: Path, default=None):
    """The file's JSON, or `default` when it is missing or not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default
