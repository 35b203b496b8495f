"""Engine-trainer mismatch at known doses, for measuring what it costs a GRPO run (notebook 08): each kind of dose,
registered in `DOSE_KINDS` with everything the study needs to know of it, and the code that applies it.

A kind is applied on the real engine path of `rlwb.core.rl.grpo` (the engine still samples; only what it reports
or which weights it samples with is changed), through the three hooks of `Dose` the loop calls. The kinds:

- *ratio mismatch* (`ratio`, params `ratio_k3`): the engine samples from the trainer's policy, but the logprobs it
  reports are off by zero-mean Gaussian noise delta ~ N(0, sigma^2) per token (symmetric: log r has mean 0). For
  r = exp(-delta), E[k3] = E[r - 1 - log r] = exp(sigma^2 / 2) - 1, so sigma = sqrt(2 ln(1 + k3)) gives an
  intended mean k3 per token (k3: Schulman, http://joschu.net/blog/kl-approx.html). It reaches the update
  through the PPO ratio (behaviour logprobs from the engine) or a correction's weights, never through sampling.
- *distribution mismatch* (`weights`, params `weight_noise`): the engine samples with weights
  theta + s * rms(theta) * z, z ~ N(0, 1) drawn once per seed (a fixed perturbation, like a lower-precision
  engine's rounding), at relative scale s. Its k3 depends on the model, so the achieved k3 is measured, not intended.
- *stale weights* (`stale`, params `stale_steps`): the engine samples at step t with the weights of step t - s
  (s updates behind, as an asynchronous trainer whose engine lags), the trainer scores with the current ones. A
  fractional s samples with the weights interpolated between the two updates it falls between,
  (1 - f) theta_{t - floor(s)} + f theta_{t - ceil(s)}, f = s - floor(s) (`LaggedWeights`; an integral s is exactly
  the weights of s updates ago). Its logprobs are exact for what it sampled, so the PPO ratio against them
  (old_logprobs: engine, PipelineRL / verl bypass) accounts for the lag, while a decoupled update without a
  correction (old_logprobs: trainer) does not. Achieved k3 is measured; the engine is first a full s updates
  behind at step ceil(s) (`DoseKind.first_full_step`).
- *one-sided ratio mismatch* (`onesided`, params `onesided_scale_error`): the engine samples right, from
  softmax(z / T) (z: the logits), but reports the logprobs of mis-scaled logits, log_softmax(a z / T) at the
  sampled token, a = 1 - dose: vLLM V1's raw logprobs (computed before the temperature is applied) are a = T, so
  at T = 0.7 they are dose 0.3, and at T = 1 dose 0 (raw = processed). Unlike `ratio`'s noise the error is
  systematic: a < 1 flattens the reported distribution, so a likely token is reported less likely than it was
  sampled, and log r = log pi_trainer - log pi_reported averages KL(pi_trainer || pi_reported) > 0 over the
  sampled tokens (one-signed, where symmetric noise averages 0). Applied as the engine's own report plus the
  exact error the trainer's logits give, log_softmax(a z / T) - log_softmax(z / T) (so the engine's float-floor
  error stays in), which costs the trainer one more forward pass per step, in runs of this kind only (the hook's
  `trainer_logp`). Its k3 has no closed form in the dose (it depends on the policy's logits): measured, not
  intended.

Noise is drawn from generators seeded by (seed, step), never from a shared random state: the arms of one seed
see the same prompts and sampling seeds, and token (sequence i, position j) of a step gets the same noise draw in
every arm, so their reward gaps are paired.

Why a registry (as verl's `register_policy_loss` and lm-eval's model registry): the study's params, its grammar
of rows, the loop, the analysis, the figures, the wording and `rlwb audit` all iterate over `dose_kinds()`, so a
new kind is its registration here (its `Dose` and its `DoseKind`) and a test. torch is imported where a dose is
applied, not here at the top: the params (validated before any kernel starts) read the registry without it.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlwb.errors import ParamError

if TYPE_CHECKING:
    import torch

# the study's rows that are not doses (`mismatch_study.design.TrainingRun.kind`): no dose kind may take their names
ROW_KINDS = ("clean", "engine", "placebo", "rerun")
NAME = re.compile(r"[a-z][a-z0-9_]*")  # a row's label is `<kind>@<dose>`, a further regime's adds `+ppo<k>`


class Dose:
    """What a dose does to one GRPO run, at the three places the loop (`grpo.train`, `grpo.grpo_step`) hands it
    over: the weights the engine starts with, the logprobs the engine reports, and the weights the engine gets
    after each update. This base changes nothing (a clean run); a kind overrides the hooks it acts through, each
    returning its argument itself where it leaves it."""

    reports = False  # the reported logprobs are off and may exceed 0 (`metrics.mismatch_metrics`' `dosed`)

    def initial(self, weights: dict) -> dict:
        """The weights the engine starts with, given the trainer's initial ones."""
        return weights

    def reported(self, logp: torch.Tensor, mask: torch.Tensor, step: int,
                 trainer_logp: Callable[[float], torch.Tensor]) -> torch.Tensor:
        """The logprobs the update sees as the engine's at `step`, given what the engine reported (`logp`, [B, L],
        real tokens where `mask`). `trainer_logp(a)`: the trainer's logprobs of the same tokens ([B, L], the
        weights before this step's update, no grad) with its logits scaled by `a` before the run's temperature T,
        log_softmax(a z / T) at each token; a = 1 is the trainer's own old logprobs, which the loop computes
        anyway, any other `a` one more forward pass, run only when a kind calls for it (`OneSidedLogprobs`)."""
        return logp

    def synced(self, weights: dict) -> dict:
        """The weights the engine samples with after an update, given the trainer's new ones."""
        return weights


