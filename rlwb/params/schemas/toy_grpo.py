"""Notebook 03's parameters: the GRPO loop's settings (inherited from `GRPOSettings`, declared there once) plus
the grid of engines, corrections and seeds, and the mismatch breaker."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.core.rl.correction_catalog import CORRECTIONS, check_modes
from rlwb.core.rl.grpo_config import GRPOSettings
from rlwb.core.rl.mismatch_breaker import MONITORED
from rlwb.params.schemas.base import CORRECTIONS_DOC, EngineParams, SeededRuns, concurrent_runs_param, engine_list


@dataclass
class GRPOParams(GRPOSettings, EngineParams, SeededRuns):
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
    # every step of every seed). Decided per engine from its own `none` runs, never from a fixed list.
    skip_at_floor: bool = param(True, "run the other corrections on an engine only if its `none` runs measured "
                                      "engine-trainer k3 above the float floor (1e-8) at some step")
    num_seeds: int = param(3, "seeds per configuration: seed, seed+1, ...", ge=1)
    drift_threshold: float = param(1e-5, "drift monitor: level of drift_metric (mean of 2-step windows, twice in a "
                                         "row) that trips it; 0 turns it off", ge=0)
    drift_metric: str = param("mismatch_k3", "per-step curve column the drift monitor watches (ess trips below "
                                             "the threshold, the others above)", choices=list(MONITORED))
    concurrent_runs: int = concurrent_runs_param()

    def __post_init__(self):
        check_modes(self.corrections, self.old_logprobs)
