"""Notebook 08's study grammar, parsed once: which arms the study trains (each as its label
`<correction>@<mode>`), its dose rows (`<kind>@<dose>`, one per dose of each kind of `mismatch_doses.DOSE_KINDS`),
its real engine points (`<preset>[@knob...][@T<temperature>]`), the rows trained with fewer arms (`row_arms`), the
PPO regimes and the long-horizon rows with the arms and rows they train.

`parse` is the one reader of these params: the schema (`rlwb.params.schemas.mismatch_cost`) validates the params
by parsing them, so a study that does not parse never starts, and `design.training_runs` builds its jobs from the
parsed `StudyGrammar`. Nothing here reads an engine or a file, and nothing imports torch or pandas: the params are
validated before any kernel starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from rlwb.core.rl.correction_catalog import check_modes
from rlwb.core.rl.mismatch_doses import dose_kind, dose_kinds
from rlwb.errors import ParamError

POINT_T = re.compile(r"@T(\d+(?:\.\d*)?)$")  # `vllm-v1@T0.5`: an engine point at its own temperature
# `<kind>@<dose>`: a dose row, whether or not this study lists that dose (a sweep's grid cell may lack it)
DOSE_ROW = re.compile(r"(\w+)@\d+(\.\d*)?(e-?\d+)?")

# the kinds of test a study may declare, before it runs, to confirm (params `confirms`): the paired contrasts
# (`comparisons.contrast_table`'s kinds) and the long horizon's change (`comparisons.horizon_table`); every test not
# declared is exploratory. Seeds of a confirmation start at CONFIRM_SEED_BASE (a study's start at 0): fresh ones.
CONTRASTS = ("correction", "mode", "one-sided vs symmetric", "band", "regime")
CONFIRMABLE = (*CONTRASTS, "horizon")
CONFIRM_SEED_BASE = 1000


def split_point(entry: str, default_t: float) -> tuple[str, float]:
    """`<engine>[@T<temperature>]` -> (engine, temperature); without a temperature, the notebook's."""
    m = POINT_T.search(entry)
    return (entry[: m.start()], float(m.group(1))) if m else (entry, default_t)


def arm_label(arm: str, old_logprobs: str) -> str:
    """An arm as `<correction>@<mode>`: a bare correction name takes the study's `old_logprobs`."""
    return arm if "@" in arm else f"{arm}@{old_logprobs}"


class Regime(NamedTuple):
    """A PPO regime: `epochs` passes over the same rollout batch, each cut into `updates` mini-batches of one
    optimizer step (`grpo.policy_updates`): updates x epochs optimizer steps per batch."""

    updates: int
    epochs: int = 1

    @property
    def name(self) -> str:
        """`4x1`: mini-batches x epochs."""
        return f"{self.updates}x{self.epochs}"


@dataclass(frozen=True)
class DoseRow:
    """One dose of one kind: the `kind`, the `dose` in that kind's unit, and the row's `label` (`ratio@0.01`)."""

    kind: str
    dose: float
    label: str


@dataclass(frozen=True)
class EnginePoint:
    """A real engine placed on the dose-response: its `entry` as `engine_points` writes it (a `row_arms` row name),
    the preset it runs, the temperature it samples at and the arms it trains."""

    entry: str
    engine: str
    temperature: float
    arms: tuple[str, ...]


@dataclass(frozen=True)
class StudyGrammar:
    """The study's rows and arms, every arm as its label, in the order of the params."""

    arms: tuple[str, ...]
    doses: tuple[DoseRow, ...]  # every dose row, kind by kind in the registry's order
    points: tuple[EnginePoint, ...]
    point_arms: tuple[str, ...]
    placebo_arms: tuple[str, ...]  # the arms whose clean run is trained again on an independent sampling stream
    regimes: tuple[Regime, ...]  # mini-batches x epochs per rollout batch: the first trains every row
    regime_arms: tuple[str, ...]  # the arms the further regimes train
    regime_rows: tuple[DoseRow, ...]  # the dose rows the further regimes train
    long_steps: int  # 0: no long-horizon rows
    long_arms: tuple[str, ...]
    long_rows: tuple[DoseRow, ...]
    row_arms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # row -> the arms it trains, in arms' order

    def arms_of(self, row: str, default) -> list[str]:
        """The arm labels row `row` (a dose label, or an engine point as `engine_points` writes it) trains: its
        `row_arms` entry, else `default`."""
        return list(self.row_arms.get(row, default))