@dataclass(frozen=True)
class DoseKind:
    """One kind of dose, as the study uses it. `start(dose, seed, initial weights)` is its `Dose` for one run."""

    name: str  # the `kind` of its rows and the prefix of their labels (`ratio@0.01`)
    start: Callable[[float, int, dict], Dose]
    order: int  # where it stands among the kinds in tables, panels and paragraphs
    title: str  # what it is, in a line (the doses paragraph)
    panel_title: str  # its panel's title in the dose-response figure (two lines)
    param: str  # notebook 08's parameter listing its doses
    doses: tuple  # that parameter's default
    doc: str  # that parameter's doc
    # a dose's type: float; int for a count; int | float for a count that may be fractional (an integral dose is
    # kept an int, `2.0` read as `2`: the params and their hash are those of the count it was)
    unit: type = float
    gt: float | None = None  # each dose's bounds (`checked_fields.param`)
    ge: float | None = None
    lt: float | None = None
    # the engine samples right and only what it reports is off (only the PPO ratio and a correction's weights see
    # the dose), else it samples from another policy (a distribution mismatch): `kinds_for` a real engine
    samples_right: bool = False
    intended_k3: bool = False  # a dose is an intended mean k3 per token, checked against the measured one
    noise_sd: Callable[[float], float] | None = None  # the std of the noise a dose draws (the doses paragraph)
    dose_words: str = "{:g}"  # one dose in words, as the doses paragraph writes a measured kind's dose
    intended_words: str = ""  # what an intended-k3 kind's doses are, before them in the doses paragraph (else title)
    # an arm whose update never reads the reported logprobs, so a dose that samples right cannot reach it: a control
    # that must train bitwise as its clean twin (`<kind>-blind`)
    blind_arm: str = ""
    # a dose is updates behind: the training reward is biased by dose x the clean late slope, and the dose is whole
    # from step ceil(dose) on (`first_full_step`)
    lag: bool = False
    # a raw-logprob engine's own error is of this kind (V1's raw logprobs at T != 1 are logprobs of unscaled
    # logits: a one-sided ratio error): its points join this kind's panel where a study has its rows
    raw_engine: bool = False
    headline_arm: str = "none@engine"  # the arm whose gap at the largest dose the index shows (`HEADLINE`)

    def __post_init__(self):
        if not NAME.fullmatch(self.name) or self.name in ROW_KINDS:
            raise ValueError(f"dose kind name {self.name!r} must match {NAME.pattern} and not be one of the study's "
                             f"other rows {ROW_KINDS}")
        if self.blind_arm and not self.samples_right:
            raise ValueError(f"dose kind {self.name!r}: a distribution mismatch reaches every arm through what the "
                             f"engine samples, so no arm is blind to it (blind_arm {self.blind_arm!r})")

    def first_full_step(self, dose) -> int:
        """The first step at which the dose acts in full on the policy the run starts from: 0 for a kind acting from
        the start, `ceil(dose)` for a lag (the engine is first that many updates behind then: stale@2 is 0 updates
        behind at step 0, 1 at step 1, 2 from step 2; stale@0.5 is 0 behind at step 0, half an update from step 1,
        where it samples with weights halfway between the trainer's last two). The k3 a run measures there is the
        dose's exposure, `k3_initial`: what the dose gives the initial policy, before training has moved it (later
        k3 is partly an outcome: a run the dose degrades drifts further from its engine)."""
        return math.ceil(dose) if self.lag else 0

    def label(self, dose) -> str:
        """A dose row's label: `<kind>@<dose:g>` (two doses that print alike would share it)."""
        return f"{self.name}@{dose:g}"


