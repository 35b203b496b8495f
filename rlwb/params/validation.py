"""Turning values from YAML, `-p` overrides and parameters cells into a validated params object.

Why validate here: papermill only *warns* about unknown parameters and never checks types, so a typo
(`temprature: 0.7`) would silently run the default. Loading merges defaults <- YAML files (in order) <- overrides and
validates everything *before any compute*: pydantic checks each value against its declaration (strict type, ranges,
choices and check of `rlwb.core.checked_fields.param`), then the schema's `__post_init__` the rules across fields.
An unknown key, a wrong type or an out-of-range value raises a one-line `ParamError` naming the key and what is
allowed.
"""

from __future__ import annotations

import ast
import difflib
import functools
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from pydantic_core import PydanticCustomError

from rlwb.errors import ParamError
from rlwb.params.schemas.base import Params


def schema_for(notebook: str) -> type[Params]:
    """The params dataclass of a notebook (by stem or path): its record in `rlwb.registry`."""
    from rlwb.registry import notebook as record

    return record(notebook).schema


def type_name(tp) -> str:
    """`int`, `list[float]`: a type as the parameters cell writes it."""
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


# strict: no coercion ("3" is not 3, 1.5 not 1, True not 1; an int is a float); finite floats; unknown keys refused;
# defaults checked too (a default engine whose environment is missing fails here, not at engine start)
STRICT = ConfigDict(strict=True, extra="forbid", validate_default=True, allow_inf_nan=False)
BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"), "less_than_equal": ("le", "<="),
          "less_than": ("lt", "<")}  # pydantic's error type -> the `param` rule and how a message writes it
TYPE_ERRORS = {"int_type": "must be an int", "float_type": "must be a number", "bool_type": "must be true or false",
               "string_type": "must be a string", "finite_number": "must be finite", "list_type": "must be a list"}


def _value_rules(meta: dict) -> AfterValidator:
    """A `param`'s `choices` and `check`, on one value (each item of a list setting)."""
    def rules(value):
        choices = meta["choices"]
        allowed = choices() if callable(choices) else choices
        if allowed is not None and value not in allowed:
            raise ValueError(f"{value!r} is not allowed; allowed: {allowed}")
        if meta["check"] is not None and (msg := meta["check"](value)):
            raise ValueError(msg)
        return value

    return AfterValidator(rules)


def _no_repeats(values: list) -> list:
    if len(set(values)) != len(values):
        raise PydanticCustomError("not_unique", "lists an entry twice")
    return values


def _plain_number(value):
    """A float setting takes a Python int or float only: pydantic's strict float still takes numpy's scalars, and
    `np.float32(0.1)` would enter the params (and their hash) as 0.10000000149011612."""
    if type(value) not in (int, float):
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return value


