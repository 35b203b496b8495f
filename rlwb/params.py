"""Typed, validated parameters: one dataclass per notebook, the single source of their defaults.

Why our own validation: papermill only *warns* about unknown parameters and never checks types, so a
typo (`temprature: 0.7`) would silently run the default. Here loading merges
defaults <- YAML files (in order) <- overrides and then validates everything *before any compute*: an
unknown key, a wrong type or an out-of-range value raises `ParamError` naming the key and what is allowed.
Derived values (e.g. the list of GRPO seeds) are properties computed after validation.

The notebooks' `parameters` cells are generated from these dataclasses (`parameters_cell`), and a test
keeps the committed cells, `params/<stem>/default.yaml` and the dataclasses in agreement.
"""

from __future__ import annotations

import hashlib
import json
import math
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import yaml


class ParamError(ValueError):
    """A parameter is unknown, mistyped or out of range; the message names it and what is allowed."""


def P(default, doc: str, *, choices: list | Callable[[], list] | None = None, ge=None, gt=None, le=None,
      lt=None, check: Callable[[Any], str | None] | None = None):
    """A documented parameter. Range/choice rules apply to each item of a list parameter."""
    kw = {"default_factory": (lambda d=default: list(d))} if isinstance(default, list) else {"default": default}
    return field(metadata={"doc": doc, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "check": check},
                 **kw)


def _engine_presets() -> list[str]:
    from .engines.presets import available_presets

    return available_presets()


def _check_engine(name: str) -> str | None:
    """A known preset whose interpreter exists (else the run would fail minutes later, at engine start)."""
    from .engines.presets import PresetError, resolve_preset

    try:
        resolve_preset(name).check_interpreter()
    except PresetError as e:
        return str(e)
    return None


def _check_model(value: str) -> str | None:
    """`default`, an existing model directory holding a causal LM, or a hub id (loaded by the user's GPU box)."""
    if value == "default":
        return None
    p = Path(value).expanduser()
    looks_like_path = value.startswith(("/", ".", "~")) or p.exists() or value.count("/") != 1
    if not looks_like_path:
        return None  # an HF hub id like "Qwen/Qwen2.5-0.5B-Instruct": resolved where it is used
    if not p.is_dir():
        return f"model path {value!r} does not exist (use 'default', a model directory, or an HF id 'org/name')"
    cfg = p / "config.json"
    if not cfg.exists():
        return f"model directory {value!r} has no config.json: not a transformers model"
    try:
        archs = json.loads(cfg.read_text()).get("architectures") or []
    except json.JSONDecodeError:
        return f"model directory {value!r}: config.json is not valid JSON"
    if not any(a.endswith("ForCausalLM") for a in archs):
        return f"model directory {value!r} is not a causal LM (architectures: {archs})"
    return None


DTYPES = ["float32", "bfloat16", "float16"]


