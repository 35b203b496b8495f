"""The parameters of every notebook: one dataclass each, the single source of names, defaults, docs and ranges.

Fields are `rlwb.core.checked_fields.param`s; settings that belong to a core module are inherited from it instead
of repeated (`GRPOParams` is `rlwb.core.rl.grpo.GRPOSettings` plus the notebook's own fields). Validation,
YAML loading and the generated parameters cells live beside this module (`validation.py`, `cells.py`).
"""

from __future__ import annotations

import hashlib
import json
import re
import typing
from dataclasses import asdict, dataclass
from pathlib import Path

from rlwb.core.checked_fields import DTYPES, param
from rlwb.core.data.tokenizer import CHAT_TEMPLATE_MODES
from rlwb.core.models.store import EMBEDDED_NAMES
from rlwb.core.prompts.generated import PROMPT_SOURCES
from rlwb.core.rl.correction_catalog import CORRECTIONS, check_modes
from rlwb.core.rl.grpo_config import GRPOSettings
from rlwb.core.rl.mismatch_breaker import MONITORED
from rlwb.core.scoring.trainer_choices import check_setting
from rlwb.engines.presets import available_knobs, resolve_preset
from rlwb.errors import ParamError, PresetError


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


def engine_list(default: list[str], doc: str):
    """The `engines` parameter: preset names from params/engines.yaml, optionally with knobs from
    params/engine_knobs.yaml (`vllm-v1-fixed@kv-fp8`), whose environments exist. No `choices` list: composed
    names are open-ended, and `check_engine`'s error names the presets and knobs there are."""
    return param(default, doc, check=check_engine)