def _integral_as_int(value):
    """A count that may be fractional (`int | float`) keeps an integral value an int: `2.0` is read as `2`, so the
    params, their labels and their hash are those of the count."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


COUNT = int | float  # an item type: a count that may be fractional (`mismatch_doses.DoseKind.unit`)


@functools.cache
def model(schema: type[Params]) -> type[BaseModel]:
    """The pydantic model that checks a schema's values: each field's type (strict) with its `param` rules, the
    ranges as pydantic constraints, a list's rules on each item, its length unless `allow_empty`, no repeated item
    where `unique`.

    Built from the dataclass rather than declared as one: the declarations are shared with core
    (`GRPOSettings` is also the base of a run's `GRPOConfig`, which the loop builds without validating), and a list
    setting's rules apply to its items, which a field's default cannot say to pydantic."""
    hints, spec = typing.get_type_hints(schema), {}
    for f in fields(schema):
        m, tp = f.metadata, hints[f.name]
        bounds = {k: m[k] for k in ("ge", "gt", "le", "lt") if m[k] is not None}
        is_list = typing.get_origin(tp) is list
        item_type = typing.get_args(tp)[0] if is_list else tp
        plain = (BeforeValidator(_plain_number),) if item_type in (float, COUNT) else ()
        count = (AfterValidator(_integral_as_int),) if item_type == COUNT else ()
        item = Annotated[(item_type, *plain, Field(**bounds), *count, _value_rules(m))]
        once = (AfterValidator(_no_repeats),) if m.get("unique") else ()
        ann = Annotated[(list[item], Field(min_length=0 if m["allow_empty"] else 1), *once)] if is_list else item
        default = Field(default_factory=f.default_factory) if f.default is MISSING else Field(default=f.default)
        spec[f.name] = (ann, default)
    return create_model(schema.__name__, __config__=STRICT, **spec)


def unknown_message(schema: type[Params], unknown) -> str:
    """Unknown parameter names, each with the known name it most resembles (a typo is the usual cause)."""
    known = [f.name for f in fields(schema)]
    unknown = sorted(unknown, key=str)
    close = {u: difflib.get_close_matches(str(u), known, n=1) for u in unknown}
    hints = "; ".join(f"{u!r}: did you mean {c[0]!r}?" for u, c in close.items() if c)
    return (f"unknown parameter(s) {unknown} for {schema.NOTEBOOK}" + (f" ({hints})" if hints else "")
            + f"; allowed: {sorted(known)}")


def error_message(schema: type[Params], errors: list[dict]) -> str:
    """One line for pydantic's errors: the unknown keys, else the first problem as a field-by-field check meets
    it (in field order; a list's item types, then its items' rules, then its length, then its repeats)."""
    unknown = [e["loc"][0] for e in errors if e["type"] in ("extra_forbidden", "invalid_key")]  # a YAML `1: x`
    if unknown:
        return unknown_message(schema, unknown)
    order = {f.name: (i, f) for i, f in enumerate(fields(schema))}
    stage = {**dict.fromkeys(TYPE_ERRORS, 0), "too_short": 2, "not_unique": 3}

    def key(e):
        return order[e["loc"][0]][0], stage.get(e["type"], 1), e["loc"][1:]

    e = min(errors, key=key)
    name, kind, value = e["loc"][0], e["type"], e["input"]
    f = order[name][1]
    tp = typing.get_type_hints(schema)[name]
    label = f"{name}[{e['loc'][1]}]" if len(e["loc"]) > 1 else name
    if kind == "list_type":
        return f"parameter {label!r} must be a list of {type_name(typing.get_args(tp)[0])}, got {value!r}"
    if kind in ("bool_type", "finite_number"):
        return f"parameter {label!r} {TYPE_ERRORS[kind]}, got {value!r}"
    if kind in TYPE_ERRORS:
        return f"parameter {label!r} {TYPE_ERRORS[kind]}, got {value!r} ({type(value).__name__})"
    if kind in BOUNDS:
        rule, word = BOUNDS[kind]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
        shown = value if item == COUNT else item(value)
        return f"parameter {label!r} must be {word} {f.metadata[rule]}, got {shown!r}"
    if kind == "too_short":
        return f"parameter {label!r} must not be an empty list"
    if kind == "not_unique":
        return f"parameter {label!r} lists an entry twice: {value}"
    if kind == "value_error":
        return f"parameter {label!r}: {e['ctx']['error']}"
    return f"parameter {label!r}: {e['msg']}"


def validate(schema: type[Params], values: dict) -> Params:
    """Build the params object from a flat mapping; every problem raises `ParamError`. The values pydantic
    checked (an int given for a float is a float) make the dataclass, whose `__post_init__` checks the rules
    across fields."""
    try:
        checked = model(schema).model_validate(values)
    except ValidationError as e:
        raise ParamError(error_message(schema, e.errors())) from None
    return schema(**{f.name: getattr(checked, f.name) for f in fields(schema)})


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
        raise ParamError(unknown_message(schema, unknown))
    missing = [k for k in known if k not in ns]
    if missing:
        raise ParamError(f"the parameters cell does not define {missing}")
    return validate(schema, {k: ns[k] for k in known})
