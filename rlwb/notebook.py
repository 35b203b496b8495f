"""What a notebook's validation cell calls: params from the parameters cell, checked, and a run handle.

    params, run = rlwb.notebook.start("01_logprob_mismatch", globals())
"""

from __future__ import annotations

import os
import warnings

if os.environ.get("RLWB_RUN_DIR"):  # an archived run: its bars go to the terminal (rlwb.progress), so tqdm's
    # advice to install ipywidgets for notebook bars (raised when a library imports tqdm.auto) is noise there
    warnings.filterwarnings("ignore", message="IProgress not found")

from rlwb.archive import Run, start_notebook_run  # noqa: E402
from rlwb.params import Params, from_namespace  # noqa: E402
from rlwb.plots import set_style  # noqa: E402


def start(notebook: str, namespace: dict, style: str = "notebook") -> tuple[Params, Run]:
    """Validate the parameters, plan GPU memory (on CUDA; raises before any compute when the run cannot
    fit), and open the run; the plan goes into run.json."""
    from rlwb.memory_plan import plan_for_run
    from rlwb.registry import notebook as record

    params = from_namespace(notebook, namespace)
    set_style(style)
    if os.environ.get("RLWB_RUN_DIR"):  # an archived run: transformers' "Loading weights" bars stay out of it
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    plan = plan_for_run(notebook, record(notebook).needs, params)
    run = start_notebook_run(params)
    run.record_memory_plan(plan)
    return params, run
