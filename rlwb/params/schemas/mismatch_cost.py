"""Notebook 08's parameters: the GRPO loop's settings plus the study's grammar (arms, dose rows, engine points,
rows trained with fewer arms, PPO regimes, long-horizon rows) and the checks that keep it consistent."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.core.rl.correction_catalog import check_modes
from rlwb.core.rl.grpo_config import GRPOSettings
from rlwb.errors import ParamError
from rlwb.params.schemas.base import EngineParams, SeededRuns, check_engine, concurrent_runs_param, engine_list


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


@dataclass
class MismatchCostParams(GRPOSettings, EngineParams, SeededRuns):
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
