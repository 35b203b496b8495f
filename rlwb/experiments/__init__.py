"""One module per notebook, named after it (`notebooks/NN_<name>.ipynb` -> `rlwb/experiments/<name>.py`),
each with the same entry point `run(params, model_path, *, on_start=None, progress=True) -> Result`
(the shape: `base.py`). Which notebooks there are is `rlwb.registry.NOTEBOOKS`; modules that are not a
notebook's (`base`, shared grids) are the helpers the experiments share."""
