"""Turning values from YAML, `-p` overrides and parameters cells into a validated params object.

Why our own validation: papermill only *warns* about unknown parameters and never checks types, so a
typo (`temprature: 0.7`) would silently run the default. Loading merges defaults <- YAML files (in order)
<- overrides and validates everything *before any compute*: an unknown key, a wrong type or an
out-of-range value raises `ParamError` naming the key and what is allowed.
"""

from __future__ import annotations

import ast
import math
import typing
from dataclasses import MISSING, fields
from pathlib import Path

import yaml

from rlwb.errors import ParamError
from rlwb.params.schemas.base import Params


def schema_for(notebook: str) -> type[Params]:
    """The params dataclass of a notebook (by stem or path): its record in `rlwb.registry`."""
    from rlwb.registry import notebook as record

    return record(notebook).schema


def type_name(tp) -> str:
    """`int`, `list[float]`: a type as the parameters cell writes it."""
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check_type(key: str, value, tp):
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ParamError(f"parameter {key!r} must be a list of {type_name(item)}, got {value!r}")
        return [_check_type(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ParamError(f"parameter {key!r} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(f"parameter {key!r} must be an int, got {value!r} ({type(value).__name__})")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(f"parameter {key!r} must be a number, got {value!r} ({type(value).__name__})")
        if not math.isfinite(value):
            raise ParamError(f"parameter {key!r} must be finite, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ParamError(f"parameter {key!r} must be a string, got {value!r} ({type(value).__name__})")
        return value
    raise TypeError(f"unsupported parameter type {tp}")


def _check_rules(key: str, value, meta: dict) -> None:
    choices = meta.get("choices")
    if choices is not None:
        allowed = choices() if callable(choices) else choices
        if value not in allowed:
            raise ParamError(f"parameter {key!r}: {value!r} is not allowed; allowed: {allowed}")
    for rule, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                           ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        bound = meta.get(rule)
        if bound is not None and not ok(value, bound):
            raise ParamError(f"parameter {key!r} must be {word} {bound}, got {value!r}")
    check = meta.get("check")
    if check is not None:
        msg = check(value)
        if msg:
            raise ParamError(f"parameter {key!r}: {msg}")


def validate(schema: type[Params], values: dict) -> Params:
    """Build the params object from a flat mapping; every problem raises `ParamError`."""
    known = {f.name: f for f in fields(schema)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ParamError(f"unknown parameter(s) {unknown} for {schema.NOTEBOOK}; allowed: {sorted(known)}")
    hints = typing.get_type_hints(schema)
    out = {}
    for name, f in known.items():
        if name in values:
            v = values[name]
        elif f.default is not MISSING:
            v = f.default
        else:
            v = f.default_factory()  # type: ignore[misc]
        v = _check_type(name, v, hints[name])
        for i, item in enumerate(v if isinstance(v, list) else [v]):
            _check_rules(f"{name}[{i}]" if isinstance(v, list) else name, item, dict(f.metadata))
        if isinstance(v, list) and not v and not f.metadata.get("allow_empty"):
            raise ParamError(f"parameter {name!r} must not be an empty list")
        out[name] = v
    return schema(**out)


def read_yaml(path: str | Path) -> dict:
    """A flat params mapping from a YAML file; syntax errors name the file and line."""
    path = Path(path)
    if not path.exists():
        raise ParamError(f"params file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ParamError(f"params file {where}: malformed YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamError(f"params file {path} must hold a mapping of parameter: value, got {type(data).__name__}")
    return data


def load(notebook: str, files: list[str | Path] = (), overrides: dict | None = None) -> Params:
    """defaults <- each file in order <- overrides, then validate. A retired param (`Params.RETIRED`) an older
    run's params.yaml holds is dropped; as an override it is an error naming what replaced it."""
    schema = schema_for(notebook)
    merged: dict = {}
    for f in files:
        merged.update({k: v for k, v in read_yaml(f).items() if k not in schema.RETIRED})
    for k in set(overrides or {}) & set(schema.RETIRED):
        raise ParamError(f"parameter {k!r} of {schema.NOTEBOOK}: {schema.RETIRED[k]}")
    merged.update(overrides or {})
    return validate(schema, merged)


def parse_override(key: str, text: str):
    """`-p KEY VALUE`: VALUE is YAML (so '[0.6, 1.0]' is a list and '7' an int)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ParamError(f"-p {key}: value {text!r} is not valid YAML: {e}") from None


def injected_names(cell_sources: list[str]) -> set[str]:
    """Names assigned in papermill's injected cells (they start with '# Parameters')."""
    names: set[str] = set()
    for src in cell_sources:
        if not src.lstrip().startswith("# Parameters"):
            continue
        for node in ast.parse(src).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def from_namespace(notebook: str, ns: dict) -> Params:
    """Validate the values a notebook's parameters cell (and papermill's injected cell) left in `ns`.

    Names injected by papermill that the schema does not know are errors here (papermill only warns).
    """
    schema = schema_for(notebook)
    known = {f.name for f in fields(schema)}
    unknown = injected_names([s for s in ns.get("In", []) if isinstance(s, str)]) - known
    if unknown:
        raise ParamError(f"unknown parameter(s) {sorted(unknown)} for {schema.NOTEBOOK}; allowed: {sorted(known)}")
    missing = [k for k in known if k not in ns]
    if missing:
        raise ParamError(f"the parameters cell does not define {missing}")
    return validate(schema, {k: ns[k] for k in known})
