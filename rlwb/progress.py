"""Progress bars that suit where they are shown: live on a terminal and in JupyterLab, sparse in logs,
never in an archived report.

Why: tqdm redraws a bar up to ten times a second. On a terminal that is one line rewritten in place; in a
log file (`make setup > log`, CI, `nohup`) every redraw is a line of its own, and building the default
policy wrote ~800 of them. Here, when stderr is neither a terminal nor a Jupyter kernel, a bar prints a
whole line at most every `LOG_INTERVAL_S` seconds, plus its final state. Inside an archived run (`rlwb run`:
a kernel with RLWB_RUN_DIR set) the bars are written as such lines to `logs/progress.log` in the run
directory, and `rlwb run` echoes that file to its own stderr while the notebook runs: progress on the
terminal, a record of where the time went in the archive, nothing in report.html. (Not the kernel's own
stderr: ipykernel captures file descriptor 2 and forwards it into the notebook's outputs.)
"""

from __future__ import annotations

import io
import os
import sys

LOG_INTERVAL_S = 30.0
PROGRESS_LOG = "logs/progress.log"  # inside an archived run's directory
_run_log = None


def _in_kernel() -> bool:
    """True inside an IPython kernel (JupyterLab, papermill), where tqdm.auto draws its own widgets/text."""
    shell = sys.modules.get("IPython") and getattr(sys.modules["IPython"], "get_ipython", lambda: None)()
    return bool(shell) and "IPKernelApp" in getattr(shell, "config", {})


class _LineLog(io.TextIOBase):
    """Turns tqdm's carriage-return redraws into whole lines, dropping blank clears."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s: str) -> int:
        text = s.replace("\x1b[A", "").replace("\r", "\n")
        for line in text.split("\n"):
            if line.strip():
                self.stream.write(line.rstrip() + "\n")
        return len(s)

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable=None, *, desc: str, total: int | None = None, disable: bool = False, leave: bool = True,
             **kwargs):
    """`tqdm` for rlwb's long loops. Same arguments as tqdm; see the module docstring for where it prints."""
    kernel = _in_kernel()
    if kernel and not os.environ.get("RLWB_RUN_DIR"):  # JupyterLab: the notebook's own widgets / text
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, total=total, disable=disable, leave=leave, **kwargs)
    from tqdm import tqdm

    stream = _archived_run_log() if kernel else sys.stderr  # an archived run: its log, echoed by `rlwb run`
    if stream is None:
        return tqdm(iterable, desc=desc, total=total, disable=True, **kwargs)
    if stream.isatty():
        return tqdm(iterable, desc=desc, total=total, disable=disable, leave=leave, file=stream, **kwargs)
    return _log_tqdm()(iterable, desc=desc, total=total, disable=disable, leave=True, file=_LineLog(stream),
                       mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S, miniters=1, ascii=True, **kwargs)


def progress_stream():
    """Where a child process's progress lines go (a model build): the run's progress log inside an archived run
    (never report.html), else our stderr."""
    return _archived_run_log() if _in_kernel() and os.environ.get("RLWB_RUN_DIR") else sys.stderr


def _log_tqdm():
    """tqdm whose postfix changes wait for its next timed line. Why: `set_postfix` redraws at once by default,
    which in a log is a line per call (a GRPO loop's per-step reward: one line per step), and shows the count
    tqdm last synced (a `for x in bar` loop syncs it only when it draws: `0/50` on every line)."""
    from tqdm import tqdm

    class LogTqdm(tqdm):
        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            super().set_postfix(ordered_dict, refresh=False, **kwargs)

        def set_postfix_str(self, s="", refresh=True):
            super().set_postfix_str(s, refresh=False)

    return LogTqdm


def _archived_run_log():
    """The run directory's progress log (line buffered), opened once per kernel."""
    global _run_log
    if _run_log is None:
        from pathlib import Path

        path = Path(os.environ["RLWB_RUN_DIR"]) / PROGRESS_LOG
        path.parent.mkdir(parents=True, exist_ok=True)
        _run_log = open(path, "a", buffering=1)  # noqa: SIM115 (open for the kernel's lifetime)
    return _run_log
