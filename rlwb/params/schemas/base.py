"""What every notebook's schema is built from: the base `Params` (the seed, the run's hash), the fields of the
notebooks that use engines, and the checks and fields several schemas share (an engine preset, a model, the
corrections' doc, the prompt source, the number of concurrent GRPO runs).
"""

from __future__ import annotations

import hashlib
import json
import typing
from dataclasses import asdict, dataclass
from pathlib import Path

from rlwb.core.checked_fields import DTYPES, param
from rlwb.core.data.tokenizer import CHAT_TEMPLATE_MODES
from rlwb.core.models.store import EMBEDDED_NAMES
from rlwb.core.prompts.generated import PROMPT_SOURCES
from rlwb.engines.presets import resolve_preset
from rlwb.errors import PresetError


def check_engine(name: str) -> str | None:
    """A known preset whose interpreter exists (else the run would fail minutes later, at engine start)."""
    try:
        resolve_preset(name).check_interpreter()
    except PresetError as e:
        return str(e)
    return None


def check_preset_name(name: str) -> str | None:
    """A known preset (its environment may be missing: notebook 06 reports a version it cannot start)."""
    try:
        resolve_preset(name)
    except PresetError as e:
        return str(e)
    return None


def check_model(value: str) -> str | None:
    """An embedded model's name, an existing model directory holding a causal LM, or a hub id (loaded by the
    user's GPU box)."""
    if value in EMBEDDED_NAMES:
        return None
    p = Path(value).expanduser()
    looks_like_path = value.startswith(("/", ".", "~")) or p.exists() or value.count("/") != 1
    if not looks_like_path:
        return None  # an HF hub id like "Qwen/Qwen2.5-0.5B-Instruct": resolved where it is used
    if not p.is_dir():
        return (f"model path {value!r} does not exist (use an embedded model: {', '.join(EMBEDDED_NAMES)}; "
                "a model directory; or an HF id 'org/name')")
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


def engine_list(default: list[str], doc: str, unique: bool = False):
    """The `engines` parameter: preset names from params/engines.yaml, optionally with knobs from
    params/engine_knobs.yaml (`vllm-v1-fixed@kv-fp8`), whose environments exist. No `choices` list: composed
    names are open-ended, and `check_engine`'s error names the presets and knobs there are."""
    return param(default, doc, check=check_engine, unique=unique)


def concurrent_runs_param():
    """The `concurrent_runs` parameter of the notebooks that train GRPO grids (03, 07, 08)."""
    return param(2, "GRPO runs trained at once, each with its own engine process and trainer copy (one run samples "
                    "while another updates; curves identical to one at a time, s/step is wall time shared); "
                    "1 means one at a time", ge=1, le=8)


@dataclass
class Params:
    """Base: fields every notebook has. Subclasses add theirs."""

    NOTEBOOK: typing.ClassVar[str] = ""
    HEADLINE: typing.ClassVar[list[str]] = []  # metric keys shown by `rlwb runs` / the index
    # former params an older run's params.yaml may hold: dropped when a params file is read (`load`), an error as an
    # override; each maps to what replaced it
    RETIRED: typing.ClassVar[dict[str, str]] = {}
    # params added after runs were archived, each with the value that computes what those runs computed: left out of
    # the hash while they hold it, so a parameter set of before keeps its hash (the index's one row per set,
    # readme-check's newer run of the same computation)
    HASH_NEUTRAL: typing.ClassVar[dict[str, object]] = {}

    seed: int = param(0, "base random seed (prompts, sampling, training)", ge=0)

    def to_dict(self) -> dict:
        return asdict(self)

    def hash(self) -> str:
        """8 hex digits over the fully resolved params: names the run directory."""
        d = {k: v for k, v in self.to_dict().items() if k not in self.HASH_NEUTRAL or v != self.HASH_NEUTRAL[k]}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]


@dataclass
class EngineParams(Params):
    """Fields of the notebooks that run a list of engine presets on one model (01 to 05, 07, 08)."""

    model: str = param("default", "embedded model (default, qwen2-chat), a model directory, or an HF id",
                       check=check_model)
    engines: list[str] = engine_list(["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"],
                                     "engine presets (params/engines.yaml), in ladder order")
    dtype: str = param("float32", "engine weights/activations dtype", choices=DTYPES)
    chat_template: str = param("auto", "task prompts through the tokenizer's chat template: auto (when it has one), "
                                       "on (required), off", choices=list(CHAT_TEMPLATE_MODES))


class SeededRuns:
    """The seeds of a notebook that trains `num_seeds` GRPO runs per configuration (03, 07, 08): seed, seed+1, ...,
    the same in every configuration, so that configurations are paired by seed."""

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_seeds)]


CORRECTIONS_DOC = ("off-policy corrections, names from rlwb.core.rl.correction_catalog (none, tis, verl.geo_rs, "
                   "icepop, ...; with old_logprobs engine only rejection ones: none, mis, verl.geo_rs, ...)")


def prompt_source_param(doc: str = "prompts: task (the verifiable task) or open_ended (held-out text and chat "
                                   "questions, where a real model is uncertain)"):
    return param("task", doc, choices=list(PROMPT_SOURCES))


@dataclass
class EngineExperimentParams(EngineParams):
    """Fields shared by notebooks 01 and 02, which sample prompts from each engine and score them with the trainer."""

    prompt_source: str = prompt_source_param()
    trainer_dtype: str = param("float32", "trainer (scorer) dtype", choices=DTYPES)
    prompts: int = param(64, "number of task prompts sampled per engine", ge=1)
    max_tokens: int = param(32, "max completion tokens per request", ge=1)
