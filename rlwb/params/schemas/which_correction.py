"""Notebook 07's parameters: the GRPO loop's settings plus the mismatch levels, the corrections raced on them
and the equivalence margin."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.core.rl.correction_catalog import CORRECTIONS, check_modes
from rlwb.core.rl.grpo_config import GRPOSettings
from rlwb.errors import ParamError
from rlwb.params.schemas.base import CORRECTIONS_DOC, EngineParams, SeededRuns, concurrent_runs_param, engine_list


@dataclass
class CorrectionRaceParams(GRPOSettings, EngineParams, SeededRuns):
    """Notebook 07: the GRPO loop's settings (decoupled by default: the mode peers define IS corrections in)
    plus the race's levels and corrections."""

    NOTEBOOK: typing.ClassVar[str] = "07_which_correction"
    HEADLINE: typing.ClassVar[list[str]] = ["vllm-v1-fixed+none/reward_final", "vllm-v1-bf16+none/gap",
                                             "vllm-v1-raw+none/gap"]

    # levels every machine runs: notebook 06's worst knob, an fp8 KV cache (`vllm-v1-fixed@kv-fp8-e5m2`: on
    # qwen2-chat k3 5e-3, the only knob over NeMo-RL's token_mult_prob_error bound; a level of the run of record), is
    # left out because vLLM V1 keeps one on a CPU only with AVX-512 or AMX (`presets.unsupported_here`): add it to
    # `engines` on such a CPU or a GPU (docs/results/07_which_correction.md)
    engines: list[str] = engine_list(["vllm-v1-fixed", "vllm-v1-raw", "vllm-v1-bf16"],
                                     "mismatch levels (engine presets); the first is the no-mismatch baseline",
                                     unique=True)
    corrections: list[str] = param(["none", "verl.token_tis", "verl.seq_mis", "verl.geo_rs", "icepop",
                                    "trl.sequence_mask", "miles.tis_geo_norm"], CORRECTIONS_DOC,
                                   choices=CORRECTIONS, unique=True)
    old_logprobs: str = param("trainer", "behaviour logprobs in the PPO ratio: trainer (decoupled, as the "
                                         "peers define IS corrections) or engine", choices=["engine", "trainer"])
    steps: int = param(20, "GRPO steps per run", ge=1)
    num_seeds: int = param(3, "seeds per configuration: seed, seed+1, ...", ge=1)
    race_on_baseline: bool = param(False, "also race every correction on the baseline level (else `none` only)")
    margin: float = param(0.05, "equivalence margin on the final-reward gap: a correction recovers a level when "
                                "its gap to the baseline is shown inside +-margin (TOST, Holm-corrected)", gt=0, lt=1)
    concurrent_runs: int = concurrent_runs_param()

    def __post_init__(self):
        check_modes(self.corrections, self.old_logprobs)
        if "none" not in self.corrections:
            raise ParamError("parameter 'corrections' must include 'none': the uncorrected run at each level is "
                             "what the corrections are measured against")

    def corrections_for(self, engine: str) -> list[str]:
        """The corrections run on `engine`'s rollouts: `none` alone on the baseline level (the first engine)
        unless `race_on_baseline`."""
        return ["none"] if engine == self.engines[0] and not self.race_on_baseline else list(self.corrections)
