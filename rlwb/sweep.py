"""`rlwb sweep GRID.yaml`: a grid of parameter overrides for one notebook, each cell a normal archived run.

Why cells are ordinary runs: a paper figure is usually a grid (engines x dtypes x temperatures x seeds) that
outgrows one notebook loop. Running each cell through `rlwb run` keeps every cell a reproducible report of its
own (provenance, `rlwb compare`, the index and its trends), and makes the sweep restartable: the sweep's state
(`sweep.json`) records each cell's run directory as it finishes, so after an interruption
`rlwb sweep GRID.yaml --resume` runs only the cells without a successful run; a notebook that keeps its jobs
(03, 07, 08: `archive.Run.jobs()`) resumes each such cell's unfinished run job by job (`unfinished_run`, passed as
the run option `resume_from`, never a param) instead of starting it again. The summary (`summary.parquet`,
`figures/summary.png`, `report.html`) is built from the cells' archived metrics alone.

A grid file:

    notebook: 01_logprob_mismatch          # one notebook per sweep
    files: [params/01_logprob_mismatch/smoke.yaml]   # params files every cell starts from (optional)
    params: {reward_samples: 0}            # fixed overrides for every cell (optional)
    grid:                                  # cartesian product of these axes
      temperature: [0.5, 0.7, 1.0, 1.3]
      engines: [[vllm-v0], [vllm-v1]]
    zip:                                   # optional: groups of parameters that advance together (one axis each)
      - {seed: [0, 1], prompts: [8, 16]}
    summary: {x: temperature, metrics: ["*/k3_mean"]}   # optional: the summary figure (fnmatch patterns)

With `--ray ADDRESS` (or `auto`) the cells run as Ray tasks on an existing cluster, each task reserving the
CPUs and GPUs its engines need (`cell_resources`); the outputs directory must then be shared by the nodes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlwb import archive
from rlwb import params as params_mod
from rlwb.errors import ParamError, RunFailed
from rlwb.paths import REPO_ROOT

GRID_KEYS = {"notebook", "files", "params", "grid", "zip", "summary"}
CPUS_PER_ENGINE = 2  # an engine worker and the trainer beside it use 2 threads each on CPU (rlwb's presets)


@dataclass
class Grid:
    notebook: str
    files: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)
    zip: list[dict[str, list]] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    def cells(self) -> list[dict]:
        """Every cell's overrides: fixed params, then one value of each grid axis and of each zip group."""
        axes = [[{k: v} for v in values] for k, values in self.grid.items()]
        axes += [[dict(zip(group, vals)) for vals in zip(*group.values())] for group in self.zip]
        return [{**self.params, **{k: v for part in combo for k, v in part.items()}}
                for combo in itertools.product(*axes)] if axes else [dict(self.params)]

    def varying(self) -> list[str]:
        return [*self.grid, *(k for group in self.zip for k in group)]


