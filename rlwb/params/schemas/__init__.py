"""The parameters of every notebook: one dataclass each, the single source of names, defaults, docs and ranges.

One module per notebook, named as its experiment (`rlwb/experiments/<name>.py` -> `schemas/<name>.py`); `base.py`
holds what several share (`Params`, the engine notebooks' fields, the checks of a preset or a model). Fields are
`rlwb.core.checked_fields.param`s; settings that belong to a core module are inherited from it instead of repeated
(`toy_grpo.GRPOParams` is `rlwb.core.rl.grpo_config.GRPOSettings` plus the notebook's own fields). Validation,
YAML loading and the generated parameters cells live beside this package (`validation.py`, `cells.py`).
"""