def concurrent_runs_param():
    """The `concurrent_runs` parameter of the notebooks that train GRPO grids (03, 07)."""
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

    seed: int = param(0, "base random seed (prompts, sampling, training)", ge=0)

    def to_dict(self) -> dict:
        return asdict(self)

    def hash(self) -> str:
        """8 hex digits over the fully resolved params: names the run directory."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:8]


@dataclass
class DefaultPolicyParams(Params):
    NOTEBOOK: typing.ClassVar[str] = "00_default_policy"
    HEADLINE: typing.ClassVar[list[str]] = ["policy/greedy_accuracy", "policy/mean_completion_tokens"]

    model: str = param("default", "embedded model to evaluate: default (char-level Llama) or qwen2-chat (BPE, chat)",
                       choices=list(EMBEDDED_NAMES))
    eval_prompts: int = param(200, "held-out problems for greedy accuracy", ge=1)
    sample_rows: int = param(12, "completions shown in the samples table", ge=0)
    rebuild: bool = param(False, "rebuild the model even if a cached build exists")


@dataclass
class EngineParams(Params):
    """Fields of every notebook that uses engines."""

    model: str = param("default", "embedded model (default, qwen2-chat), a model directory, or an HF id",
                       check=check_model)
    engines: list[str] = engine_list(["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"],
                                     "engine presets (params/engines.yaml), in ladder order")
    dtype: str = param("float32", "engine weights/activations dtype", choices=DTYPES)
    chat_template: str = param("auto", "task prompts through the tokenizer's chat template: auto (when it has one), "
                                       "on (required), off", choices=list(CHAT_TEMPLATE_MODES))


CORRECTIONS_DOC = ("off-policy corrections, names from rlwb.core.rl.correction_catalog (none, tis, verl.geo_rs, "
                   "icepop, ...; with old_logprobs engine only rejection ones: none, mis, verl.geo_rs, ...)")


def prompt_source_param(doc: str = "prompts: task (the verifiable task) or open_ended (held-out text and chat "
                                   "questions, where a real model is uncertain)"):
    return param("task", doc, choices=list(PROMPT_SOURCES))


@dataclass
class EngineExperimentParams(EngineParams):
    """Fields shared by the experiments that sample from engines and score with the trainer."""

    prompt_source: str = prompt_source_param()
    trainer_dtype: str = param("float32", "trainer (scorer) dtype", choices=DTYPES)
    prompts: int = param(64, "number of task prompts sampled per engine", ge=1)
    max_tokens: int = param(32, "max completion tokens per request", ge=1)


@dataclass
class MismatchParams(EngineExperimentParams):
    NOTEBOOK: typing.ClassVar[str] = "01_logprob_mismatch"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/abs_dlogp_max", "vllm-v1-fixed/abs_dlogp_max",
                                             "vllm-v0/abs_dlogp_max"]

    temperature: float = param(0.7, "sampling temperature (> 0)", gt=0, le=10)
    top_p: float = param(1.0, "nucleus sampling mass in (0, 1]; 1 means off", gt=0, le=1)
    top_k: int = param(0, "top-k sampling; 0 means off", ge=0)
    clip_eps: float = param(0.2, "PPO clip epsilon for clip_frac", gt=0, lt=1)
    full_vocab: bool = param(True, "also fetch full-vocabulary logprobs (exact KL); small vocabularies only")
    heterogeneous_batch: bool = param(False, "mix prompts of very different lengths into one batch")
    reward_samples: int = param(512, "rollouts per engine for the reward-equivalence test (8 per prompt); "
                                     "0 skips it", ge=0)


@dataclass
class KLTemperatureParams(EngineExperimentParams):
    NOTEBOOK: typing.ClassVar[str] = "02_kl_vs_temperature"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/T=0.5/k3_mean", "vllm-v0/T=0.5/k3_mean"]

    engines: list[str] = engine_list(["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed"],
                                     "engine presets (params/engines.yaml)")
    prompts: int = param(32, "number of task prompts sampled per engine and setting", ge=1)
    temperatures: list[float] = param([0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.3, 1.5], "sampling temperatures (> 0)",
                                      gt=0, le=10)
    top_p_values: list[float] = param([1.0, 0.9], "top-p variants; 1.0 means untruncated", gt=0, le=1)
    top_k_values: list[int] = param([0], "top-k variants; 0 means off", ge=0)
    full_vocab: bool = param(True, "also fetch full-vocabulary logprobs (exact KL); small vocabularies only")


@dataclass
class GRPOParams(GRPOSettings, EngineParams):
    """The GRPO loop's settings come from `GRPOSettings` (one source); these are notebook 03's own."""

    NOTEBOOK: typing.ClassVar[str] = "03_toy_grpo"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1-fixed+none/reward_last", "vllm-v1+none/reward_last"]

    engines: list[str] = engine_list(["vllm-v0", "vllm-v1", "vllm-v1-fixed"],
                                     "engine presets that generate the rollouts")
    # engine mode (the PPO ratio is pi_theta / pi_engine, PipelineRL style): only corrections that reject tokens or
    # sequences are defined here (a weighting one would apply the ratio twice); Geo-RS is verl's recipe for it
    # (bypass_ppo_clip_geo_rs)
    corrections: list[str] = param(["none", "verl.geo_rs"], CORRECTIONS_DOC, choices=CORRECTIONS)
    # Why skip at the floor: in fp32 V0's and V1-fixed's engine and trainer logprobs agree to the float floor
    # (k3 ~1e-13), so every correction's weight is 1 and its run repeats `none`'s (measured: identical rewards at
    # every step of every seed, 2026-11-23). Decided per engine from its own `none` runs, never from a fixed list.
    skip_at_floor: bool = param(True, "run the other corrections on an engine only if its `none` runs measured "
                                      "engine-trainer k3 above the float floor (1e-8) at some step")
    num_seeds: int = param(3, "seeds per configuration: seed, seed+1, ...", ge=1)
    drift_threshold: float = param(1e-5, "drift monitor: level of drift_metric (mean of 2-step windows, twice in a "
                                         "row) that trips it; 0 turns it off", ge=0)
    drift_metric: str = param("mismatch_k3", "per-step curve column the drift monitor watches (ess trips below "
                                             "the threshold, the others above)", choices=list(MONITORED))
    concurrent_runs: int = concurrent_runs_param()

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_seeds)]

    def __post_init__(self):
        check_modes(self.corrections, self.old_logprobs)


@dataclass
class CorrectionRaceParams(GRPOSettings, EngineParams):
    """Notebook 07: the GRPO loop's settings (decoupled by default: the mode peers define IS corrections in)
    plus the race's levels and corrections."""

    NOTEBOOK: typing.ClassVar[str] = "07_which_correction"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1-fixed+none/reward_final", "vllm-v1-bf16+none/gap",
                                             "vllm-v1-raw+none/gap", "vllm-v1-fixed@kv-fp8-e5m2+none/gap"]

    # the last level is notebook 06's worst knob that runs here (an fp8 e5m2 KV cache: on qwen2-chat k3 5e-3, the
    # only knob over NeMo-RL's token_mult_prob_error bound)
    engines: list[str] = engine_list(["vllm-v1-fixed", "vllm-v1-raw", "vllm-v1-bf16", "vllm-v1-fixed@kv-fp8-e5m2"],
                                     "mismatch levels (engine presets); the first is the no-mismatch baseline")
    corrections: list[str] = param(["none", "verl.token_tis", "verl.seq_mis", "verl.geo_rs", "icepop",
                                    "trl.sequence_mask", "miles.tis_geo_norm"], CORRECTIONS_DOC,
                                   choices=CORRECTIONS)
    old_logprobs: str = param("trainer", "behaviour logprobs in the PPO ratio: trainer (decoupled, as the "
                                         "peers define IS corrections) or engine", choices=["engine", "trainer"])
    steps: int = param(20, "GRPO steps per run", ge=1)
    num_seeds: int = param(3, "seeds per configuration: seed, seed+1, ...", ge=1)
    race_on_baseline: bool = param(False, "also race every correction on the baseline level (else `none` only)")
    margin: float = param(0.05, "equivalence margin on the final-reward gap: a correction recovers a level when "
                                "its gap to the baseline is shown inside +-margin (TOST, Holm-corrected)", gt=0, lt=1)
    concurrent_runs: int = concurrent_runs_param()

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_seeds)]

    def __post_init__(self):
        check_modes(self.corrections, self.old_logprobs)
        if "none" not in self.corrections:
            raise ParamError("parameter 'corrections' must include 'none': the uncorrected run at each level is "
                             "what the corrections are measured against")
        for name in ("engines", "corrections"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ParamError(f"parameter {name!r} lists an entry twice: {values}")

    def corrections_for(self, engine: str) -> list[str]:
        """The corrections run on `engine`'s rollouts: `none` alone on the baseline level (the first engine)
        unless `race_on_baseline`."""
        return ["none"] if engine == self.engines[0] and not self.race_on_baseline else list(self.corrections)


def check_arm(arm: str) -> str | None:
    """`<correction>` or `<correction>@<mode>`: a catalogue correction and the old_logprobs mode it is run in
    (`MismatchCostParams.__post_init__` checks the mode is one the correction is defined for)."""
    from rlwb.core.rl.correction_catalog import CATALOG

    corr, at, mode = arm.partition("@")
    if corr not in CATALOG or (at and mode not in ("engine", "trainer")):
        return (f"arm {arm!r} is not <correction>[@<mode>] with a correction of rlwb.core.rl.correction_catalog and "
                f"mode engine or trainer (e.g. none@engine, tis@trainer)")
    return None


DOSE_ROW = re.compile(r"(ratio|weights|stale)@\d+(\.\d*)?(e-?\d+)?")


def check_row_arms(entry: str) -> str | None:
    """'<row> <arm> [<arm> ...]': a row name and at least one arm (`MismatchCostParams.__post_init__` checks the
    row exists and the arms are arms of the study)."""
    parts = entry.split()
    if len(parts) < 2:
        return f"row_arms entry {entry!r} must be '<row> <arm> [<arm> ...]' (e.g. 'ratio@0.01 none@engine tis@trainer')"
    return next((check_arm(a) for a in parts[1:] if check_arm(a)), None)


POINT_T = re.compile(r"@T(\d+(?:\.\d*)?)$")  # `vllm-v1@T0.5`: an engine point at its own temperature


def split_point(entry: str, default_t: float) -> tuple[str, float]:
    """`<engine>[@T<temperature>]` -> (engine, temperature); without a temperature, the notebook's."""
    m = POINT_T.search(entry)
    return (entry[: m.start()], float(m.group(1))) if m else (entry, default_t)


def check_point(entry: str) -> str | None:
    """An engine point: a preset (with knobs) whose environment exists, optionally at a temperature in (0, 10]."""
    engine, t = split_point(entry, 1.0)
    if not 0 < t <= 10:
        return f"engine point {entry!r}: its temperature (after '@T') must be in (0, 10]"
    return check_engine(engine)


def check_resume_from(value: str) -> str | None:
    """'' or a run directory with the files a resume reads (`mismatch_cost.resume_check` compares them, before any
    compute, in the run). A resume is a run option (`rlwb run --resume-from`, `rlwb sweep --resume`), never a param:
    it is not hashed, not in params.yaml, so a resumed run is the same configuration as the study run whole and its
    params reload once its source is gone."""
    if not value:
        return None
    d = Path(value).expanduser()
    missing = [f for f in ("run.json", "params.yaml") if not (d / f).is_file()]
    if not d.is_dir() or missing:
        return f"resume_from {value!r} is not an archived run directory (missing: {missing or [value]})"
    return None


@dataclass
class MismatchCostParams(GRPOSettings, EngineParams):
    """Notebook 08: the GRPO loop's settings plus the doses of mismatch, the arms and the seeds."""
    RETIRED: typing.ClassVar[dict[str, str]] = {
        "resume_from": "a run option now, not a param: `rlwb run --resume-from RUN_DIR` (`rlwb sweep --resume`)"}

    NOTEBOOK: typing.ClassVar[str] = "08_mismatch_cost"
    HEADLINE: typing.ClassVar[list[str]] = ["clean/none@engine/reward_final", "ratio/none@engine/max_dose_gap",
                                             "weights/none@engine/max_dose_gap", "stale/none@trainer/max_dose_gap"]

    engines: list[str] = engine_list(["vllm-v1-fixed"], "the one engine preset every arm samples from (fp32 "
                                                        "vllm-v1-fixed: no mismatch at dose 0)")
    arms: list[str] = param(["none@engine", "none@trainer", "tis@trainer"],
                            "<correction>@<old_logprobs mode> trained at every dose (a bare name takes "
                            "old_logprobs); none@trainer is the control ratio mismatch cannot reach", check=check_arm)
    ratio_k3: list[float] = param([1e-2, 1e-1, 1.0], "ratio-mismatch doses: intended mean k3 per token of "
                                                     "Gaussian noise on the engine's reported logprobs", gt=0,
                                  allow_empty=True)
    weight_noise: list[float] = param([0.03], "distribution-mismatch doses: the engine samples with weights "
                                                    "plus this times their rms times N(0, 1)", gt=0, allow_empty=True)
    stale_steps: list[int] = param([2], "distribution-mismatch doses: the engine samples with the weights of this many "
                                        "updates ago (an asynchronous trainer's lag)", ge=1, allow_empty=True)
    engine_points: list[str] = param(["vllm-v1", "vllm-v1@T1.0"], "real engines placed on the dose-response: "
                                     "<preset>[@knob...][@T<temperature>], each trained with point_arms and paired "
                                     "with the base engine at its temperature (vllm-v1 at T 1 is the null control)",
                                     check=check_point, allow_empty=True)
    point_arms: list[str] = param(["none@engine"], "the arms each engine point trains (a subset of arms)",
                                  check=check_arm)
    row_arms: list[str] = param([], "rows trained with fewer arms, each '<row> <arm> <arm> ...': a dose row "
                                    "(<kind>@<dose>, e.g. ratio@0.01) or an engine point (as in engine_points) "
                                    "trains only the arms listed (a subset of arms; unlisted rows train every arm, "
                                    "points point_arms)", check=check_row_arms, allow_empty=True)
    steps: int = param(30, "GRPO steps per run", ge=1)
    num_seeds: int = param(4, "seeds per arm and dose, paired across them: seed, seed+1, ...", ge=2)
    placebo_arms: list[str] = param(["none@engine"], "arms whose clean run is trained again with an independent "
                                    "stream of sampling seeds (same prompts): placebo rows inside the Holm family, "
                                    "whose false-positive rate checks the tests' calibration", check=check_arm,
                                    allow_empty=True)
    updates_per_batch: list[int] = param([1], "PPO regimes: policy updates (mini-batches, one optimizer step each) "
                                              "per rollout batch; the first regime trains every row, each further "
                                              "one the clean runs and regime_doses", ge=1)
    regime_doses: list[str] = param([], "dose rows (<kind>@<dose>, e.g. ratio@1) the further PPO regimes train too "
                                        "(empty: every dose)", allow_empty=True)
    regime_arms: list[str] = param([], "arms the further PPO regimes train (empty: every arm)", check=check_arm,
                                   allow_empty=True)
    long_steps: int = param(0, "steps of the long-horizon rows (0: none): long_arms clean and at long_doses trained "
                               "again this long (at least 4 x steps), to see whether a gap grows, stays or vanishes",
                            ge=0)
    long_doses: list[str] = param([], "dose rows (<kind>@<dose>) trained at long_steps too", allow_empty=True)
    long_arms: list[str] = param([], "arms of the long-horizon rows (empty: every arm)", check=check_arm,
                                 allow_empty=True)
    policy_samples: int = param(2, "completions per held-out problem sampled, after training, from a clean engine "
                                   "(the base preset at the notebook's temperature, whatever engine and temperature "
                                   "the run trained with) holding the trained weights unperturbed: the tested outcome "
                                   "(0: the training reward is)", ge=0)
    bmr_fraction: float = param(0.25, "benchmark response: the cost that matters, as this fraction of the clean "
                                      "run's gain in the tested outcome (its trained policy's minus the initial "
                                      "policy's; the benchmark dose is where the fitted cost reaches it)",
                                gt=0, le=1)
    concurrent_runs: int = concurrent_runs_param()

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_seeds)]

    def __post_init__(self):
        if len(self.engines) != 1:
            raise ParamError(f"parameter 'engines' must name one preset (every arm and dose samples from it, so gaps "
                             f"are paired), got {self.engines}")
        for name, values in (("arms", self.arm_labels), ("ratio_k3", self.ratio_k3),
                             ("weight_noise", self.weight_noise), ("stale_steps", self.stale_steps)):
            if len(set(values)) != len(values):
                raise ParamError(f"parameter {name!r} lists an entry twice: {values}")
            if name != "arms" and len({f"{v:g}" for v in values}) != len(values):  # runs are labelled `<kind>@<v:g>`
                raise ParamError(f"parameter {name!r} has doses that print alike ({[f'{v:g}' for v in values]}): "
                                 f"their runs would share one label")
        for label in self.arm_labels:
            corr, _, mode = label.partition("@")
            check_modes([corr], mode, param=f"arms ({label})")
        if self.engine_points and not set(self.point_arm_labels) <= set(self.arm_labels):
            raise ParamError(f"parameter 'point_arms' must be a subset of 'arms' (each point is paired with the clean "
                             f"run of the same arm), got {self.point_arms} with arms {self.arms}")
        if len(set(self.points)) != len(self.points):
            raise ParamError(f"parameter 'engine_points' lists an engine at one temperature twice: "
                             f"{self.engine_points}")
        if not {self._label(a) for a in self.placebo_arms} <= set(self.arm_labels):
            raise ParamError(f"parameter 'placebo_arms' must be a subset of 'arms' (a placebo is paired with the clean "
                             f"run of the same arm), got {self.placebo_arms} with arms {self.arms}")
        if not {self._label(a) for a in self.regime_arms} <= set(self.arm_labels):
            raise ParamError(f"parameter 'regime_arms' must be a subset of 'arms', got {self.regime_arms} with arms "
                             f"{self.arms}")
        if len(set(self.updates_per_batch)) != len(self.updates_per_batch):
            raise ParamError(f"parameter 'updates_per_batch' lists a regime twice: {self.updates_per_batch}")
        if max(self.updates_per_batch) > self.prompts_per_step * self.group_size:
            raise ParamError(f"parameter 'updates_per_batch' {self.updates_per_batch}: a rollout batch has only "
                             f"{self.prompts_per_step * self.group_size} sequences to cut into mini-batches")
        labels = {f"{k}@{v:g}" for k, vs in (("ratio", self.ratio_k3), ("weights", self.weight_noise),
                                              ("stale", self.stale_steps)) for v in vs}
        if not set(self.long_doses) <= labels:
            raise ParamError(f"parameter 'long_doses' names rows no dose list has: "
                             f"{sorted(set(self.long_doses) - labels)} (the doses are {sorted(labels)})")
        if self.long_steps and self.long_steps <= self.steps:
            raise ParamError(f"parameter 'long_steps' ({self.long_steps}) must exceed 'steps' ({self.steps}), or be 0")
        if (self.long_doses or self.long_arms) and not self.long_steps:
            raise ParamError("parameters 'long_doses' / 'long_arms' need 'long_steps' > 0")
        if not {self._label(a) for a in self.long_arms} <= set(self.arm_labels):
            raise ParamError(f"parameter 'long_arms' must be a subset of 'arms', got {self.long_arms}")
        rows = {}
        for entry in self.row_arms:
            row, *arms = entry.split() or [""]
            if not arms:
                raise ParamError(f"parameter 'row_arms': entry {entry!r} must be '<row> <arm> [<arm> ...]'")
            if row in rows:
                raise ParamError(f"parameter 'row_arms' lists row {row!r} twice")
            if row not in self.engine_points and not DOSE_ROW.fullmatch(row):  # a dose row this grid cell
                # lacks (a sweep's smaller ratio_k3) is allowed: the entry applies where the row exists
                raise ParamError(f"parameter 'row_arms': {row!r} is neither a dose row (<kind>@<dose>, e.g. "
                                 f"{sorted(labels)[:2]}) nor an engine point ({self.engine_points})")
            bad = [a for a in arms if self._label(a) not in self.arm_labels]
            if bad:
                raise ParamError(f"parameter 'row_arms': row {row!r} names arms not in 'arms': {bad}")
            rows[row] = arms
        if not set(self.regime_doses) <= labels:
            raise ParamError(f"parameter 'regime_doses' names rows no dose list has: "
                             f"{sorted(set(self.regime_doses) - labels)} (the doses are {sorted(labels)})")

    @property
    def arm_labels(self) -> list[str]:
        """Every arm as `<correction>@<mode>` (a bare name takes `old_logprobs`)."""
        return [self._label(a) for a in self.arms]

    @property
    def point_arm_labels(self) -> list[str]:
        return [self._label(a) for a in self.point_arms]

    @property
    def placebo_arm_labels(self) -> list[str]:
        return [self._label(a) for a in self.placebo_arms]

    def _label(self, arm: str) -> str:
        return arm if "@" in arm else f"{arm}@{self.old_logprobs}"

    def arms_of(self, row: str, default: list[str]) -> list[str]:
        """The arm labels row `row` (a dose label, or an engine point as `engine_points` writes it) trains:
        its `row_arms` entry in the order of `arms`, else `default`."""
        for entry in self.row_arms:
            name, *arms = entry.split()
            if name == row:
                listed = {self._label(a) for a in arms}
                return [a for a in self.arm_labels if a in listed]
        return list(default)

    @property
    def points(self) -> list[tuple[str, float]]:
        """(engine preset, temperature) of every engine point."""
        return [split_point(e, self.temperature) for e in self.engine_points]


