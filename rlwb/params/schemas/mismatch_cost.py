"""Notebook 08's parameters: the GRPO loop's settings plus the study's grammar (arms, dose rows, engine points,
rows trained with fewer arms, PPO regimes, long-horizon rows). Each registered kind of dose
(`rlwb.core.rl.mismatch_doses.DOSE_KINDS`) brings its own list of doses (`with_dose_lists`); the params are valid when
the grammar parses (`rlwb.experiments.mismatch_study.grammar.parse`, which `design.training_runs` reads too)."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, is_dataclass

from rlwb.core.checked_fields import param
from rlwb.core.rl.grpo_config import GRPOSettings
from rlwb.core.rl.mismatch_doses import dose_kinds
from rlwb.errors import ParamError
from rlwb.experiments.mismatch_study.grammar import (
    CONFIRM_SEED_BASE,
    CONFIRMABLE,
    StudyGrammar,
    parse,
    split_point,
)
from rlwb.params.schemas.base import EngineParams, SeededRuns, check_engine, concurrent_runs_param, engine_list

# bounds that keep every run's sampling seeds apart (`design.sampling_stream`: placebo streams 1000 apart, so two
# seeds up to 499 apart never meet on a request)
MAX_SEEDS, MAX_PLACEBO_STREAMS = 500, 100


def check_arm(arm: str) -> str | None:
    """`<correction>` or `<correction>@<mode>`: a catalogue correction and the old_logprobs mode it is run in
    (the study's grammar, `grammar.parse`, checks the mode is one the correction is defined for)."""
    from rlwb.core.rl.correction_catalog import CATALOG

    corr, at, mode = arm.partition("@")
    if corr not in CATALOG or (at and mode not in ("engine", "trainer")):
        return (f"arm {arm!r} is not <correction>[@<mode>] with a correction of rlwb.core.rl.correction_catalog and "
                f"mode engine or trainer (e.g. none@engine, tis@trainer)")
    return None


def check_row_arms(entry: str) -> str | None:
    """'<row> <arm> [<arm> ...]': a row name and at least one arm (the study's grammar, `grammar.parse`, checks the
    row exists and the arms are arms of the study)."""
    parts = entry.split()
    if len(parts) < 2:
        return f"row_arms entry {entry!r} must be '<row> <arm> [<arm> ...]' (e.g. 'ratio@0.01 none@engine tis@trainer')"
    return next((check_arm(a) for a in parts[1:] if check_arm(a)), None)


def check_point(entry: str) -> str | None:
    """An engine point: a preset (with knobs) whose environment exists, optionally at a temperature in (0, 10]."""
    engine, t = split_point(entry, 1.0)
    if not 0 < t <= 10:
        return f"engine point {entry!r}: its temperature (after '@T') must be in (0, 10]"
    return check_engine(engine)


def with_dose_lists(cls):
    """A class decorator, applied before `dataclass`: a field listing the doses of each registered kind of dose that
    `cls` has no field for yet (its `DoseKind.param`, with its default, doc and bound), after the field `arms` where
    `cls` declares one, else after its own fields. Why: a kind is declared once, in its registration, and the
    parameters cell and `default.yaml` (`rlwb sync-params`) follow from it. A kind with no doses by default (one
    a study opts in to) is hash-neutral while it lists none (`Params.HASH_NEUTRAL`): params that do not use it hash
    as they did before it was registered (the runs archived then keep theirs)."""
    have = {f.name for f in fields(cls)} if is_dataclass(cls) else set()
    own = dict(cls.__dict__.get("__annotations__", {}))
    new, neutral = {}, {}
    for k in dose_kinds():
        if k.param not in have and k.param not in own:
            new[k.param] = f"list[{getattr(k.unit, '__name__', None) or k.unit}]"  # `int | float` has no name
            setattr(cls, k.param, param(list(k.doses), k.doc, gt=k.gt, ge=k.ge, lt=k.lt, allow_empty=True))
            if not k.doses:
                neutral[k.param] = []
    if neutral:
        cls.HASH_NEUTRAL = {**cls.HASH_NEUTRAL, **neutral}
    names = list(own)
    at = names.index("arms") + 1 if "arms" in own else len(names)
    cls.__annotations__ = {**{n: own[n] for n in names[:at]}, **new, **{n: own[n] for n in names[at:]}}
    return cls


@dataclass
@with_dose_lists
class MismatchCostParams(GRPOSettings, EngineParams, SeededRuns):
    """Notebook 08: the GRPO loop's settings plus the doses of mismatch, the arms and the seeds."""
    RETIRED: typing.ClassVar[dict[str, str]] = {
        "resume_from": "a run option now, not a param: `rlwb run --resume-from RUN_DIR` (`rlwb sweep --resume`)"}
    # what every run computed before each param existed: one epoch, one placebo stream, no second pass of seeds,
    # nothing declared confirmatory, seeds sized by fixed-n power
    HASH_NEUTRAL: typing.ClassVar[dict[str, object]] = {"ppo_epochs": [1], "placebo_streams": 1, "max_seeds": 0,
                                                        "target_power": 0.8, "confirms": [], "seed_power": "fixed-n",
                                                        "se_check_sets": 0, "futility_power": 0.0}

    NOTEBOOK: typing.ClassVar[str] = "08_mismatch_cost"
    HEADLINE: typing.ClassVar[list[str]] = ["clean/none@engine/reward_final"] + [
        f"{k.name}/{k.headline_arm}/max_dose_gap" for k in dose_kinds()]

    engines: list[str] = engine_list(["vllm-v1-fixed"], "the one engine preset every arm samples from (fp32 "
                                                        "vllm-v1-fixed: no mismatch at dose 0)")
    arms: list[str] = param(["none@engine", "none@trainer", "tis@trainer"],
                            "<correction>@<old_logprobs mode> trained at every dose (a bare name takes "
                            "old_logprobs); none@trainer is the control ratio mismatch cannot reach", check=check_arm)
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
    num_seeds: int = param(4, "seeds per arm and dose, paired across them: seed, seed+1, ... (the first pass, "
                              "when max_seeds adds a second)", ge=2, le=MAX_SEEDS)
    max_seeds: int = param(0, "the sequential rule's cap on seeds per row (0: no second pass): after the first "
                              "pass, each benchmark row's doses whose gap interval holds -BMR or that bracket its BMD "
                              "get the seeds that give target_power at the BMR (at alpha/m, the first pass's sd, by "
                              "seed_power), at most this many (at least num_seeds + 2)",
                           ge=0, le=MAX_SEEDS)
    target_power: float = param(0.8, "the sequential rule's power to detect a cost equal to the BMR (two-sided, at the "
                                     "study's strictest Holm level alpha/m, the first pass's sd; whose power: "
                                     "seed_power)", gt=0, lt=1)
    seed_power: str = param("fixed-n", "whose power the sequential rule sizes by: fixed-n (a paired t test over the "
                                       "row's seeds, the plan's) or two-look (the two-look test each extended row "
                                       "gets, which needs more seeds for the same power)",
                            choices=["fixed-n", "two-look"])
    futility_power: float = param(0.0, "the sequential rule's futility bound (0: off): a row called only because its "
                                       "gap interval holds -BMR whose power at max_seeds (by seed_power) stays below "
                                       "this gets no seeds beyond the first pass (rows bracketing the BMD keep theirs)",
                                  ge=0, lt=1)
    placebo_arms: list[str] = param(["none@engine"], "arms whose clean run is trained again with an independent "
                                    "stream of sampling seeds (same prompts): placebo rows inside the Holm family, "
                                    "whose false-positive rate checks the tests' calibration", check=check_arm,
                                    allow_empty=True)
    placebo_streams: int = param(1, "independent sampling-seed streams per placebo arm, each its own placebo row "
                                    "(placebo, placebo#2, ...): the false-positive rate's denominator", ge=1,
                                 le=MAX_PLACEBO_STREAMS)
    updates_per_batch: list[int] = param([1], "PPO regimes: policy updates (mini-batches, one optimizer step each) "
                                              "per pass over the rollout batch; the first regime trains every row, "
                                              "each further one the clean runs and regime_doses", ge=1)
    ppo_epochs: list[int] = param([1], "passes (PPO epochs) over the same rollout batch of each regime, by position "
                                       "in updates_per_batch (one entry: every regime), each pass its mini-batches "
                                       "in the same order: updates x epochs optimizer steps per batch (updates "
                                       "[1, 4, 2, 1] with epochs [1, 1, 2, 4]: 4 steps as 4x1, 2x2, 1x4)", ge=1)
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
    se_check_sets: int = param(0, "independent seed sets the initial policy is scored on again, as every run is, to "
                                  "check the outcome's standard error against the spread of its scores (0: none; "
                                  "a set costs one run's scoring)", ge=0)
    bmr_fraction: float = param(0.25, "benchmark response: the cost that matters, as this fraction of the clean "
                                      "run's gain in the tested outcome (its trained policy's minus the initial "
                                      "policy's; the benchmark dose is where the fitted cost reaches it)",
                                gt=0, le=1)
    confirms: list[str] = param([], "kinds of test this run was declared, before running, to confirm on fresh seeds "
                                    "(correction, mode, one-sided vs symmetric, band, regime, horizon): labelled "
                                    "confirmatory, every other test exploratory; needs seed 1000 or more (studies use "
                                    "seeds from 0)", choices=CONFIRMABLE, allow_empty=True, unique=True)
    concurrent_runs: int = concurrent_runs_param()

    def __post_init__(self):
        if self.confirms and self.seed < CONFIRM_SEED_BASE:
            raise ParamError(f"parameter 'confirms' {self.confirms} needs fresh seeds: 'seed' must be >= "
                             f"{CONFIRM_SEED_BASE} (a study's seeds start at 0, so a confirmation never reuses one), "
                             f"got {self.seed}")
        if self.se_check_sets and self.policy_samples < 2:
            raise ParamError(f"parameter 'se_check_sets' ({self.se_check_sets}) needs 'policy_samples' >= 2: the "
                             f"standard error it checks is measured from a problem's repeated draws, got "
                             f"policy_samples {self.policy_samples}")
        if len(self.engines) != 1:
            raise ParamError(f"parameter 'engines' must name one preset (every arm and dose samples from it, so gaps "
                             f"are paired), got {self.engines}")
        if self.max_seeds and self.max_seeds < self.num_seeds + 2:
            raise ParamError(f"parameter 'max_seeds' ({self.max_seeds}) must be 0 (no second pass) or at least "
                             f"'num_seeds' + 2 ({self.num_seeds} + 2): the second pass adds at least 2 seeds to the "
                             f"first pass's num_seeds (its own t test), up to max_seeds")
        if self.futility_power and not self.max_seeds:
            raise ParamError(f"parameter 'futility_power' ({self.futility_power}) needs a second pass (max_seeds > 0, "
                             f"got 0): it leaves at the first pass rows the second pass would extend")
        if self.futility_power >= self.target_power:
            raise ParamError(f"parameter 'futility_power' ({self.futility_power}) must lie below 'target_power' "
                             f"({self.target_power}): it leaves at the first pass the rows the cap cannot give even "
                             f"that power")
        if self.placebo_streams > 1 and not self.placebo_arms:
            raise ParamError(f"parameter 'placebo_streams' ({self.placebo_streams}) needs 'placebo_arms': the streams "
                             f"are placebo arms' clean runs trained again")
        parse(self)  # the study's grammar: its first broken rule is the error

    @property
    def grammar(self) -> StudyGrammar:
        """The study's arms, dose rows, engine points and subsets, parsed from these params."""
        return parse(self)

    @property
    def all_seeds(self) -> list[int]:
        """Every seed a run of this study may train: the first pass's, and the second pass's up to `max_seeds`."""
        return [self.seed + i for i in range(max(self.num_seeds, self.max_seeds))]

    @property
    def arm_labels(self) -> list[str]:
        """Every arm as `<correction>@<mode>` (a bare name takes `old_logprobs`)."""
        return list(self.grammar.arms)

    @property
    def point_arm_labels(self) -> list[str]:
        return list(self.grammar.point_arms)

    @property
    def placebo_arm_labels(self) -> list[str]:
        return list(self.grammar.placebo_arms)

    def arms_of(self, row: str, default: list[str]) -> list[str]:
        """The arm labels row `row` (a dose label, or an engine point as `engine_points` writes it) trains:
        its `row_arms` entry in the order of `arms`, else `default`."""
        return self.grammar.arms_of(row, default)

    @property
    def points(self) -> list[tuple[str, float]]:
        """(engine preset, temperature) of every engine point."""
        return [(pt.engine, pt.temperature) for pt in self.grammar.points]