def dose_lists(p) -> dict[str, list]:
    """Each kind's doses as the params list them. A kind registered after the schema was built has no field in it,
    and no doses here."""
    return {k.name: list(getattr(p, k.param, [])) for k in dose_kinds()}


def parse(p) -> StudyGrammar:
    """The grammar of notebook 08's params `p` (its fields by name), or the first rule it breaks as a `ParamError`
    naming the parameter: entries listed twice, doses whose labels would print alike, an arm in a mode its
    correction is not defined for, arm subsets that are not subsets of `arms`, rows that no dose list has, a
    long horizon no longer than the study's, a `row_arms` entry that is neither a dose row nor an engine point."""
    label = {a: arm_label(a, p.old_logprobs) for a in [*p.arms, *p.point_arms, *p.placebo_arms, *p.regime_arms,
                                                      *p.long_arms]}
    arms = [label[a] for a in p.arms]
    doses = dose_lists(p)
    kinds = {k.name: k for k in dose_kinds()}
    for name, values in (("arms", arms), *((kinds[k].param, v) for k, v in doses.items())):
        if len(set(values)) != len(values):
            raise ParamError(f"parameter {name!r} lists an entry twice: {values}")
        if name != "arms" and len({f"{v:g}" for v in values}) != len(values):  # runs are labelled `<kind>@<v:g>`
            raise ParamError(f"parameter {name!r} has doses that print alike ({[f'{v:g}' for v in values]}): "
                             f"their runs would share one label")
    for a in arms:
        corr, _, mode = a.partition("@")
        check_modes([corr], mode, param=f"arms ({a})")
    point_arms = [label[a] for a in p.point_arms]
    if p.engine_points and not set(point_arms) <= set(arms):
        raise ParamError(f"parameter 'point_arms' must be a subset of 'arms' (each point is paired with the clean "
                         f"run of the same arm), got {p.point_arms} with arms {p.arms}")
    at = [split_point(e, p.temperature) for e in p.engine_points]
    if len(set(at)) != len(at):
        raise ParamError(f"parameter 'engine_points' lists an engine at one temperature twice: {p.engine_points}")
    if not {label[a] for a in p.placebo_arms} <= set(arms):
        raise ParamError(f"parameter 'placebo_arms' must be a subset of 'arms' (a placebo is paired with the clean "
                         f"run of the same arm), got {p.placebo_arms} with arms {p.arms}")
    if not {label[a] for a in p.regime_arms} <= set(arms):
        raise ParamError(f"parameter 'regime_arms' must be a subset of 'arms', got {p.regime_arms} with arms "
                         f"{p.arms}")
    regimes = ppo_regimes(p)
    if max(p.updates_per_batch) > p.prompts_per_step * p.group_size:
        raise ParamError(f"parameter 'updates_per_batch' {p.updates_per_batch}: a rollout batch has only "
                         f"{p.prompts_per_step * p.group_size} sequences to cut into mini-batches")
    rows = [DoseRow(k, float(d), kinds[k].label(d)) for k, values in doses.items() for d in values]
    labels = {r.label for r in rows}
    if not set(p.long_doses) <= labels:
        raise ParamError(f"parameter 'long_doses' names rows no dose list has: "
                         f"{sorted(set(p.long_doses) - labels)} (the doses are {sorted(labels)})")
    if p.long_steps and p.long_steps <= p.steps:
        raise ParamError(f"parameter 'long_steps' ({p.long_steps}) must exceed 'steps' ({p.steps}), or be 0")
    if (p.long_doses or p.long_arms) and not p.long_steps:
        raise ParamError("parameters 'long_doses' / 'long_arms' need 'long_steps' > 0")
    if not {label[a] for a in p.long_arms} <= set(arms):
        raise ParamError(f"parameter 'long_arms' must be a subset of 'arms', got {p.long_arms}")
    row_arms = {}
    for entry in p.row_arms:
        row, *listed = entry.split() or [""]
        if not listed:
            raise ParamError(f"parameter 'row_arms': entry {entry!r} must be '<row> <arm> [<arm> ...]'")
        if row in row_arms:
            raise ParamError(f"parameter 'row_arms' lists row {row!r} twice")
        if row not in p.engine_points and not is_dose_row(row):  # a dose row this grid cell lacks (a sweep's
            # smaller ratio_k3) is allowed: the entry applies where the row exists
            raise ParamError(f"parameter 'row_arms': {row!r} is neither a dose row (<kind>@<dose>, e.g. "
                             f"{sorted(labels)[:2]}) nor an engine point ({p.engine_points})" + unknown_kind(row))
        named = [arm_label(a, p.old_logprobs) for a in listed]
        bad = [a for a, lab in zip(listed, named) if lab not in arms]
        if bad:
            raise ParamError(f"parameter 'row_arms': row {row!r} names arms not in 'arms': {bad}")
        row_arms[row] = tuple(a for a in arms if a in set(named))
    if not set(p.regime_doses) <= labels:
        raise ParamError(f"parameter 'regime_doses' names rows no dose list has: "
                         f"{sorted(set(p.regime_doses) - labels)} (the doses are {sorted(labels)})")
    return StudyGrammar(
        arms=tuple(arms), doses=tuple(rows),
        points=tuple(EnginePoint(entry, e, t, row_arms.get(entry, tuple(point_arms)))
                     for entry, (e, t) in zip(p.engine_points, at)),
        point_arms=tuple(point_arms), placebo_arms=tuple(label[a] for a in p.placebo_arms),
        regimes=regimes, regime_arms=subset(arms, [label[a] for a in p.regime_arms]),
        regime_rows=tuple(r for r in rows if not p.regime_doses or r.label in p.regime_doses),
        long_steps=p.long_steps, long_arms=subset(arms, [label[a] for a in p.long_arms]),
        long_rows=tuple(r for r in rows if r.label in p.long_doses), row_arms=row_arms)


