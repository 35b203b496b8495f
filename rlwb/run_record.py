"""A run's record, run.json: the one place its file is named, read and written. A leaf utility, so that an
experiment that reads another archived run (notebook 10 re-scoring one, notebook 09 ranking notebook 06's knobs)
reads its record as everyone does; what goes into a record, and when, is the archive's (`rlwb.archive`), and only the
archive writes one (`tests/test_layout.py` holds every module to both)."""

from __future__ import annotations

import os
from pathlib import Path

from rlwb.jsonfile import read_json, write_json

RECORD = "run.json"  # what it is, its provenance, status, engines, model, resume


def record_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RECORD


def read_record(run_dir: str | os.PathLike, default=None):
    """`run_dir`'s record, or `default` when it has none (or an unreadable one)."""
    return read_json(record_path(run_dir), default)


def has_record(run_dir: str | os.PathLike) -> bool:
    """Is `run_dir` an archived run (a directory with a record)?"""
    return record_path(run_dir).is_file()


def write_record(run_dir: str | os.PathLike, record: dict) -> None:
    write_json(record_path(run_dir), record)


def update_record(run_dir: str | os.PathLike, **fields) -> dict:
    """`run_dir`'s record with `fields` set (a run without one gets one); returns it."""
    record = {**(read_record(run_dir, {}) or {}), **fields}
    write_record(run_dir, record)
    return record
