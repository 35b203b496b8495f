"""`rlwb run`: validate params, execute a notebook with papermill, archive it (see `archive.py`).

Order matters: params are validated and the outputs dir is checked *before* a kernel starts, so bad
input costs a second, not a run. Whatever happens next, the run is archived with an honest status.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from rlwb import archive, timing
from rlwb import params as params_mod
from rlwb.errors import ParamError, RunFailed
from rlwb.paths import NOTEBOOKS_DIR, REPO_ROOT, outputs_dir, shown
from rlwb.progress import PROGRESS_LOG


@functools.cache
def kernel_socket_dir() -> str:
    """This process's directory for its kernels' Unix sockets (short: a socket path holds at most 107 bytes),
    removed when the process exits. One per process, not per run: an interrupted run can leave its kernel still
    starting (a sweep's Ctrl-C), and a directory removed at the end of each run can be gone under such a kernel
    (its socket bind fails, and the sweep would not stop)."""
    path = tempfile.mkdtemp(prefix="rlwb-kernel-")
    atexit.register(shutil.rmtree, path, True)
    return path


def ipc_kernel_manager(socket_dir: str | os.PathLike):
    """The kernel manager papermill starts a run's kernel with: Unix-socket transport instead of loopback TCP, so
    no port is open to anyone on the machine and ipykernel's plain-TCP warning stays out of the run's terminal.

    The sockets go in `socket_dir` (`socket_dir/kernel-ipc-1` ...; `kernel_socket_dir()` for runs), not where
    jupyter_client's default puts them, the kernel's working directory `notebooks/`, where killed runs left them
    behind for copies of that directory to trip on."""
    from jupyter_client.manager import AsyncKernelManager

    prefix = os.path.join(os.fspath(socket_dir), "kernel-ipc")

    class IpcKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**{"transport": "ipc", "ip": prefix, **kwargs})

    return IpcKernelManager


def resolve_notebook(notebook: str | os.PathLike) -> Path:
    p = Path(notebook)
    for cand in (p, NOTEBOOKS_DIR / p, NOTEBOOKS_DIR / f"{p}.ipynb"):
        if cand.is_file() and cand.suffix == ".ipynb":
            return cand.resolve()
    known = sorted(x.name for x in NOTEBOOKS_DIR.glob("*.ipynb"))
    raise params_mod.ParamError(f"notebook {str(notebook)!r} not found; known notebooks: {known}")


class ProgressEcho(threading.Thread):
    """Copies the kernel's progress log (`rlwb.progress`) to this process's stderr as lines arrive, so a
    person running `rlwb run` sees progress while the bars stay out of the notebook and its report."""

    def __init__(self, path: Path, poll_s: float = 0.5):
        super().__init__(daemon=True)
        self.path, self.poll_s, self._done = path, poll_s, threading.Event()

    def run(self) -> None:
        pos = 0
        while True:
            done = self._done.is_set()
            if self.path.exists():
                with open(self.path) as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
                if chunk:
                    sys.stderr.write(chunk)
                    sys.stderr.flush()
            if done:
                return
            self._done.wait(self.poll_s)

    def stop(self) -> None:
        if self.is_alive():
            self._done.set()
            self.join(timeout=5)


class _Interrupted(BaseException):
    pass


def kernel_pythonpath(repo: Path, current: str | None) -> str:
    """PYTHONPATH for the notebook's kernel: `repo` first, so the kernel imports the rlwb that launched it.

    Why: `pip install -e` maps `rlwb` to one checkout. A second clone or a git worktree using the same .venv would
    otherwise execute the installed checkout's code in the kernel while run.json names this checkout's commit."""
    return os.pathsep.join([str(repo), *([current] if current else [])])


def run(notebook: str | os.PathLike, files: list[str] = (), overrides: dict | None = None,
        outputs: str | os.PathLike | None = None, log_output: bool = False,
        resume_from: str | os.PathLike | None = None, reanalyze: str | os.PathLike | None = None) -> Path:
    """Execute and archive; returns the run dir. Raises ParamError (before compute) or RunFailed.

    `resume_from` (an unfinished run of the same computation with kept jobs) is a run option, not a param: it is
    checked here, before the kernel starts (`archive.resume_check`), and the run's record names it (`resume`), where
    the kernel's `Run.jobs()` finds it; params.yaml and the params hash never hold it, so a resumed run is the same
    configuration as the run whole, reloadable once its source is gone.

    `reanalyze` (a finished run of a notebook whose experiment can redo its analysis from its data,
    `Notebook.reanalyzes`) makes a run that trains nothing: its params are that run's params.yaml under `files` and
    `overrides` (which may not change them, `archive.reanalysis_check`), its record names the
    source and its commit (`reanalysis`) and that run's engines, and the kernel's experiment reads the source's data
    (`Run.reanalyzes`): a fixed analysis becomes a run of record of the same data at the commit that holds it."""
    nb = resolve_notebook(notebook)
    if resume_from and reanalyze:
        raise ParamError("resume_from and reanalyze: one or the other (a resumed run trains what is left; a "
                         "reanalysis trains nothing)")
    source = Path(reanalyze).expanduser() if reanalyze else None
    if source is not None:
        from rlwb import registry

        record_nb = registry.notebook(nb.stem)
        if not record_nb.reanalyzes:
            able = ", ".join(s for s, n in registry.NOTEBOOKS.items() if n.reanalyzes)
            raise ParamError(f"{nb.stem} cannot redo its analysis from an archived run's data (reanalyze: {able})")
        if not (source / "params.yaml").is_file():
            raise ParamError(f"reanalyze {str(reanalyze)!r}: not an archived run directory (needs its record and "
                             f"params.yaml)")
        files = [str(source / "params.yaml"), *files]
    params = params_mod.load(nb.stem, files, overrides)
    resume = str(Path(resume_from).expanduser().resolve()) if resume_from else ""
    root = outputs_dir(outputs)
    archive.check_writable(root)
    started = time.time()
    record = archive.start_record(nb.stem, "", params)
    if resume:
        archive.resume_check(resume, nb.stem, params, record)
    if source is not None:
        theirs = params_mod.load(nb.stem, [str(source / "params.yaml")]).to_dict()
        again = archive.reanalysis_check(source, nb.stem, params, record, theirs, record_nb.reanalysis_reads,
                                         type(params).HASH_NEUTRAL)
        record = {**record, "reanalysis": again, "engines": archive.reanalysis_engines(source)}
    tmp, final = archive.new_run_dir(root, nb.stem, params.hash())
    (tmp / "params.yaml").write_text(yaml.safe_dump(params.to_dict(), sort_keys=False))
    record = {**record, "run_id": final.name, **({"resume": {"from": shown(resume)}} if resume else {})}
    archive.write_record(tmp, record)
    archive.write_json(tmp / "metrics.json", {})

    stop = []

    def on_signal(signum, frame):  # Ctrl-C and SIGTERM: stop, archive as interrupted
        stop.append(signum)
        raise _Interrupted()

    # Both raise rlwb's own BaseException, not KeyboardInterrupt: a library that swallows KeyboardInterrupt
    # inside its event loop (a Ctrl-C sent while papermill starts a kernel, lost there, lets a sweep run on)
    # cannot swallow this one, and `stop` records the signal even if something did.
    old_term = signal.signal(signal.SIGTERM, on_signal)
    old_int = signal.signal(signal.SIGINT, on_signal)
    old_env = os.environ.get("RLWB_RUN_DIR")
    os.environ["RLWB_RUN_DIR"] = str(tmp)
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = kernel_pythonpath(REPO_ROOT, old_path)
    error = None
    echo = ProgressEcho(tmp / PROGRESS_LOG)
    try:
        import papermill as pm

        echo.start()
        pm.execute_notebook(str(nb), str(tmp / "notebook.ipynb"), parameters=params.to_dict(),
                            kernel_name="python3", cwd=str(nb.parent), progress_bar=False, log_output=log_output,
                            kernel_manager_class=ipc_kernel_manager(kernel_socket_dir()))
    except (KeyboardInterrupt, _Interrupted):
        error = "interrupted"
    except Exception as e:  # papermill's execution error carries the cell's exception
        ename, evalue = getattr(e, "ename", None), getattr(e, "evalue", None)
        error = f"{ename}: {evalue}" if ename else f"{type(e).__name__}: {e}"
    finally:
        echo.stop()
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
        if stop and error is None:
            error = "interrupted"
        for name, value in (("RLWB_RUN_DIR", old_env), ("PYTHONPATH", old_path)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    # Finish: provenance, HTML, atomic rename. The notebook's own run.json updates (engines, model) stay.
    record = archive.finish_record(archive.read_record(tmp, record), started, error)
    archive.write_record(tmp, record)
    t_report = time.time()
    if (tmp / "notebook.ipynb").exists():
        try:
            from rlwb.reports.export import export_report  # matplotlib: imported only once a report is due

            export_report(tmp / "notebook.ipynb", tmp / "report.html", tmp, error)
        except Exception as e:  # a report that cannot render is a failed run, not a silent gap
            error = error or f"report.html: {type(e).__name__}: {e}"
            record = {**record, "status": "failed", "error": error}
    # the wall time up to here, split by phase (rlwb.timing): the kernel's totals plus the report's rendering
    total = round(time.time() - started, 2)
    kernel = archive.read_json(tmp / "logs" / archive.TIMING_FILE, {})
    record = {**record, "duration_s": total, "time_s": timing.split(kernel, total, time.time() - t_report)}
    archive.write_record(tmp, record)
    tmp.rename(final)
    if error:
        raise RunFailed(final, error)
    archive.update_latest(root, nb.stem, final)
    return final
