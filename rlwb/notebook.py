"""What a notebook's cells call: params from the parameters cell, checked, and a run handle; the model.

    params, run = rlwb.notebook.start("01_logprob_mismatch", globals())
    model_path = rlwb.notebook.use_model(run, params.model)
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


def use_model(run: Run, model: str, rebuild: bool = False):
    """Resolve a `model` param (building an embedded model if needed, or again with `rebuild`) and record it in
    the run's run.json (`Run.record_model`: the archive records, it does not build); returns what engines and the
    trainer load (a path, or an HF id)."""
    from rlwb import timing
    from rlwb.core.models import store

    with timing.phase("model"):
        if model in store.EMBEDDED_NAMES:
            built = store.build_embedded_model(model, force=rebuild)
            run.record_model(built.path, built.card)
            return built.path
        path = store.resolve_model(model)
        run.record_model(path, store.model_card(path))
        return path
