"""Typed, validated notebook parameters.

`schemas/`: one dataclass per notebook (names, defaults, docs, ranges). `validation.py`: YAML files and
overrides -> a validated params object, errors before any compute. `cells.py`: the parameters cells and
`default.yaml` files generated from the schemas (`rlwb sync-params`). Which schema belongs to which notebook is
the notebook's record in `rlwb.registry`.
"""

from rlwb.errors import ParamError
from rlwb.params.schemas.base import Params
from rlwb.params.validation import from_namespace, load, parse_override, read_yaml, schema_for, validate

__all__ = ["ParamError", "Params", "from_namespace", "load", "parse_override", "read_yaml", "schema_for", "validate"]
