"""Documented, range-checked dataclass fields: how every setting rlwb exposes is declared, once.

A field made with `param` carries its one-line doc and its rules in the dataclass metadata. The notebook
schemas (`rlwb.params.schemas`) are built from such fields, and so are the core settings a notebook exposes
unchanged (e.g. `rlwb.core.rl.grpo_config.GRPOSettings`, which notebook 03's `GRPOParams` inherits): one declaration
per setting. `rlwb.params.validation` turns the rules into a pydantic model that checks a notebook's values;
`rlwb sync-params` writes the docs into parameters cells and `default.yaml`. A declaration is a plain dataclass field,
so core modules declare settings without importing the parameter machinery or pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")  # what engines and the trainer accept, by torch's name


def param(default, doc: str, *, choices: list | tuple | Callable[[], list] | None = None, ge=None, gt=None,
          le=None, lt=None, check: Callable[[Any], str | None] | None = None, allow_empty: bool = False,
          unique: bool = False):
    """A documented setting. Range and choice rules apply to each item of a list setting; `check` returns an
    error message (or None) for rules a range cannot express. A list setting must not be empty unless
    `allow_empty` (a section the empty list simply skips), nor list an item twice if `unique` (a grid axis, a set
    of engines: a repeat would run or count the same thing twice). The doc becomes the parameter's comment in the
    notebook's parameters cell, where an `=` would make papermill drop the parameter from `--help-notebook`
    (it skips a line with two), so it is refused here."""
    if "=" in doc:
        raise ValueError(f"parameter doc {doc!r} contains '=': papermill's --help-notebook would skip the parameter")
    kw = {"default_factory": (lambda d=default: list(d))} if isinstance(default, list) else {"default": default}
    meta = {"doc": doc, "choices": list(choices) if isinstance(choices, tuple) else choices, "ge": ge, "gt": gt,
            "le": le, "lt": lt, "check": check, "allow_empty": allow_empty, "unique": unique}
    return field(metadata=meta, **kw)