KNOBS_DOC = "knobs (params/engine_knobs.yaml) applied one at a time to the baseline"


@dataclass
class EngineKnobParams(Params):
    """Notebook 06: the baseline preset, the knobs and versions measured against it, the MoE router audit."""

    NOTEBOOK: typing.ClassVar[str] = "06_engine_knobs"
    HEADLINE: typing.ClassVar[list[str]] = ["bf16/k3_mean", "kv-fp8/k3_mean", "moe/bf16/topk_set_agree"]

    model: str = param("qwen2-chat", "embedded model (default, qwen2-chat), a model directory, or an HF id",
                       check=check_model)
    baseline: str = param("vllm-v1-fixed", "engine preset every knob changes (params/engines.yaml)",
                          check=check_engine)
    knobs: list[str] = param(["bf16", "fp16", "bf16-head-rlwb", "bf16-head-native", "kv-fp8", "kv-fp8-e4m3",
                              "kv-fp8-e5m2", "chunked-prefill", "prefix-caching", "async-scheduling",
                              "batch-invariant", "ngram-spec", "tp2", "tp2-ray"], KNOBS_DOC, choices=available_knobs,
                             allow_empty=True)
    versions: list[str] = param(["vllm-v0", "vllm-v1-0.28", "vllm-v1-0.31"],
                                "other vLLM builds (presets with their own environment) run on the same prompts",
                                check=check_preset_name, allow_empty=True)
    dtype: str = param("float32", "engine dtype where the preset and knob do not set one", choices=DTYPES)
    chat_template: str = param("auto", "task prompts through the tokenizer's chat template: auto (when it has one), "
                                       "on (required), off", choices=list(CHAT_TEMPLATE_MODES))
    prompt_source: str = param("open_ended", "prompts: open_ended (held-out text and chat questions: the policy's "
                                             "natural entropy) or task", choices=list(PROMPT_SOURCES))
    trainer_dtype: str = param("float32", "trainer (scorer) dtype", choices=DTYPES)
    prompts: int = param(64, "prompts sampled per knob", ge=1)
    max_tokens: int = param(48, "max completion tokens per request", ge=1)
    temperature: float = param(1.0, "sampling temperature (> 0)", gt=0, le=10)
    top_p: float = param(1.0, "nucleus sampling mass in (0, 1]; 1 means off", gt=0, le=1)
    top_k: int = param(0, "top-k sampling; 0 means off", ge=0)
    clip_eps: float = param(0.2, "PPO clip epsilon for clip_frac", gt=0, lt=1)
    throughput_repeats: int = param(3, "timed generate calls per knob (median tokens/s)", ge=1)
    moe: bool = param(True, "run the MoE router audit")
    moe_model: str = param("qwen2-moe-chat", "embedded MoE model of the router audit", check=check_model)
    moe_knobs: list[str] = param(["bf16"], "knobs of the router audit (beside the baseline)", choices=available_knobs)
    moe_prompts: int = param(32, "prompts of the router audit (sampled one request at a time)", ge=1)

    def __post_init__(self):
        for name in ("knobs", "versions", "moe_knobs"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ParamError(f"parameter {name!r} lists an entry twice: {values}")


@dataclass
class DeterminismParams(EngineParams):
    NOTEBOOK: typing.ClassVar[str] = "04_determinism_and_staleness"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/stale_cache_abs_dlogp_max", "vllm-v1/batch_invariant_frac"]

    engines: list[str] = engine_list(["hf", "vllm-v0", "vllm-v1", "vllm-v1-fixed"], "engine presets to measure")
    prompts: int = param(16, "requests whose outputs are compared", ge=1)
    batch_sizes: list[int] = param([1, 64], "batch sizes; each > 1 is a heterogeneous batch holding the requests",
                                   ge=1)
    prefix_tokens: int = param(400, "shared prefix length in tokens (several KV-cache blocks)", ge=1)
    prompt_source: str = prompt_source_param("prompts of the batch-invariance and rerun checks: task or open_ended "
                                             "(the stale-cache check always uses task prompts behind a shared prefix)")
    max_tokens: int = param(16, "max completion tokens", ge=1)


@dataclass
class StressParams(EngineParams):
    NOTEBOOK: typing.ClassVar[str] = "05_equivalence_and_stress"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1/validate_pass_rate", "vllm-v1-fixed/validate_pass_rate",
                                             "vllm-v1-fixed/pressure_abs_dlogp_max"]

    validate_cases: int = param(50, "hypothesis-drawn validator cases per engine", ge=1)
    # at most 0.05: the raw-vs-processed gap the validator exists to catch is ~0.1 nat and more (notebook 02),
    # so a looser tolerance (a gpu.yaml once set 0.5 to absorb bf16 noise) cannot fail on anything
    validate_tolerance: float = param(1e-3, "a validator case passes when its max abs dlogp is within this", gt=0,
                                      le=0.05)
    pressure_prompts: int = param(32, "requests in the memory-pressure batch (short and long prompts mixed)", ge=1)
    prompt_source: str = prompt_source_param("prompts of the memory-pressure batch: task (short and long mixed) or "
                                             "open_ended")
    pressure_kv_tokens: int = param(1024, "KV-cache capacity of the pressure engine in tokens (whole blocks)", ge=1)
    max_tokens: int = param(64, "completion tokens per memory-pressure request (EOS ignored)", ge=1)
    stress_temperature: float = param(1.0, "sampling temperature of both stress checks (> 0)", gt=0, le=10)
    longctx_lengths: list[int] = param([16, 512, 1024, 2048, 3072, 4064], "long-context prompt lengths in tokens",
                                       ge=1)
    longctx_prompts: int = param(2, "prompts per long-context length", ge=1)
    longctx_max_tokens: int = param(16, "completion tokens after each long prompt (EOS ignored)", ge=1)
    validate_max_context: int = param(0, "longest validator case (prompt + completion) in tokens; "
                                         "0 means the whole model context", ge=0)

    def trainer_forward(self, context: int, prompt_allowance: int) -> tuple[int, int]:
        """The scorer's largest forward (GPU memory plan): long contexts and validator cases go one at a time."""
        longest = max(self.longctx_lengths) + self.longctx_max_tokens
        return 1, max(longest, self.validate_max_context or context, self.max_tokens + prompt_allowance)