def load_grid(path: str | os.PathLike) -> Grid:
    """Read and check a grid file; every cell's params are validated before anything runs."""
    path = Path(path)
    raw = params_mod.read_yaml(path)
    unknown = sorted(set(raw) - GRID_KEYS)
    if unknown:
        raise ParamError(f"grid file {path}: unknown key(s) {unknown}; allowed: {sorted(GRID_KEYS)}")
    if not isinstance(raw.get("notebook"), str):
        raise ParamError(f"grid file {path}: `notebook` (a notebook stem) is required")
    for key, kind in (("files", list), ("params", dict), ("grid", dict), ("zip", list), ("summary", dict)):
        if key in raw and not isinstance(raw[key], kind):
            raise ParamError(f"grid file {path}: `{key}` must be a {kind.__name__}, got {type(raw[key]).__name__}")
    g = Grid(notebook=Path(raw["notebook"]).stem, files=list(raw.get("files") or []), params=dict(raw.get("params")
             or {}), grid=dict(raw.get("grid") or {}), zip=list(raw.get("zip") or []), summary=dict(raw.get("summary")
             or {}))
    for name, values in g.grid.items():
        if not isinstance(values, list) or not values:
            raise ParamError(f"grid file {path}: grid axis {name!r} must be a non-empty list of values")
    for i, group in enumerate(g.zip):
        if not isinstance(group, dict) or not group or any(not isinstance(v, list) for v in group.values()):
            raise ParamError(f"grid file {path}: zip group {i} must map parameter names to lists")
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) != 1 or not next(iter(lengths.values())):
            raise ParamError(f"grid file {path}: zip group {i} needs lists of one non-zero length, got {lengths}")
    names = [*g.params, *g.varying()]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ParamError(f"grid file {path}: parameter(s) {dupes} set in more than one of params / grid / zip")
    g.files = [_params_file(path, f) for f in g.files]
    for i, cell in enumerate(g.cells()):
        try:
            params_mod.load(g.notebook, g.files, cell)
        except ParamError as e:
            raise ParamError(f"grid file {path}, cell {i} {cell}: {e}") from None
    x = g.summary.get("x")
    if x is not None and x not in g.varying():
        raise ParamError(f"grid file {path}: summary x {x!r} is not a grid or zip parameter ({g.varying()})")
    return g


def _params_file(grid_path: Path, name: str) -> str:
    """A grid's params file, absolute: as given (or relative to the working directory), else next to the grid
    file, else in the repo."""
    for cand in (Path(name), grid_path.parent / name, REPO_ROOT / name):
        if cand.is_file():
            return str(cand.resolve())
    raise ParamError(f"grid file {grid_path}: params file {name!r} not found (looked in the working directory, "
                     f"{grid_path.parent} and {REPO_ROOT})")


def cell_id(overrides: dict) -> str:
    """Stable across runs and resumes: the cell's overrides, hashed."""
    return hashlib.sha256(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]


def cell_resources(notebook: str, files: list[str], overrides: dict, cuda: bool) -> dict:
    """What a cell's Ray task reserves: on CUDA the largest tensor-parallel size of its engines in GPUs (the
    engines run one at a time), else `CPUS_PER_ENGINE` CPUs times the largest tensor-parallel size."""
    from rlwb.engines.presets import resolve_preset

    p = params_mod.load(notebook, files, overrides)
    tp = max([int(resolve_preset(e, cuda=cuda).vllm_kwargs.get("tensor_parallel_size", 1))
              for e in getattr(p, "engines", [])] or [1])
    return {"num_cpus": CPUS_PER_ENGINE * (1 if cuda else tp), "num_gpus": tp if cuda else 0}


# -- state ------------------------------------------------------------------------------------------
def new_sweep_dir(root: Path, grid_path: Path) -> Path:
    d = root / "sweeps" / grid_path.stem / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    d.mkdir(parents=True)
    return d


def latest_sweep_dir(root: Path, grid_path: Path) -> Path | None:
    base = root / "sweeps" / grid_path.stem
    dirs = sorted(d for d in base.iterdir() if (d / "sweep.json").exists()) if base.exists() else []
    return dirs[-1] if dirs else None


def read_state(sweep_dir: Path) -> dict:
    state = archive.read_json(sweep_dir / "sweep.json")
    if state is None:
        raise ParamError(f"{sweep_dir} is not a sweep directory (no sweep.json)")
    return state


def _write_state(sweep_dir: Path, state: dict) -> None:
    archive.write_json(sweep_dir / "sweep.json", state)


def pending(state: dict) -> list[dict]:
    return [c for c in state["cells"] if c["status"] != "ok"]


