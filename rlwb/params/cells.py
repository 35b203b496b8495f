"""What the schemas generate: each notebook's `parameters` cell and `params/<stem>/default.yaml`.

`rlwb sync-params` writes both from the schemas, so adding a parameter is one edit (the dataclass) and one
command; `tests/test_params.py` fails, naming that command, whenever a committed file is out of date.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, fields
from pathlib import Path

import yaml

from rlwb.params.schemas import SCHEMAS, Params
from rlwb.params.validation import type_name, validate
from rlwb.paths import NOTEBOOKS_DIR, PARAMS_DIR


def parameters_cell(schema: type[Params]) -> str:
    """The source of a notebook's `parameters` cell: flat, typed, one comment per value.

    A doc must not contain "=": papermill's `--help-notebook` parses these lines and would cut it there."""
    hints = typing.get_type_hints(schema)
    lines = []
    for f in fields(schema):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        lines.append(f"{f.name}: {type_name(hints[f.name])} = {default!r}  # {f.metadata['doc']}")
    return "\n".join(lines)


def defaults_yaml(schema: type[Params]) -> str:
    """`params/<stem>/default.yaml`: every parameter at its default, one commented line each."""
    d = validate(schema, {}).to_dict()
    lines = [f"# Defaults of notebooks/{schema.NOTEBOOK}.ipynb (written by `rlwb sync-params` from rlwb.params)"]
    for f in fields(schema):
        value = yaml.safe_dump(d[f.name], default_flow_style=True, width=1000).strip().removesuffix("...").strip()
        lines.append(f"{f.name}: {value}  # {f.metadata['doc']}")
    return "\n".join(lines) + "\n"


def _parameters_cell_index(nb, path: Path) -> int:
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"{path}: expected exactly one cell tagged `parameters`, found {len(tagged)}")
    return tagged[0]


def out_of_date(notebooks_dir: Path = NOTEBOOKS_DIR, params_dir: Path = PARAMS_DIR) -> list[Path]:
    """The notebooks and default.yaml files whose content differs from what the schemas generate."""
    return sync(notebooks_dir, params_dir, write=False)


def sync(notebooks_dir: Path = NOTEBOOKS_DIR, params_dir: Path = PARAMS_DIR, write: bool = True) -> list[Path]:
    """Rewrite every notebook's parameters cell and every `default.yaml` from the schemas; return the files
    that changed (or, with `write=False`, that would). Other cells and notebook metadata stay as they are."""
    import nbformat

    changed = []
    for stem, schema in SCHEMAS.items():
        nb_path = notebooks_dir / f"{stem}.ipynb"
        nb = nbformat.read(nb_path, as_version=4)
        i = _parameters_cell_index(nb, nb_path)
        cell = parameters_cell(schema)
        if nb.cells[i].source != cell:
            changed.append(nb_path)
            if write:
                nb.cells[i].source = cell
                nbformat.write(nb, nb_path)
        y_path = params_dir / stem / "default.yaml"
        text = defaults_yaml(schema)
        if not y_path.exists() or y_path.read_text() != text:
            changed.append(y_path)
            if write:
                y_path.parent.mkdir(parents=True, exist_ok=True)
                y_path.write_text(text)
    return changed
