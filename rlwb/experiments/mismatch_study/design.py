"""Notebook 08's study design: which GRPO runs the study trains (`training_runs`, from the params' grammar of arms,
dose rows, engine points, PPO regimes and long-horizon rows, parsed by `grammar.parse`), what each is called in tables
and metric keys, the GRPO settings each runs with (`config`), and the fixed problem sets every trained policy is
scored and probed on. Nothing here trains or measures: `execution` runs these, `analysis` and `comparisons` read
their curves."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from rlwb.core.data import tasks
from rlwb.core.rl.grpo_config import GRPOConfig, step_problem_seed
from rlwb.core.rl.mismatch_doses import DOSE_KINDS, dose_kinds
from rlwb.experiments.mismatch_study.grammar import Regime


def dosed_kinds() -> list[str]:
    """The kinds with a numeric dose (`mismatch_doses.DOSE_KINDS`), in the order the report shows them."""
    return [k.name for k in dose_kinds()]


@dataclass(frozen=True)
class TrainingRun:
    """One GRPO run of the study: which mismatch (`kind` and `dose`, or a real engine `point`), which arm, which
    seed, on which engine and at which temperature. Its clean twin is the clean run of the same arm and seed at the same
    temperature."""

    kind: str  # clean | engine | placebo | rerun, or a kind of `mismatch_doses.DOSE_KINDS` (ratio, weights, stale)
    dose: float  # in the kind's unit (an intended k3, a relative weight noise, updates behind); 0 clean; NaN engine
    arm: str
    seed: int
    engine: str
    temperature: float
    label: str  # the row's name in tables and metric keys: clean, clean@T0.5, ratio@0.01, vllm-v1@T0.5, rerun,
    # placebo (placebo#<k> for stream k > 1), and in a further PPO regime the label + `+ppo<updates>[x<epochs>]`
    # (clean+ppo4, ratio@1+ppo2x2)
    updates: int = 1  # mini-batches per pass over the rollout batch, one optimizer step each (the PPO regime)
    epochs: int = 1  # passes over the same rollout batch (the PPO regime's epochs): updates x epochs optimizer steps
    stream: int = 0  # sampling-seed stream: 0, or a placebo's k = 1..placebo_streams (`sampling_stream`)
    steps: int = 0  # the run's GRPO steps: 0 the study's `steps`, else `long_steps` (label + `+long`)

    @property
    def regime(self) -> Regime:
        """Its PPO regime: mini-batches x epochs."""
        return Regime(self.updates, self.epochs)

    @property
    def twin(self) -> tuple[float, int, int, str, int, int]:
        return self.temperature, self.updates, self.steps, self.arm, self.seed, self.epochs

    @property
    def name(self) -> str:
        """What its files in the job store are named by (`job_store.job_key`: with a hash of every field)."""
        return f"{self.label}.{self.arm}.s{self.seed}"


def training_runs(p) -> list[TrainingRun]:
    """Every run: each arm clean (dose 0) at the notebook's temperature (and at every other temperature a point
    uses, the arms of the points there), at every dose of each kind, each point engine with `point_arms`, the
    placebo arms' clean runs again on each of `placebo_streams` independent sampling-seed streams (same prompts:
    rows `placebo`, `placebo#2`, ...), and the first clean run
    again (the reproducibility control), all in the first PPO regime (`updates_per_batch[0]` mini-batches x
    `ppo_epochs[0]` epochs); a row named in `row_arms` trains only the arms listed there. Each further regime trains
    `regime_arms` (every arm if empty) clean and at `regime_doses` (every dose if empty). Clean runs first, so dosed
    runs find their twins' policies ready."""
    g = p.grammar
    base, T = p.engines[0], p.temperature
    u0, further = g.regimes[0], g.regimes[1:]
    out = [TrainingRun("clean", 0.0, a, s, base, T, "clean", *u0) for a in g.arms for s in p.seeds]
    for t in dict.fromkeys(pt.temperature for pt in g.points if pt.temperature != T):  # their arms only
        used = {a for pt in g.points if pt.temperature == t for a in pt.arms}
        out += [TrainingRun("clean", 0.0, a, s, base, t, clean_label(t, T), *u0) for a in g.arms if a in used
                for s in p.seeds]
    out += [TrainingRun("clean", 0.0, a, s, base, T, "clean" + regime_suffix(u, u0), *u) for u in further
            for a in g.regime_arms for s in p.seeds]
    out += [TrainingRun(r.kind, r.dose, a, s, base, T, r.label, *u0) for r in g.doses
            for a in g.arms_of(r.label, g.arms) for s in p.seeds]
    out += [TrainingRun(r.kind, r.dose, a, s, base, T, r.label + regime_suffix(u, u0), *u) for u in further
            for r in g.regime_rows for a in g.regime_arms for s in p.seeds]
    out += [TrainingRun("engine", float("nan"), a, s, pt.engine, pt.temperature,
                        point_label(pt.engine, pt.temperature, T), *u0) for pt in g.points for a in pt.arms
            for s in p.seeds]
    out += [TrainingRun("placebo", 0.0, a, s, base, T, placebo_label(k), *u0, stream=k)
            for k in range(1, getattr(p, "placebo_streams", 1) + 1) for a in g.placebo_arms for s in p.seeds]
    if g.long_steps:  # the long horizon: its own clean twins, first regime only
        out[:0] = [TrainingRun("clean", 0.0, a, s, base, T, "clean" + LONG, *u0, steps=g.long_steps)
                   for a in g.long_arms for s in p.seeds]
        out += [TrainingRun(r.kind, r.dose, a, s, base, T, r.label + LONG, *u0, steps=g.long_steps)
                for r in g.long_rows for a in g.long_arms for s in p.seeds]
    first = next(j for j in out if j.steps == 0)
    return out + [replace(first, kind="rerun", label="rerun")]