def unfinished_run(notebook: str, files: list[str], overrides: dict, outputs: Path,
                   say=lambda msg: None) -> str | None:
    """The unfinished run of a cell its rerun can resume from: a run of the notebook under `outputs` that did not
    finish (archived as failed or interrupted, or a `.tmp-*` directory a killed `rlwb run` left, its process gone),
    kept at least one job (`archive.kept_jobs`) and passes the very check the runner makes before it resumes
    (`archive.resume_check`: params bar `archive.NON_COMPUTATIONAL`, commit on a clean tree in both, environment);
    of several, the one with the most kept jobs, then the newest. None otherwise (`say` tells why a candidate is
    passed over). A run passed over here is never picked and then refused, so a cell cannot fail on it each time.
    The model build and engines are checked by the run itself (`Run.jobs()`, `Run.record_engine`)."""
    base = Path(outputs) / notebook
    if not base.is_dir():
        return None
    params = params_mod.load(notebook, files, overrides)
    here = archive.start_record(notebook, "", params)
    best, best_key = None, None
    for d in sorted(base.iterdir()):
        rec = archive.read_record(d)
        jobs = archive.kept_jobs(d) if rec else 0
        if not jobs or rec.get("status") == "ok" or not (d / "params.yaml").is_file():
            continue
        if d.name.startswith(".tmp-") and _alive(d.name.rsplit("-", 1)[-1]):
            continue  # a run still going
        try:
            archive.resume_check(d, notebook, params, here)
        except ParamError as e:
            say(f"  not resuming from {d} ({jobs} finished jobs): {e}")
            continue
        key = (jobs, rec.get("started_at") or "", d.name)
        if best_key is None or key > best_key:
            best, best_key = d, key
    return str(best) if best else None


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def cell_resume(g: Grid, cell: dict, outputs: Path, resume: bool, say) -> str | None:
    """The run a cell resumes from on a resumed sweep (its unfinished run, `unfinished_run`), else None: a run option
    (`runner.run(resume_from=)`, `rlwb run --resume-from`), never one of the cell's params."""
    if not resume:
        return None
    src = unfinished_run(g.notebook, g.files, cell["overrides"], outputs, say)
    if src is not None:
        say(f"  cell {cell['id']}: resuming the finished jobs of {src}")
    return src


# -- running ----------------------------------------------------------------------------------------
def _run_cell_cli(notebook: str, files: list[str], overrides: dict, outputs: str, cwd: str,
                  resume_from: str | None = None) -> dict:
    """One cell as `rlwb run` in its own process (what a Ray task executes; also usable sequentially)."""
    args = [sys.executable, "-m", "rlwb.cli", "run", notebook, "--outputs", outputs]
    if resume_from:
        args += ["--resume-from", resume_from]
    for f in files:
        args += ["-f", f]
    for k, v in overrides.items():
        args += ["-p", k, json.dumps(v)]
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else None
    if r.returncode == 0:
        return {"status": "ok", "run_dir": last, "error": None}
    error = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    return {"status": "failed", "run_dir": last if r.returncode == 1 else None, "error": error}


