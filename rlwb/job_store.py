"""A run's job store: every finished job of an experiment kept the moment it finishes, so an interrupted run keeps
its finished jobs and a run that resumes it (`rlwb run --resume-from`) trains only the rest.

A job is a frozen dataclass of everything that decides its computation (a GRPO run's engine, correction, seed, dose
...) with a `name` to read; its files are named by that name and a hash of every field (`job_key`), so no other job
passes for it. Under `data/jobs/` of the run (`archive.Run.jobs()` opens it):

    <key>.parquet   the job's curve: the job is finished once it exists
    <key>.json      the job, the run and host that trained it, its wall time (written after the curve)
    <key>.<part>    anything else the experiment keeps for the job (`put_json`, `put_tensor`)
    <name>.json     values shared by every job (`put_shared`)

Each file is written atomically (a temporary file renamed): a run killed mid-write leaves the previous file or the
new one. Jobs are seeded and independent, so a resumed run's curves are the uninterrupted run's, bar wall time.
The store never reads or writes run.json: the archive hands it the record of the run resumed from and a callback
that keeps `resume` (which run trained which jobs) in this run's record.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from rlwb.jsonfile import atomic_write
from rlwb.paths import shown


def job_key(job) -> str:
    """A job's file stem: its `name` to read, and a hash of every field of the job, so no other job passes for
    it."""
    h = hashlib.sha256(json.dumps(asdict(job), sort_keys=True).encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", job.name) + f"-{h}"


class JobStore:
    """Finished jobs under `root`, trained by run `run_id` on `host` (its record's; the CPU model, its instruction set
    and the GPU are kept with each job). `source_dir`: the job store of the run this one resumes (None: a run from
    scratch), whose record is `source_record`; its jobs are offered (`offered`) and taken over (`take`: hard-linked
    where the file system allows, else copied; the source is never changed). `record(resume)` keeps this run's `resume`
    record (the archive's `Run._update_run_json`)."""

    def __init__(self, root: Path, run_id: str | None, host: dict | None = None, *, source_dir: Path | None = None,
                 source_record: dict | None = None, record: Callable[[dict], None] | None = None):
        self.root, self.run_id = Path(root), run_id
        # where its jobs trained: each part's record
        self.host = {k: (host or {}).get(k) for k in ("cpu", "isa", "gpu")}
        self.source_dir, self.source_record = (Path(source_dir) if source_dir else None), source_record or {}
        self._record = record
        self.reused: list[str] = []  # keys of the jobs taken over from the run resumed
        self.total: int | None = None  # how many jobs the run has, once known (`start`, `finish`)
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def resuming(self) -> bool:
        return self.source_dir is not None

    # -- files --------------------------------------------------------------------------------------------------
    def _path(self, job, part: str) -> Path:
        return self.root / f"{job_key(job)}.{part}"

    def has(self, job, part: str = "parquet") -> bool:
        return self._path(job, part).exists()

    def _json(self, path: Path, data) -> None:
        atomic_write(path, lambda t: t.write_text(json.dumps(data, indent=1, sort_keys=True)))

    def put_json(self, job, part: str, data) -> None:
        self._json(self._path(job, part), data)

    def get_json(self, job, part: str):
        return json.loads(self._path(job, part).read_text())

    def put_tensor(self, job, part: str, tensor) -> None:
        """A tensor kept for the job (`torch.save`), written once: a job's tensor does not change."""
        import torch

        if not self.has(job, part):
            atomic_write(self._path(job, part), lambda t: torch.save(tensor, t))

    def get_tensor(self, job, part: str):
        import torch

        return torch.load(self._path(job, part))

    def drop(self, job, part: str) -> None:
        self._path(job, part).unlink(missing_ok=True)

    def put_shared(self, name: str, data: dict) -> None:
        self._json(self.root / f"{name}.json", data)

    def shared(self, name: str) -> dict | None:
        """A shared value: this store's, else (taken over) the run resumed's, else None."""
        if self.source_dir is not None and (self.source_dir / f"{name}.json").exists():
            self._take_file(self.source_dir / f"{name}.json")
        path = self.root / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    # -- jobs ---------------------------------------------------------------------------------------------------
    def save(self, job, df: pd.DataFrame, wall_s: float) -> pd.DataFrame:
        """Keep a finished job's curve, then its meta; returns the curve as read back, so a job trained now is
        what a job taken over is."""
        key = job_key(job)
        out = pd.read_parquet(atomic_write(self.root / f"{key}.parquet", lambda t: df.to_parquet(t, index=False)))
        # the meta after the curve: a meta names a finished job (`provenance` counts only those with a curve)
        self._json(self.root / f"{key}.json", {"job": asdict(job), "run_id": self.run_id, "host": self.host,
                                               "wall_s": round(wall_s, 3),
                                               "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        return out

    def offered(self, job, part: str = "parquet") -> bool:
        """Did the run resumed from keep this part of the job (by default: did it finish the job)?"""
        return self.source_dir is not None and (self.source_dir / f"{job_key(job)}.{part}").exists()

    def take(self, job) -> pd.DataFrame:
        """Take over every file the run resumed from kept for a job it finished (the curve last) and return the
        curve: the job counts as reused."""
        key = job_key(job)
        files = sorted(self.source_dir.glob(f"{key}.*"), key=lambda f: f.suffix == ".parquet")
        for f in files:
            self._take_file(f)
        self.reused.append(key)
        return pd.read_parquet(self.root / f"{key}.parquet")

    def _take_file(self, f: Path) -> None:
        dest = self.root / f.name
        if dest.exists():
            return

        def link_or_copy(tmp: Path) -> None:
            try:
                os.link(f, tmp)
            except OSError:
                shutil.copy2(f, tmp)

        atomic_write(dest, link_or_copy)

    def reused_engine(self, preset: str) -> dict | None:
        """The record of an engine in the run resumed from, tagged with that run (`from_run`): for an engine none of
        this run's jobs needs (every job of it taken over), so the run's record still names it."""
        info = (self.source_record.get("engines") or {}).get(preset)
        return {**info, "from_run": self.source_record.get("run_id") or str(self.source_dir)} if info else None

    # -- the run's record ---------------------------------------------------------------------------------------
    def provenance(self) -> dict:
        """Which run trained each kept job, on which host (CPU model, instruction set, GPU), and the wall time of each
        part (sum of its jobs' wall times)."""
        parts: dict = {}
        for f in sorted(self.root.glob("*.json")):
            if not f.with_suffix(".parquet").exists():
                continue  # a shared value, a part of a job, or a meta without its curve: not a finished job
            meta = json.loads(f.read_text())
            part = parts.setdefault(meta.get("run_id") or "?", {"jobs": 0, "wall_s": 0.0, "host": meta.get("host")})
            part["jobs"] += 1
            part["wall_s"] = round(part["wall_s"] + float(meta.get("wall_s") or 0.0), 2)
        return {"jobs": self.total, "parts": parts}

    def start(self, total: int | None = None) -> None:
        """The run starts training, with `total` jobs (None: known as it goes): its record's `resume` names the run
        it resumes and the jobs taken over so far."""
        self.total = total
        self._update()

    def _update(self) -> None:
        if self._record is None:
            return
        src = self.source_record
        resume = ({"from": shown(self.source_dir.parent.parent.resolve()), "from_run_id": src.get("run_id"),
                   "from_status": src.get("status"), "reused_jobs": len(self.reused), "reused": list(self.reused)}
                  if self.resuming else {"from": None, "reused_jobs": 0})
        self._record({**resume, **self.provenance()})

    def finish(self, drop: tuple[str, ...] = (), total: int | None = None) -> None:
        """The run finished (`total` jobs, if `start` did not know): the parts only an unfinished run needs (`drop`)
        go; the record's provenance is final."""
        self.total = self.total if total is None else total
        for part in drop:
            for f in self.root.glob(f"*.{part}"):
                f.unlink()
        self._update()