LONG = "+long"  # what a long-horizon row's label gains


def placebo_label(stream: int) -> str:
    """Placebo stream k's row: `placebo` for the first (every run before `placebo_streams` had one, so its rows keep
    their name), `placebo#<k>` for the others (a label, a metric key's first part; `job_store.job_key` files it as
    `placebo_<k>`)."""
    return "placebo" if stream == 1 else f"placebo#{stream}"


# a placebo stream's distance from the next in `sampling_seed`'s stream units (stream k: 1 + (k - 1) x this). Why not
# stream k itself: `sampling_seed` = seed x 10_000_019 + step x 1000 + stream x 5_000_011, and 10_000_019 = 2 x
# 5_000_011 - 3, so stream k + 2 of seed s would draw seed s + 1's stream-k seeds shifted by 3 (request i the seed of
# its request i + 3): two placebo rows, or a placebo and a clean run, sharing random draws. Streams an even 1000 apart
# meet another seed's only for seeds 500 or more apart (`MAX_SEEDS` keeps them closer) and stream 0 never (an odd
# distance); tests/test_mismatch_cost.py checks every request's seed of a study is distinct.
PLACEBO_STREAM_STRIDE = 1000


def sampling_stream(stream: int) -> int:
    """The GRPO loop's `sampling_stream` for a run's stream (0: the run's own; placebo stream k >= 1)."""
    return 0 if stream == 0 else 1 + (stream - 1) * PLACEBO_STREAM_STRIDE


