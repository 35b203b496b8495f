"""The GRPO loop's settings, apart from the loop (`grpo.py`) so that reading them imports no torch.

`GRPOSettings` are the ones notebook 03 exposes (its `GRPOParams` inherits them: names, defaults, docs and
ranges are declared here only); `GRPOConfig` is one training run: those plus the per-run choices.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rlwb.core.checked_fields import param
from rlwb.core.rl.mismatch_doses import dose_kind


@dataclass
class GRPOSettings:
    """The loop's settings a notebook exposes as parameters: `GRPOParams` inherits these fields, so the names,
    defaults, docs and ranges exist here only (a run's `GRPOConfig` adds the per-run ones)."""

    steps: int = param(50, "GRPO steps per run", ge=1)
    prompts_per_step: int = param(8, "distinct prompts per step", ge=1)
    group_size: int = param(8, "completions per prompt (the GRPO group)", ge=2)
    lr: float = param(1.5e-4, "AdamW learning rate of the trainer", gt=0, lt=1)
    temperature: float = param(0.7, "sampling temperature (> 0)", gt=0, le=10)
    max_tokens: int = param(32, "max completion tokens", ge=1)
    old_logprobs: str = param("engine", "behaviour logprobs in the PPO ratio: engine or trainer",
                              choices=["engine", "trainer"])
    clip_eps: float = param(0.2, "PPO clip epsilon", gt=0, lt=1)
    tis_cap: float = param(2.0, "TIS truncation cap C", gt=0)
    micro_batch: int = param(0, "sequences per forward/backward of the update (gradient accumulation); "
                                "0 means all at once", ge=0)
    max_digits: int = param(3, "operands of the training prompts have 1 to this many digits (qwen2-chat: 2)", ge=1)

    def trainer_forward(self, context: int, prompt_allowance: int) -> tuple[int, int]:
        """(sequences, tokens each) of the update's largest forward pass, for the GPU memory plan
        (`rlwb.memory_plan.forward_size`): a micro-batch, or the whole step's batch when unsplit."""
        return (self.micro_batch or self.prompts_per_step * self.group_size), self.max_tokens + prompt_allowance


@dataclass
class GRPOConfig(GRPOSettings):
    """One training run: the exposed settings plus what the notebook varies per run (correction, seed) and
    the constants it does not expose."""

    correction: str = "none"  # a name of rlwb.core.rl.correction_catalog.CATALOG
    seed: int = 0
    beta: float = 0.0
    max_grad_norm: float = 1.0
    # a mismatch dose (notebook 08): a kind of `rlwb.core.rl.mismatch_doses.DOSE_KINDS` ("": none) and its dose, in
    # that kind's unit (an intended k3, a relative weight noise, updates behind, ...)
    dose_kind: str = ""
    dose: float = 0.0
    # policy updates per rollout batch: the batch cut into this many mini-batches, one optimizer step each (PPO's
    # several updates per batch; the decoupled ratio pi_theta / pi_old is 1 only on the first): `grpo.policy_updates`
    updates_per_batch: int = 1
    # passes over the same rollout batch (PPO epochs; verl's ppo_epochs, OpenRLHF's max_epochs): each pass cut into
    # the same `updates_per_batch` mini-batches, so a run makes updates_per_batch x ppo_epochs optimizer steps per batch
    ppo_epochs: int = 1
    # which stream of sampling seeds the engine draws from (`sampling_seed`): 0 the run's own; another value an
    # independent one on the same prompts (notebook 08's placebo rows: the clean run again, only its sampling differs)
    sampling_stream: int = 0

    def __post_init__(self):
        if self.dose_kind:
            dose_kind(self.dose_kind)  # an unknown kind is refused here, not at the run's first step
        if self.updates_per_batch < 1:
            raise ValueError(f"updates_per_batch must be >= 1, got {self.updates_per_batch}")
        if self.ppo_epochs < 1:
            raise ValueError(f"ppo_epochs must be >= 1, got {self.ppo_epochs}")
        if self.updates_per_batch > self.prompts_per_step * self.group_size:
            raise ValueError(f"updates_per_batch {self.updates_per_batch} exceeds the batch's "
                             f"{self.prompts_per_step * self.group_size} sequences")

    @property
    def single_update(self) -> bool:
        """One optimizer step per rollout batch (one mini-batch, one epoch): the decoupled ratio is 1 throughout."""
        return self.updates_per_batch == 1 and self.ppo_epochs == 1

    @classmethod
    def from_settings(cls, settings: GRPOSettings, **per_run) -> GRPOConfig:
        """The run's config from any object holding the settings (a `GRPOParams`), plus per-run fields."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(GRPOSettings)}, **per_run)


STREAM_STRIDE = 5_000_011  # > any step's offset (step * 1000 for < 5000 steps) and < the seeds' stride: no overlap


def sampling_seed(seed: int, step: int, stream: int = 0) -> int:
    """The engine's sampling seed at GRPO step `step` of a run with `seed` (its requests draw from it on): a
    `stream` other than 0 is an independent sequence of seeds on the same problems (`step_problem_seed` does not
    depend on it), which never meets stream 0 of any seed for runs under 5000 steps."""
    return seed * 10_000_019 + step * 1000 + stream * STREAM_STRIDE


def step_problem_seed(seed: int, step: int) -> int:
    """The seed of the task problems GRPO step `step` of a run with `seed` draws (fresh problems every step).
    `rlwb bench` gives its baselines (the minimal loop, TRL + vLLM) the same problems, so the loops compared
    sample from the same prompts and their completions have the same length distribution."""
    return seed * 1_000_003 + step