@contextmanager
def interruptible():
    """SIGINT (Ctrl-C) and SIGTERM raise KeyboardInterrupt while the sweep runs, whatever it inherited.

    Why: a shell that starts a command in the background without job control (`bash -c 'rlwb sweep g.yaml &'`, a
    scheduler's script) leaves SIGINT ignored, and a child inherits that. Inside a cell `rlwb run` installs its own
    handler, but between two cells an ignored signal was lost and the sweep ran on; SIGTERM there ended the process
    without the message that says how to resume. Outside the main thread (where Python takes no signal handler)
    nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_sweep(grid_path: str | os.PathLike, outputs: Path, *, resume: Path | None = None,
              ray_address: str | None = None, progress=None) -> Path:
    """Run every pending cell, then write the summary; returns the sweep directory. Ctrl-C or SIGTERM, inside a
    cell or between two, keeps the finished cells (and their state) and raises KeyboardInterrupt."""
    with interruptible():
        return _run_sweep(grid_path, outputs, resume, ray_address, progress)


def _run_sweep(grid_path, outputs: Path, resume: Path | None, ray_address: str | None, progress) -> Path:
    grid_path = Path(grid_path)
    g = load_grid(grid_path)
    if resume is not None:
        sweep_dir = resume
        state = read_state(sweep_dir)
        if state["grid"] != asdict(g):
            raise ParamError(f"{sweep_dir} was made from a different grid; start a new sweep instead of --resume")
    else:
        sweep_dir = new_sweep_dir(outputs, grid_path)
        state = {"grid_file": str(grid_path), "grid": asdict(g), "started_at": archive.utc_now(),
                 "cells": [{"id": cell_id(c), "overrides": c, "status": "pending", "run_dir": None, "error": None}
                           for c in g.cells()]}
        (sweep_dir / "grid.yaml").write_text(grid_path.read_text())
        _write_state(sweep_dir, state)
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    todo = pending(state)
    say(f"sweep {sweep_dir}: {len(state['cells'])} cells, {len(todo)} to run"
        + (f" on Ray ({ray_address})" if ray_address else ""))

    def record(cell: dict, result: dict) -> None:
        cell.update(result)
        _write_state(sweep_dir, state)
        say(f"  cell {cell['id']} {json.dumps(cell['overrides'], sort_keys=True)}: {cell['status']}"
            + (f" ({cell['error']})" if cell["error"] else f" -> {cell['run_dir']}"))

    if ray_address:
        _run_on_ray(g, todo, outputs, ray_address, record, resume is not None, say)
    else:
        from rlwb import runner

        for cell in todo:
            try:
                run_dir = runner.run(g.notebook, g.files, cell["overrides"], outputs,
                                     resume_from=cell_resume(g, cell, outputs, resume is not None, say))
                record(cell, {"status": "ok", "run_dir": str(run_dir), "error": None})
            except RunFailed as e:
                record(cell, {"status": "failed", "run_dir": str(e.run_dir), "error": e.error})
                if e.error == "interrupted":  # Ctrl-C / SIGTERM: stop the sweep; --resume runs the rest
                    raise KeyboardInterrupt from None
    state["finished_at"] = archive.utc_now()
    _write_state(sweep_dir, state)
    write_summary(sweep_dir)
    return sweep_dir


def _run_on_ray(g: Grid, todo: list[dict], outputs: Path, address: str, record, resume: bool = False,
                say=lambda msg: None) -> None:
    import ray

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    if threading.current_thread() is threading.main_thread():  # ray.init makes SIGTERM exit the driver: ours again
        signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    try:
        cuda = bool(ray.cluster_resources().get("GPU"))
        task = ray.remote(_run_cell_cli)
        futures = {}
        for cell in todo:
            res = cell_resources(g.notebook, g.files, cell["overrides"], cuda)
            src = cell_resume(g, cell, outputs, resume, say)
            ref = task.options(**res).remote(g.notebook, g.files, cell["overrides"], str(outputs), str(REPO_ROOT),
                                             src)
            futures[ref] = cell
        while futures:
            done, _ = ray.wait(list(futures), num_returns=1)
            for ref in done:
                record(futures.pop(ref), ray.get(ref))
    finally:
        ray.shutdown()


# -- summary ----------------------------------------------------------------------------------------
def summary_frame(state: dict):
    """One row per (successful cell, metric): the cell's varying parameters, `metric`, `value`, `run_dir`."""
    import pandas as pd

    rows = []
    varying = Grid(**state["grid"]).varying()
    for c in state["cells"]:
        if c["status"] != "ok" or not c["run_dir"]:
            continue
        metrics = archive.read_json(Path(c["run_dir"]) / "metrics.json", {})
        base = {k: json.dumps(c["overrides"][k]) if isinstance(c["overrides"][k], list) else c["overrides"][k]
                for k in varying}
        rows += [{**base, "cell": c["id"], "metric": k, "value": v, "run_dir": c["run_dir"]}
                 for k, v in metrics.items()]
    return pd.DataFrame(rows, columns=[*varying, "cell", "metric", "value", "run_dir"])