def ppo_regimes(p) -> tuple[Regime, ...]:
    """The PPO regimes of params `p`: `updates_per_batch` paired by position with `ppo_epochs` (a single entry of
    `ppo_epochs` pairs with every regime), or a `ParamError` for lists that do not pair or a regime listed twice."""
    updates, epochs = list(p.updates_per_batch), list(p.ppo_epochs)
    if len(epochs) not in (1, len(updates)):
        raise ParamError(f"parameter 'ppo_epochs' {epochs} must hold one entry per regime of 'updates_per_batch' "
                         f"{updates} (its epochs, by position), or one entry for every regime")
    regimes = tuple(Regime(u, e) for u, e in zip(updates, epochs * len(updates) if len(epochs) == 1 else epochs))
    if len(set(regimes)) != len(regimes):
        raise ParamError(f"parameter 'updates_per_batch' lists a regime twice: {updates}"
                         + (f" with ppo_epochs {epochs} ({[r.name for r in regimes]}, mini-batches x epochs)"
                            if epochs != [1] else ""))
    return regimes


def subset(arms: list[str], chosen: list[str]) -> tuple[str, ...]:
    """The arms of `arms` that are `chosen`, in the order of `arms`; every arm where none is chosen."""
    return tuple(a for a in arms if not chosen or a in set(chosen))


def is_dose_row(row: str) -> bool:
    """`<kind>@<dose>` with a registered kind."""
    m = DOSE_ROW.fullmatch(row)
    return bool(m) and any(k.name == m.group(1) for k in dose_kinds())


def unknown_kind(row: str) -> str:
    """What is wrong with a row written as a dose row of an unregistered kind (the kind it most resembles), else
    nothing."""
    m = DOSE_ROW.fullmatch(row)
    if not m:
        return ""
    try:
        dose_kind(m.group(1))
    except ParamError as e:
        return f": {e}"
    return ""
