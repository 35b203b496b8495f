"""One module per notebook, named after it (`notebooks/NN_<stem>.ipynb` -> `rlwb/experiments/<stem>.py`),
each with the same entry point `run(params, model_path, *, on_start=None, progress=True) -> Result`
(the shape: `base.py`)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from rlwb.errors import ParamError

NOTEBOOKS = ("00_default_policy", "01_logprob_mismatch", "02_kl_vs_temperature", "03_toy_grpo",
             "04_determinism_and_staleness", "05_equivalence_and_stress", "07_which_correction")


def module_name(notebook: str) -> str:
    """`01_logprob_mismatch` (or a path to it) -> `logprob_mismatch`."""
    return Path(notebook).stem.split("_", 1)[1]


def experiment_for(notebook: str) -> ModuleType:
    """The experiment module of a notebook."""
    stem = Path(notebook).stem
    if stem not in NOTEBOOKS:
        raise ParamError(f"no experiment for notebook {stem!r}; known: {list(NOTEBOOKS)}")
    return importlib.import_module(f"rlwb.experiments.{module_name(stem)}")