def summary_figure(df, x: str, patterns: list[str], varying: list[str]):
    """Each matching metric against `x`: one line per metric group (e.g. the engine) and other varying values."""
    import matplotlib.pyplot as plt

    from rlwb import plots

    keys = sorted({m for m in df["metric"] if any(fnmatch.fnmatch(m, p) for p in patterns)})
    names = sorted({k.rsplit("/", 1)[-1] for k in keys})
    fig, axes = plt.subplots(1, len(names), figsize=plots.figsize("notebook", min(1.3, 0.75 * len(names))),
                             squeeze=False)
    others = [v for v in varying if v != x]
    for ax, name in zip(axes[0], names):
        d = df[df["metric"].map(lambda k, n=name: k.rsplit("/", 1)[-1] == n and k in keys)].copy()
        d["series"] = d["metric"].map(lambda k: k.rsplit("/", 1)[0])
        for o in others:
            d["series"] = d["series"] + f", {o}=" + d[o].astype(str)
        values = d["value"][d["value"] > 0]
        log = len(values) > 0 and values.max() / values.min() > 100
        if log:
            ax.set_yscale("log")
            if (d["value"] <= plots.FLOOR_VALUE).any():  # as in the notebooks: float noise drawn at the floor
                d["value"] = d["value"].clip(lower=plots.FLOOR_VALUE)
                ax.set_ylim(bottom=plots.FLOOR_VALUE / 3)
                ax.text(0.99, 0.01, f"≤ {plots.FLOOR_VALUE:.0e} drawn at {plots.FLOOR_VALUE:.0e}",
                        transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="#666")
        series = list(d.groupby("series", sort=True))
        groups = [label.split(",")[0] for label, _ in series]
        for i, (label, s) in enumerate(series):
            s = s.sort_values(x)
            group = groups[i]
            # one engine's colour for its line, unless other varying values split it into several lines
            color = plots.engine_color(group) if groups.count(group) == 1 else f"C{i % 10}"
            ax.plot(s[x], s["value"], marker="o", label=label, color=color, linestyle=plots.engine_style(group))
        xs = d[x]
        if xs.map(lambda v: isinstance(v, (int, float)) and v > 0).all() and xs.max() / xs.min() >= 20:
            ax.set_xscale("log")  # a learning rate or a size spanning decades
        ax.set_xlabel(x)
        ax.set_ylabel(name)
        ax.legend(fontsize=7, frameon=False)
    fig.suptitle(f"{', '.join(names)} vs {x}, one archived run per point")
    fig.tight_layout()
    return fig


def write_summary(sweep_dir: Path) -> Path:
    """`summary.parquet`, `figures/summary.png` (when the grid names a summary) and `report.html`
    (`rlwb/reports/templates/sweep.html`)."""
    import matplotlib.pyplot as plt

    from rlwb import plots
    from rlwb.reports.pages import render

    state = read_state(sweep_dir)
    df = summary_frame(state)
    df.to_parquet(sweep_dir / "summary.parquet", index=False)
    spec = state["grid"].get("summary") or {}
    figure = False
    varying = Grid(**state["grid"]).varying()
    if spec.get("x") and len(df):
        plots.set_style("notebook")
        fig = summary_figure(df, spec["x"], spec.get("metrics") or ["*"], varying)
        plots.save_figure(fig, sweep_dir / "figures" / "summary")
        plt.close(fig)
        figure = True
    cells = [{"id": c["id"], "overrides": json.dumps(c["overrides"], sort_keys=True), "status": c["status"],
              "rel": os.path.relpath(c["run_dir"], sweep_dir) if c["run_dir"] else "", "error": c.get("error") or ""}
             for c in state["cells"]]
    page = render("sweep.html", notebook=state["grid"]["notebook"], cells=cells, figure=figure,
                  done=sum(c["status"] == "ok" for c in state["cells"]))
    (sweep_dir / "report.html").write_text(page, encoding="utf-8")
    return sweep_dir / "report.html"