DOSE_KINDS: dict[str, DoseKind] = {}


def register_dose_kind(name: str, **spec) -> Callable[[type[Dose]], type[Dose]]:
    """A class decorator: registers the `Dose` subclass it decorates as kind `name` (`spec`: the other fields of
    `DoseKind`; the class is its `start`). A name registered twice is refused."""
    def register(cls: type[Dose]) -> type[Dose]:
        if name in DOSE_KINDS:
            raise ValueError(f"dose kind {name!r} is registered already")
        DOSE_KINDS[name] = DoseKind(name=name, start=cls, **spec)
        return cls

    return register


def dose_kinds() -> list[DoseKind]:
    """Every registered kind, in `order`."""
    return sorted(DOSE_KINDS.values(), key=lambda k: k.order)


def dose_kind(name: str) -> DoseKind:
    """The registered kind `name`; an unknown name is refused with the kind it most resembles."""
    if name in DOSE_KINDS:
        return DOSE_KINDS[name]
    close = difflib.get_close_matches(name, list(DOSE_KINDS), n=1)
    raise ParamError(f"unknown dose kind {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                     + f" (dose kinds: {', '.join(k.name for k in dose_kinds())})")


def start(kind: str, dose: float, seed: int, initial: dict) -> Dose:
    """Run `seed`'s `Dose` for `dose` of `kind` from the trainer's `initial` weights; kind "": no dose."""
    return dose_kind(kind).start(dose, seed, initial) if kind else Dose()


def kinds_for(raw: bool) -> list[str]:
    """The kinds a real engine's mismatch is of, in order: for an engine that reports raw logprobs (it samples right,
    reports wrong) those that sample right, for any other the distribution mismatches."""
    return [k.name for k in dose_kinds() if k.samples_right == raw]


def logprob_noise_sigma(k3: float) -> float:
    """The std of Gaussian log-ratio noise whose mean k3 per token is `k3` (exp(sigma^2/2) - 1 = k3)."""
    if k3 < 0:
        raise ValueError(f"a k3 dose must be >= 0, got {k3}")
    return math.sqrt(2.0 * math.log1p(k3))


NOISE_WIDTH = 4096  # positions drawn per sequence whatever the batch's width: a token's draw depends on (row, pos)


def noisy_logprobs(logp: torch.Tensor, mask: torch.Tensor, k3: float, seed: int, step: int) -> torch.Tensor:
    """`logp` [B, L] plus N(0, sigma(k3)^2) on the real tokens (`mask`), seeded by (seed, step).

    Not capped at 0: a cap would make the error one-sided wherever the policy is confident (at p ~ 1 every draw
    above 0 is cut, so r = pi_trainer / pi_engine >= 1 on such tokens: a systematic bias, not noise, measured at
    +0.06 to +0.47 mean log r on the default policy before this was fixed). A reported "logprob" above 0 is not
    a probability, but it is what a symmetric error in the reported value is; the update only ever sees it in
    a ratio. The draws fill a [B, NOISE_WIDTH] array whatever the batch's width, so token (i, j) gets the same
    draw in every arm of a seed and step even when their completions' lengths differ."""
    if k3 == 0:
        return logp
    import torch

    B, L = logp.shape
    g = torch.Generator().manual_seed(1_000_003 * seed + step + 17)
    z = torch.randn((B, max(L, NOISE_WIDTH)), generator=g, dtype=torch.float64)[:, :L]
    z = z.to(logp.dtype).to(logp.device)
    return logp + logprob_noise_sigma(k3) * z * mask.to(logp.dtype)


def weight_noise(state: dict, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """A fixed perturbation per seed: for every floating tensor, scale * rms(tensor) * z with z ~ N(0, 1)
    (the rms of the initial weights, so the perturbation does not grow with training)."""
    import torch

    g = torch.Generator().manual_seed(7_919 * seed + 5)
    out = {}
    for k, v in state.items():
        if v.is_floating_point() and v.numel() > 1:
            z = torch.randn(v.shape, generator=g, dtype=torch.float32)
            out[k] = (scale * v.detach().float().pow(2).mean().sqrt().cpu() * z).to(v.dtype)
    return out


def perturbed(state: dict, noise: dict[str, torch.Tensor] | None) -> dict:
    """`state` with `noise` added (the weights the engine samples with); `state` itself is not changed."""
    if not noise:
        return state
    return {k: (v.detach() + noise[k].to(v.device) if k in noise else v) for k, v in state.items()}


class LaggedWeights:
    """The weights an engine `lag` updates behind samples with: `push` the trainer's weights after each update
    and get those of `lag` updates earlier (the initial weights until that many updates have happened). A
    fractional lag s gets the weights interpolated between the two updates it falls between,
    (1 - f) * theta_{t - floor(s)} + f * theta_{t - ceil(s)} with f = s - floor(s), each clamped to the initial
    weights (computed in float32 and cast back; tensors that are not floating, and an integral lag, are those of
    a single update, bitwise). Keeps ceil(lag) + 1 detached copies."""

    def __init__(self, initial: dict, lag: float):
        if not lag > 0:
            raise ValueError(f"an engine lag must be > 0 updates, got {lag}")
        self.near, self.far = math.floor(lag), math.ceil(lag)
        self.frac = lag - self.near
        self._states: deque[dict] = deque([_snapshot(initial)], maxlen=self.far + 1)

    def push(self, state: dict) -> dict:
        self._states.append(_snapshot(state))
        far = self._states[0]  # ceil(lag) updates back, or the initial weights until there are that many
        if not self.frac:
            return far
        near = self._states[max(0, len(self._states) - 1 - self.near)]
        return {k: (((1 - self.frac) * v.float() + self.frac * far[k].float()).to(v.dtype) if v.is_floating_point()
                    else v) for k, v in near.items()}


def _snapshot(state: dict) -> dict:
    return {k: v.detach().clone() for k, v in state.items()}


@register_dose_kind(
    "ratio", order=0, title="ratio mismatch (reported logprobs off, sampling right)",
    panel_title="ratio mismatch\n(reported logprobs off, sampling right)",
    param="ratio_k3", doses=(1e-2, 1e-1, 1.0), gt=0,
    doc="ratio-mismatch doses: intended mean k3 per token of Gaussian noise on the engine's reported logprobs",
    samples_right=True, intended_k3=True, noise_sd=logprob_noise_sigma,
    intended_words="Ratio mismatch (zero-mean Gaussian noise of std sqrt(2 ln(1 + k3)) on the reported logprobs; "
                   "intended → measured k3, and the measured mean log r, which symmetric noise keeps near 0)",
    blind_arm="none@trainer")
class LogprobNoise(Dose):
    """Gaussian noise of intended mean k3 `k3` on the logprobs the engine reports (`noisy_logprobs`)."""

    def __init__(self, k3: float, seed: int, initial: dict):
        self.k3, self.seed = float(k3), seed
        self.reports = self.k3 > 0

    def reported(self, logp, mask, step, trainer_logp):
        return noisy_logprobs(logp, mask, self.k3, self.seed, step)


@register_dose_kind(
    "weights", order=1, title="distribution mismatch (engine samples with perturbed weights)",
    panel_title="distribution mismatch\n(engine samples perturbed weights)",
    param="weight_noise", doses=(0.03,), gt=0,
    doc="distribution-mismatch doses: the engine samples with weights plus this times their rms times N(0, 1)",
    dose_words="weight noise {:g} × rms")
class PerturbedWeights(Dose):
    """The engine samples with the trainer's weights plus a fixed perturbation per seed (`weight_noise`) of
    relative size `scale`, from the start and after every update."""

    def __init__(self, scale: float, seed: int, initial: dict):
        self.noise = weight_noise(initial, scale, seed) if scale else None

    def initial(self, weights):
        return perturbed(weights, self.noise)

    def synced(self, weights):
        return perturbed(weights, self.noise)


@register_dose_kind(
    "stale", order=2, title="distribution mismatch (engine samples with weights some updates behind)",
    panel_title="distribution mismatch\n(engine weights updates behind)",
    param="stale_steps", doses=(2,), unit=int | float, gt=0,
    doc="distribution-mismatch doses: the engine samples with the weights of this many updates ago (an "
        "asynchronous trainer's lag; a fraction interpolates between the two updates around it)",
    dose_words="{:g} update(s) behind", lag=True, headline_arm="none@trainer")
class StaleWeights(Dose):
    """The engine samples with the weights of `lag` updates ago (`LaggedWeights`, from the initial weights)."""

    def __init__(self, lag: float, seed: int, initial: dict):
        self.lagged = LaggedWeights(initial, lag) if lag else None

    def synced(self, weights):
        return self.lagged.push(weights) if self.lagged is not None else weights


def rescaled_logprobs(logp: torch.Tensor, mask: torch.Tensor, scale: float,
                      trainer_logp: Callable[[float], torch.Tensor]) -> torch.Tensor:
    """`logp` (what the engine reported) moved to the logprobs of logits scaled by `scale`: plus the trainer's
    log_softmax(scale z / T) - log_softmax(z / T) on the real tokens (`mask`). The engine's own error against the
    trainer (its float floor) stays in; the error added is exact for the trainer's logits."""
    if scale == 1:
        return logp
    return logp + (trainer_logp(scale) - trainer_logp(1.0)).to(logp.dtype) * mask.to(logp.dtype)


@register_dose_kind(
    "onesided", order=3, title="one-sided ratio mismatch (logprobs of mis-scaled logits reported, sampling right)",
    panel_title="one-sided ratio mismatch\n(logprobs of mis-scaled logits)",
    param="onesided_scale_error", doses=(), gt=0, lt=1,
    doc="one-sided ratio-mismatch doses: the engine samples right but reports log_softmax((1 - dose) x logits / "
        "T); vLLM V1's raw logprobs are dose 1 - T (0.3 at T 0.7)",
    samples_right=True, dose_words="logits × (1 − {:g})", blind_arm="none@trainer", raw_engine=True)
class OneSidedLogprobs(Dose):
    """The logprobs the engine reports are those of its logits scaled by 1 - `error` before the temperature
    (`rescaled_logprobs`); it samples right. A systematic error, not noise: the same every step and seed."""

    def __init__(self, error: float, seed: int, initial: dict):
        self.scale = 1.0 - float(error)
        self.reports = self.scale != 1  # the added error may lift a logprob near 0 above it by float rounding

    def reported(self, logp, mask, step, trainer_logp):
        return rescaled_logprobs(logp, mask, self.scale, trainer_logp)