def first_regime(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of the first PPO regime at the study's horizon: the dose-by-dose answer reads these, so that a
    `+ppo<k>` or `+long` row of the same dose never stands in for the largest dose."""
    label = table["label"].astype(str)
    return table[~label.str.contains("+ppo", regex=False) & ~label.str.contains(LONG, regex=False)]


def regime_suffix(regime: Regime | tuple[int, int] | int, first: Regime | tuple[int, int] | int) -> str:
    """What a row's label gains in a further PPO regime: `+ppo<updates>` with one epoch, `+ppo<updates>x<epochs>`
    with several (`+ppo4`, `+ppo2x2`, `+ppo1x4`); none in the first regime. An int is a regime of one epoch."""
    r, f = as_regime(regime), as_regime(first)
    return "" if r == f else f"+ppo{r.updates}" + (f"x{r.epochs}" if r.epochs > 1 else "")


def as_regime(regime: Regime | tuple[int, int] | int) -> Regime:
    """A regime from (mini-batches, epochs); an int (a table's `updates` before epochs existed) is that many
    mini-batches of one epoch."""
    return Regime(*map(int, regime)) if isinstance(regime, tuple) else Regime(int(regime))


def clean_label(t: float, base_t: float) -> str:
    return "clean" if t == base_t else f"clean@T{t:g}"


def point_label(engine: str, t: float, base_t: float) -> str:
    return engine if t == base_t else f"{engine}@T{t:g}"


def kind_label(kind: str, regime: Regime | tuple[int, int] | int, first: Regime | tuple[int, int] | int) -> str:
    """A (kind, PPO regime)'s name in metric keys: `ratio`, or `ratio+ppo4` / `ratio+ppo2x2` in a further regime."""
    return kind + regime_suffix(regime, first)


def config(p, job: TrainingRun) -> GRPOConfig:
    """The GRPO settings `job` runs with: the params' loop settings, its arm's correction and mode, its dose (a
    dose row's kind and dose; none for the other rows), temperature, regime, sampling stream and steps."""
    corr, _, mode = job.arm.partition("@")
    dosed = job.kind in DOSE_KINDS
    cfg = GRPOConfig.from_settings(p, correction=corr, seed=job.seed, dose_kind=job.kind if dosed else "",
                                   dose=job.dose if dosed else 0.0)
    return replace(cfg, old_logprobs=mode, temperature=job.temperature, updates_per_batch=job.updates,
                   ppo_epochs=job.epochs, sampling_stream=sampling_stream(job.stream), steps=job.steps or p.steps)


PROBE_SEED, PROBE_PROBLEMS = 999_983, 32


# the trained policy's own greedy accuracy, no engine in between (`trainer.greedy_rewards`): on distribution doses
# the training reward is what the perturbed or stale engine sampled, not what the run trained
HELDOUT_SEED, HELDOUT_PROBLEMS = 999_979, 128


def trained_problems(p) -> set[tuple[int, int]]:
    """Every (a, b) some run of this study may train on: each seed's fresh problems per step (`step_problem_seed`),
    the second pass's seeds up to `max_seeds` included, known before any run starts."""
    return {(q.a, q.b) for s in getattr(p, "all_seeds", p.seeds) for step in range(max(p.steps, p.long_steps))
            for q in tasks.make_problems(p.prompts_per_step, seed=step_problem_seed(s, step), max_digits=p.max_digits)}


def held_out(p, n: int, seed: int) -> tuple[list[tasks.Problem], str]:
    """Up to `n` distinct problems from the task's distribution that no run of the study trains on, and what they
    are in words. A task too small to hold any out (1-digit sums: 100 problems, nearly all drawn in training)
    gets its distinct problems instead, named as such: an accuracy on problems the runs trained on."""
    trained = trained_problems(p)
    pool = list(dict.fromkeys((q.a, q.b) for q in tasks.make_problems(50 * n, seed=seed, max_digits=p.max_digits)))
    unseen = [ab for ab in pool if ab not in trained]
    if len(unseen) >= n // 4:
        unseen = unseen[:n]
        return [tasks.Problem(a, b) for a, b in unseen], f"{len(unseen)} held-out problems (none trained on)"
    return ([tasks.Problem(a, b) for a, b in pool[:n]],
            f"{min(n, len(pool))} distinct problems of the task, not held out (it has {len(pool)}, and the runs train "
            f"on {len(trained)} of them)")