SETTINGS_DOC = ("trainer settings: entries of rlwb.core.scoring.trainer_choices.CATALOG joined by + (bf16+fp32-head), "
                "mb<N> for N sequences per forward; fp64 (the reference's control) and fp32 (rlwb's scorer) always run")


@dataclass
class TrainerSettingsParams(Params):
    """Notebook 09: the sampler and prompts, the trainer settings scored against float64, the fp32-head grid."""

    NOTEBOOK: typing.ClassVar[str] = "09_trainer_settings"
    HEADLINE: typing.ClassVar[list[str]] = ["bf16/k3_mean", "fp32/batch1_identical_frac",
                                             "mb4+grad/ppo_ratio_abs_log_max"]

    model: str = param("default", "embedded model (default, qwen2-chat, qwen2.5-0.5b-random), a model directory, or an "
                                  "HF id", check=check_model)
    sampler: str = param("hf", "engine preset that samples the sequences every setting scores (fp32; hf runs "
                               "wherever transformers does)", check=check_engine)
    dtype: str = param("float32", "engine dtype where the preset and knob do not set one (the sampler's; the grid's "
                                  "presets set bf16 themselves)", choices=DTYPES)
    chat_template: str = param("auto", "task prompts through the tokenizer's chat template: auto (when it has one), "
                                       "on (required), off", choices=list(CHAT_TEMPLATE_MODES))
    prompt_sources: list[str] = param(["task", "open_ended"], "prompt sources sampled, each with `prompts` prompts: "
                                                              "task (peaked) and open_ended (the policy's entropy)",
                                      choices=list(PROMPT_SOURCES))
    prompts: int = param(32, "prompts per source", ge=1)
    max_tokens: int = param(32, "max completion tokens per request", ge=1)
    temperature: float = param(1.0, "sampling temperature (> 0); every setting scores under it", gt=0, le=10)
    settings: list[str] = param(["batch1", "left-pad", "packed", "eager", "flex", "flash2", "bf16", "bf16+fp32-head",
                                 "bf16-autocast", "fp16", "mb4+grad", "mb4+grad+checkpointing", "compile"],
                                SETTINGS_DOC, check=check_setting, allow_empty=True)
    batch_size: int = param(64, "sequences per forward of the settings that keep the scorer's batches", ge=1)
    grid_engines: list[str] = param(["vllm-v1-fixed@bf16", "vllm-v1-fixed@bf16-head-native"],
                                    "bf16 engine presets of the fp32-head grid: without, then with an fp32 lm_head "
                                    "(one whose environment is missing is a row with the error)",
                                    check=check_preset_name, allow_empty=True)
    grid_settings: list[str] = param(["fp32", "bf16", "bf16+fp32-head"], "trainer settings of the fp32-head grid "
                                                                         "(each scores every grid engine's samples; "
                                                                         "with fp32 among them each engine joins the "
                                                                         "ranking)", check=check_setting)
    compare_run: str = param("latest", "notebook 06 run whose engine knobs are ranked beside the trainer settings: "
                                       "latest (of this run's archive), a run directory, or none")

    def __post_init__(self):
        for name in ("prompt_sources", "settings", "grid_engines", "grid_settings"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ParamError(f"parameter {name!r} lists an entry twice: {values}")

    def trainer_forward(self, context: int, prompt_allowance: int) -> tuple[int, int]:
        """The largest forward (GPU memory plan): a scorer batch of the sequences."""
        return self.batch_size, self.max_tokens + prompt_allowance


def check_prompts_file(value: str) -> str | None:
    """A prompts file whose every row has the right shape (`rlwb.core.prompts.from_file.check_rows`: a bad row is named
    before a kernel starts); "" when the audit re-scores an archived run instead."""
    if value == "":
        return None
    from rlwb.core.prompts.from_file import check_rows
    from rlwb.errors import PromptFileError
    from rlwb.paths import repo_path

    try:
        check_rows(repo_path(value))
    except PromptFileError as e:
        return str(e)
    return None


def check_audit_engine(name: str) -> str | None:
    """A preset whose environment exists (`check_engine`), or the URL of a running OpenAI-compatible server."""
    from rlwb.engines.presets import check_url, is_url

    return check_url(name) if is_url(name) else check_engine(name)


def check_archived_run(value: str) -> str | None:
    """"" or an archived run directory with a self-contained rollouts table (`rlwb rescore`)."""
    if value == "":
        return None
    from rlwb.paths import repo_path

    d = repo_path(value)
    if not (d / "run.json").is_file():
        return f"{value!r} is not an archived run (no run.json)"
    if not (d / "data" / "rollouts.parquet").is_file():
        return f"{value!r} has no data/rollouts.parquet: nothing to re-score"
    return None


@dataclass
class AuditParams(Params):
    """Notebook 10: your prompts, your engine (a preset or a served URL), your trainer (rlwb's scorer or a command)."""

    NOTEBOOK: typing.ClassVar[str] = "10_audit"
    HEADLINE: typing.ClassVar[list[str]] = ["audit/k3_mean_worst", "audit/abs_dlogp_max_worst"]

    model: str = param("default", "the policy: embedded model (default, qwen2-chat, ...), a model directory, or an "
                                  "HF id; engines and trainer load it, a served engine must serve it",
                       check=check_model)
    prompts_file: str = param("params/10_audit/prompts.jsonl", "JSONL or Parquet, one prompt per row: prompt (text), "
                                                               "messages (chat) or prompt_token_ids; relative paths "
                                                               "from the repository root", check=check_prompts_file)
    engines: list[str] = param(["vllm-v1-processed"], "engine presets (params/engines.yaml) or server URLs "
                                                      "(http://host:port/v1, OpenAI-compatible)",
                               check=check_audit_engine, allow_empty=True)
    served_model: str = param("", "the model name at the server URLs (empty: the one model the server serves)")
    trainer: str = param("hf", "the scorer: hf (rlwb's transformers scorer) or a command behind the external-scorer "
                               "contract (README), run from the repository root")
    trainer_dtype: str = param("float32", "dtype of rlwb's scorer (trainer hf)", choices=DTYPES)
    trainer_attn: str = param("sdpa", "attention kernel of rlwb's scorer (trainer hf)", choices=["sdpa", "eager"])
    dtype: str = param("float32", "engine dtype (presets; a served engine runs as it was started)", choices=DTYPES)
    temperature: float = param(1.0, "sampling temperature (0 is greedy)", ge=0, le=10)
    top_p: float = param(1.0, "nucleus sampling mass in (0, 1]; 1 means off", gt=0, le=1)
    top_k: int = param(0, "top-k sampling; 0 means off", ge=0)
    max_tokens: int = param(64, "max completion tokens per request", ge=1)
    samples_per_prompt: int = param(1, "completions per prompt (n)", ge=1)
    clip_eps: float = param(0.2, "PPO clip epsilon for clip_frac", gt=0, lt=1)
    full_vocab: bool = param(False, "also compare full-vocabulary distributions (exact KL): the engines must return "
                                    "every logprob (small vocabularies only)")
    worst_tokens: int = param(20, "rows of the worst-tokens table", ge=1)
    rollouts_from: str = param("", "an archived run to re-score instead of sampling (its data/rollouts.parquet; "
                                   "what rlwb rescore sets): prompts_file and engines must then be empty",
                               check=check_archived_run)

    def __post_init__(self):
        if self.rollouts_from and (self.prompts_file or self.engines):
            raise ParamError("parameter 'rollouts_from' re-scores an archived run's rollouts: set prompts_file to '' "
                             "and engines to [] (its engines are the archive's)")
        if not self.rollouts_from and not (self.prompts_file and self.engines):
            raise ParamError("parameters 'prompts_file' and 'engines' are needed to sample (or rollouts_from to "
                             "re-score an archived run)")
        if len(set(self.engines)) != len(self.engines):
            raise ParamError(f"parameter 'engines' lists an entry twice: {self.engines}")
