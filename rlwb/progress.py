"""Progress bars that suit where they are shown: live on a terminal and in JupyterLab, sparse in logs,
never in an archived report.

Why: tqdm redraws a bar up to ten times a second. On a terminal that is one line rewritten in place; in a
log file (`make setup > log`, CI, `nohup`) every redraw is a line of its own, and building the default
policy wrote ~800 of them. Here, when stderr is neither a terminal nor a Jupyter kernel, a bar prints a
whole line at most every `LOG_INTERVAL_S` seconds, plus its final state. Inside an archived run (`rlwb run`:
a kernel with RLWB_RUN_DIR set) the bars go to the kernel process's own stderr - the terminal or log of
`rlwb run` - instead of into the executed notebook, where they were a pink block of redraws in report.html.
"""

from __future__ import annotations

import io
import os
import sys

LOG_INTERVAL_S = 30.0


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

    stream = sys.__stderr__ if kernel else sys.stderr  # an archived run: the terminal of `rlwb run`, not the report
    if stream is None:
        return tqdm(iterable, desc=desc, total=total, disable=True, **kwargs)
    if stream.isatty():
        return tqdm(iterable, desc=desc, total=total, disable=disable, leave=leave, file=stream, **kwargs)
    return tqdm(iterable, desc=desc, total=total, disable=disable, leave=True, file=_LineLog(stream),
                mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S, miniters=1, ascii=True, **kwargs)
