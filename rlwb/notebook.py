"""What a notebook's validation cell calls: params from the parameters cell, checked, and a run handle.

    params, run = rlwb.notebook.start("01_logprob_mismatch", globals())
"""

from __future__ import annotations

from .archive import Run, start_notebook_run
from .params import Params, from_namespace
from .plots import set_style


def start(notebook: str, namespace: dict, style: str = "notebook") -> tuple[Params, Run]:
    params = from_namespace(notebook, namespace)
    set_style(style)
    return params, start_notebook_run(params)