@dataclass
class Params:
    """Base: fields every notebook has. Subclasses add theirs."""

    NOTEBOOK: typing.ClassVar[str] = ""
    HEADLINE: typing.ClassVar[list[str]] = []  # metric keys shown by `rlwb runs` / the index

    seed: int = P(0, "base random seed (prompts, sampling, training)", ge=0)

    # -- derived ------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    def hash(self) -> str:
        """8 hex digits over the fully resolved params: names the run directory."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:8]


@dataclass
class DefaultPolicyParams(Params):
    NOTEBOOK: typing.ClassVar[str] = "00_default_policy"
    HEADLINE: typing.ClassVar[list[str]] = ["policy/greedy_accuracy", "policy/mean_completion_tokens"]

    eval_prompts: int = P(200, "held-out problems for greedy accuracy", ge=1)
    sample_rows: int = P(12, "completions shown in the samples table", ge=0)
    rebuild: bool = P(False, "rebuild the default model even if a cached build exists")


@dataclass
class EngineParams(Params):
    """Fields of every notebook that uses engines."""

    model: str = P("default", "'default' (embedded policy), a model directory, or an HF id", check=_check_model)
    engines: list[str] = P(["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"],
                           "engine presets (params/engines.yaml), in ladder order", choices=_engine_presets, check=_check_engine)
    dtype: str = P("float32", "engine weights/activations dtype", choices=DTYPES)


@dataclass
class EngineExperimentParams(EngineParams):
    """Fields shared by the experiments that sample from engines and score with the trainer."""

    trainer_dtype: str = P("float32", "trainer (scorer) dtype", choices=DTYPES)
    prompts: int = P(64, "number of task prompts sampled per engine", ge=1)
    max_tokens: int = P(32, "max completion tokens per request", ge=1)


@dataclass
class MismatchParams(EngineExperimentParams):
    NOTEBOOK: typing.ClassVar[str] = "01_logprob_mismatch"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/abs_dlogp_max", "vllm-v1-fixed/abs_dlogp_max",
                                             "vllm-v0/abs_dlogp_max"]

    temperature: float = P(0.7, "sampling temperature (> 0)", gt=0, le=10)
    top_p: float = P(1.0, "nucleus sampling mass in (0, 1]; 1 means off", gt=0, le=1)
    top_k: int = P(0, "top-k sampling; 0 means off", ge=0)
    clip_eps: float = P(0.2, "PPO clip epsilon for clip_frac", gt=0, lt=1)
    full_vocab: bool = P(True, "also fetch full-vocabulary logprobs (exact KL); small vocabularies only")
    heterogeneous_batch: bool = P(False, "mix prompts of very different lengths into one batch")
    reward_samples: int = P(512, "rollouts per engine for the reward-equivalence test (8 per prompt); 0 skips it",
                            ge=0)


@dataclass
class KLTemperatureParams(EngineExperimentParams):
    NOTEBOOK: typing.ClassVar[str] = "02_kl_vs_temperature"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/T=0.5/k3_mean", "vllm-v0/T=0.5/k3_mean"]

    engines: list[str] = P(["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed"],
                           "engine presets (params/engines.yaml)", choices=_engine_presets, check=_check_engine)
    prompts: int = P(32, "number of task prompts sampled per engine and setting", ge=1)
    temperatures: list[float] = P([0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.3, 1.5], "sampling temperatures (> 0)",
                                  gt=0, le=10)
    top_p_values: list[float] = P([1.0, 0.9], "top-p variants; 1.0 means untruncated", gt=0, le=1)
    top_k_values: list[int] = P([0], "top-k variants; 0 means off", ge=0)
    full_vocab: bool = P(True, "also fetch full-vocabulary logprobs (exact KL); small vocabularies only")


@dataclass
class GRPOParams(EngineParams):
    NOTEBOOK: typing.ClassVar[str] = "03_toy_grpo"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1-fixed+none/reward_last", "vllm-v1+none/reward_last"]

    engines: list[str] = P(["vllm-v0", "vllm-v1", "vllm-v1-fixed"], "engine presets that generate the rollouts",
                           choices=_engine_presets, check=_check_engine)
    corrections: list[str] = P(["none", "tis"], "off-policy corrections: none, tis, mis, seq_mask",
                               choices=["none", "tis", "mis", "seq_mask"])
    num_seeds: int = P(3, "seeds per configuration: seed, seed+1, ...", ge=1)
    steps: int = P(50, "GRPO steps per run", ge=1)
    prompts_per_step: int = P(8, "distinct prompts per step", ge=1)
    group_size: int = P(8, "completions per prompt (the GRPO group)", ge=2)
    lr: float = P(1.5e-4, "AdamW learning rate of the trainer", gt=0, lt=1)
    temperature: float = P(0.7, "sampling temperature (> 0)", gt=0, le=10)
    max_tokens: int = P(32, "max completion tokens", ge=1)
    old_logprobs: str = P("engine", "behaviour logprobs in the PPO ratio: engine or trainer",
                          choices=["engine", "trainer"])
    clip_eps: float = P(0.2, "PPO clip epsilon", gt=0, lt=1)
    tis_cap: float = P(2.0, "TIS truncation cap C", gt=0)
    drift_threshold: float = P(1e-5, "drift monitor: k3 level (mean of 2-step windows, twice in a row) that trips "
                                     "it; 0 turns it off", ge=0)
    micro_batch: int = P(0, "sequences per forward/backward of the update (gradient accumulation); "
                            "0 means all at once", ge=0)

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_seeds)]


@dataclass
class DeterminismParams(EngineParams):
    NOTEBOOK: typing.ClassVar[str] = "04_determinism_and_staleness"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/stale_cache_abs_dlogp_max", "vllm-v1/batch_invariant_frac"]

    engines: list[str] = P(["hf", "vllm-v0", "vllm-v1", "vllm-v1-fixed"], "engine presets to measure",
                           choices=_engine_presets, check=_check_engine)
    prompts: int = P(16, "requests whose outputs are compared", ge=1)
    batch_sizes: list[int] = P([1, 64], "batch sizes; each > 1 is a heterogeneous batch holding the requests", ge=1)
    prefix_tokens: int = P(400, "shared prefix length in tokens (several KV-cache blocks)", ge=1)
    max_tokens: int = P(16, "max completion tokens", ge=1)


@dataclass
class StressParams(EngineParams):
    NOTEBOOK: typing.ClassVar[str] = "05_equivalence_and_stress"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/validate_pass_rate", "vllm-v1-fixed/validate_pass_rate",
                                             "vllm-v1-fixed/pressure_abs_dlogp_max"]

    validate_cases: int = P(50, "hypothesis-drawn validator cases per engine", ge=1)
    # at most 0.05: the raw-vs-processed gap the validator exists to catch is ~0.1 nat and more (notebook 02),
    # so a looser tolerance (a gpu.yaml once set 0.5 to absorb bf16 noise) cannot fail on anything
    validate_tolerance: float = P(1e-3, "a validator case passes when its max abs dlogp is within this", gt=0,
                                  le=0.05)
    pressure_prompts: int = P(32, "requests in the memory-pressure batch (short and long prompts mixed)", ge=1)
    pressure_kv_tokens: int = P(1024, "KV-cache capacity of the pressure engine in tokens (whole blocks)", ge=1)
    max_tokens: int = P(64, "completion tokens per memory-pressure request (EOS ignored)", ge=1)
    stress_temperature: float = P(1.0, "sampling temperature of both stress checks (> 0)", gt=0, le=10)
    longctx_lengths: list[int] = P([16, 512, 1024, 2048, 3072, 4064], "long-context prompt lengths in tokens", ge=1)
    longctx_prompts: int = P(2, "prompts per long-context length", ge=1)
    longctx_max_tokens: int = P(16, "completion tokens after each long prompt (EOS ignored)", ge=1)
    validate_max_context: int = P(0, "longest validator case (prompt + completion) in tokens; "
                                     "0 means the whole model context", ge=0)


SCHEMAS: dict[str, type[Params]] = {c.NOTEBOOK: c for c in (DefaultPolicyParams, MismatchParams,
                                                            KLTemperatureParams, GRPOParams, DeterminismParams,
                                                            StressParams)}


# ---------------------------------------------------------------------------------------------------
def schema_for(notebook: str) -> type[Params]:
    stem = Path(notebook).stem
    if stem not in SCHEMAS:
        raise ParamError(f"no parameter schema for notebook {stem!r}; known: {sorted(SCHEMAS)}")
    return SCHEMAS[stem]


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check_type(key: str, value, tp):
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ParamError(f"parameter {key!r} must be a list of {_type_name(item)}, got {value!r}")
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
        if isinstance(v, list) and not v:
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
    """defaults <- each file in order <- overrides, then validate."""
    schema = schema_for(notebook)
    merged: dict = {}
    for f in files:
        merged.update(read_yaml(f))
    merged.update(overrides or {})
    return validate(schema, merged)


def parse_override(key: str, text: str):
    """`-p KEY VALUE`: VALUE is YAML (so '[0.6, 1.0]' is a list and '7' an int)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ParamError(f"-p {key}: value {text!r} is not valid YAML: {e}") from None


# -- notebooks ---------------------------------------------------------------------------------------
def _literal(v) -> str:
    return repr(v)


def parameters_cell(schema: type[Params]) -> str:
    """The source of a notebook's `parameters` cell: flat, typed, one comment per value."""
    hints = typing.get_type_hints(schema)
    lines = []
    for f in fields(schema):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        tp = _type_name(hints[f.name])
        lines.append(f"{f.name}: {tp} = {_literal(default)}  # {f.metadata['doc']}")
    return "\n".join(lines)


def defaults_yaml(schema: type[Params]) -> str:
    """`params/<stem>/default.yaml`: every parameter at its default, one commented line each."""
    d = validate(schema, {}).to_dict()
    lines = [f"# Defaults of notebooks/{schema.NOTEBOOK}.ipynb (generated from rlwb.params; a test keeps them equal)"]
    for f in fields(schema):
        value = yaml.safe_dump(d[f.name], default_flow_style=True, width=1000).strip().removesuffix("...").strip()
        lines.append(f"{f.name}: {value}  # {f.metadata['doc']}")
    return "\n".join(lines) + "\n"


def injected_names(cell_sources: list[str]) -> set[str]:
    """Names assigned in papermill's injected cells (they start with '# Parameters')."""
    import ast

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
