"""Grids of GRPO runs on real engines, shared by notebooks 03, 07 and 08.

A grid is a list of jobs per engine preset, every job one GRPO run (`rlwb.core.rl.grpo.train`) from the same initial
weights. `run_grid` starts each engine once (the next one ahead, `iter_engines`), trains `concurrent_runs` jobs
at once where the engine leaves cores free (`lanes_for`), and hands each job to the notebook's own `one_run`,
which says what the job trains and how its curve is labelled. Each notebook keeps only what differs: which jobs,
and what to make of the curves. `train_grid` is notebooks 03 and 07's grid: engines x corrections x seeds, with
drift monitors.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from rlwb.core.data import tokenizer
from rlwb.core.rl.grpo import train, trainer_device
from rlwb.core.rl.grpo_config import GRPOConfig
from rlwb.core.rl.mismatch_breaker import MismatchBreaker
from rlwb.engines.presets import Preset, cuda_available, resolve_preset
from rlwb.engines.worker import EngineWorker, expected_agreement, reports_raw_logprobs
from rlwb.experiments.base import OnStart, iter_engines, run_in_lanes
from rlwb.formatting import KL_FLOOR

# One reading of a reward curve for every GRPO notebook (03, 07, 08): "final reward" is the mean over the last 20%
# of steps, per seed; "gain" (did the run learn?) the last 10% minus the first 10%, paired within each seed.
FINAL_FRAC, GAIN_FRAC = 0.2, 0.1


def edge_steps(steps: Iterable, frac: float, last: bool = True) -> list:
    """The last (or first) `frac` of the sorted `steps`, at least one."""
    steps = sorted(set(steps))
    k = max(1, round(frac * len(steps)))
    return steps[-k:] if last else steps[:k]


def final_reward(curves: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per `keys` group (which includes "seed"): mean reward over the last FINAL_FRAC of the steps."""
    last = edge_steps(curves["step"], FINAL_FRAC)
    return curves[curves["step"].isin(last)].groupby(keys, sort=False, dropna=False)["reward_mean"].mean()


def reward_gain(curves: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per seed of one configuration's curves: mean reward over the first and last GAIN_FRAC of the steps (their
    difference, paired within the seed, is the gain)."""
    first, last = (edge_steps(curves["step"], GAIN_FRAC, last=at_end) for at_end in (False, True))
    return tuple(curves[curves["step"].isin(w)].groupby("seed")["reward_mean"].mean() for w in (first, last))

# one_run(trainer, engine, job, initial weights, should_stop) -> that run's curve
OneRun = Callable[[torch.nn.Module, EngineWorker, Any, dict, Callable[[], None]], pd.DataFrame]
# plan(engine) -> (at most how many jobs it will run, the phases: job lists, each drawn after the previous ran)
Plan = Callable[[EngineWorker], tuple[int, Iterable[list]]]


def lanes_for(preset: Preset, wanted: int) -> int:
    """How many runs train at once on `preset`'s engine: `wanted` where its engine leaves the trainer cores to
    use, else 1. On CPU that is an engine with fewer OpenMP threads (its preset's OMP_NUM_THREADS, per
    tensor- or data-parallel rank) than the machine has cores: the V1 presets use one. V0 takes every core;
    two V0 engines beside the trainer oversubscribed 2 cores to ~5 s per step instead of ~0.4 s (measured,
    notebook 03's default). On CUDA the engines compute on the GPU and the memory plan sizes `wanted` runs."""
    if wanted <= 1 or cuda_available():
        return max(1, wanted)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    kw = preset.vllm_kwargs
    ranks = int(kw.get("tensor_parallel_size", 1)) * int(kw.get("data_parallel_size", 1))
    threads = int(preset.env.get("OMP_NUM_THREADS") or cores) * ranks
    return wanted if threads < cores else 1


def load_trainer(model_path) -> tuple[torch.nn.Module, dict]:
    """The fp32 trainer and a copy of its initial weights, which every run of a grid starts from."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).to(trainer_device())
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_grid(p, model_path, engines: list[str], plan: Plan, one_run: OneRun, *, on_start: OnStart = None,
             progress: bool = True, on_done: Callable[[Any, pd.DataFrame], pd.DataFrame] | None = None
             ) -> list[pd.DataFrame]:
    """Every job `plan` gives each engine, in order; curves in job order, engine by engine. `on_done(job, curve)`,
    if given, gets each job's finished curve as soon as its lane returns it (in that lane's thread) and returns
    what the grid keeps: notebook 08 persists each job there, so an interrupted study keeps its finished jobs.

    `p.concurrent_runs` runs train at once (where `lanes_for` allows), each in a thread with its own trainer
    copy and its own engine process of the same preset. Why: on a small CPU box a run alternates between the
    engine (one core, sampling) and the trainer (both cores, scoring and the update), so one run leaves a core
    idle half the time; two runs fill it (1.43x measured on 2 cores, 03's default step). Every run reloads the
    initial weights into its trainer and engine and draws nothing from a shared random state, so each run's curve
    is bitwise the one it has when the runs go one at a time (tests/test_grpo.py); only the `t_*` columns, wall
    time per step, reflect the sharing (`concurrent_runs` records how many ran at once)."""
    model, initial = load_trainer(model_path)
    lanes = max(1, int(getattr(p, "concurrent_runs", 1)))
    models = [model]  # one trainer per lane, made when a lane first needs it
    frames: list[pd.DataFrame] = []
    for w in iter_engines(engines, model_path, p.dtype, progress, on_start):
        info = w.info()
        expects = expected_agreement(info.get("settings") or {}, reports_raw_logprobs(info))
        most, phases = plan(w)
        n = min(lanes_for(w.preset, lanes), max(1, most))
        extra = [EngineWorker(w.preset, model_path, dtype=p.dtype, wait=False) for _ in range(n - 1)]
        try:
            models += [copy.deepcopy(model) for _ in range(n - len(models))]
            def lane_run(lane, job, stop, n=n, expects=expects):
                df = one_run(lane[0], lane[1], job, initial, stop).assign(concurrent_runs=n, engine_expects=expects)
                return on_done(job, df) if on_done else df

            for jobs in phases:
                frames += run_in_lanes(jobs, list(zip(models[:n], [w, *extra])), lane_run)
        finally:
            for e in extra:
                e.close()
    return frames


def one_phase(jobs: list) -> tuple[int, Iterator[list]]:
    """A plan's answer for an engine whose jobs are known up front."""
    return len(jobs), iter([jobs])


def timing_note(p, engines: list[str] | None = None) -> str:
    """What the seconds per step of a GRPO grid measure (notebooks 03, 07 and 08)."""
    engines = list(p.engines if engines is None else engines)
    wanted = int(getattr(p, "concurrent_runs", 1))
    shared = [e for e in engines if lanes_for(resolve_preset(e), wanted) > 1]
    if not shared:
        return "Runs went one at a time: s/step is a run's own wall time per step."
    alone = [e for e in engines if e not in shared]
    return (f"On {', '.join(f'`{e}`' for e in shared)} {wanted} runs trained at a time (`concurrent_runs`), each "
            f"with its own engine process: s/step is one run's wall time per step while the others share the cores"
            + (f"; {', '.join(f'`{e}`' for e in alone)} ran one at a time (its engine uses every core)" if alone
               else "") + ". `concurrent_runs: 1` times every run alone; the curves are the same either way.")


DRIFT_WINDOW, DRIFT_PATIENCE = 2, 2  # notebook 03's drift monitor: 2-step windows, 2 in a row above


def drift_monitor_factory(threshold: float, save_dir=None, metric: str = "mismatch_k3"):
    """Monitors that record (never stop) a trip per run, saving the offending batch under `save_dir`."""
    def make(engine: str, correction: str, seed: int) -> MismatchBreaker:
        return MismatchBreaker(threshold, DRIFT_WINDOW, DRIFT_PATIENCE, metric=metric, raise_on_trip=False,
                            save_dir=save_dir, name=f"drift_{engine}+{correction}_seed{seed}")
    return make


@dataclass(frozen=True)
class GridRun:
    """One run of notebooks 03 and 07's grid: a correction on an engine preset with a seed (the rest is the
    notebook's params, the same for every run)."""

    engine: str
    correction: str
    seed: int

    @property
    def name(self) -> str:
        """What its files in the job store are named by (`job_store.job_key`: with a hash of every field)."""
        return f"{self.engine}+{self.correction}.s{self.seed}"


def train_grid(p, model_path, on_start: OnStart = None, progress: bool = True, monitor_factory=None,
               drift_dir=None, corrections_for=None, store=None) -> pd.DataFrame:
    """The curves of `run` (`grpo_grid.run_grid` over engines x corrections x seeds); `monitor_factory(engine,
    correction, seed)` overrides the drift monitors; `corrections_for(engine)` the corrections run on an engine
    (default: all of `p.corrections`). With `skip_at_floor`, an engine runs `none` first and the other corrections
    only if `none` measured a mismatch (`at_floor`).

    With `store` (the run's job store, `archive.Run.jobs()`) each run is kept the moment it finishes; in a run that
    resumes one, the runs it finished are taken over instead of trained, and an engine none of whose runs is left
    does not start (its record comes from that run). Curves are in the same order either way: engine by engine,
    phase by phase."""
    if monitor_factory is None and getattr(p, "drift_threshold", 0) > 0:
        monitor_factory = drift_monitor_factory(p.drift_threshold, drift_dir, getattr(p, "drift_metric", "mismatch_k3"))
    codec = tokenizer.PromptCodec(model_path, p.chat_template)
    curves: dict[GridRun, pd.DataFrame] = {}
    walked: dict[str, list[GridRun]] = {}  # each engine's runs in the order its phases gave them

    def taken(job: GridRun) -> bool:
        if job not in curves and store is not None and store.offered(job):
            curves[job] = store.take(job)
        return job in curves

    def one_run(m, engine, job: GridRun, initial, should_stop) -> pd.DataFrame:
        t0 = time.time()
        monitor = monitor_factory(job.engine, job.correction, job.seed) if monitor_factory else None
        cfg = GRPOConfig.from_settings(p, correction=job.correction, seed=job.seed)
        df = train(m, engine, cfg, initial, monitor=monitor, progress=progress,
                   desc=f"{job.engine}+{job.correction} seed {job.seed}", codec=codec,
                   on_step=lambda _res: should_stop())
        df.insert(1, "engine", job.engine)
        df.insert(2, "correction", job.correction)
        df.insert(3, "seed", job.seed)
        df["drift_trip_step"] = np.nan if monitor is None or monitor.trip_step is None else monitor.trip_step
        return df.assign(_wall_s=time.time() - t0)

    def finished(job: GridRun, df: pd.DataFrame) -> pd.DataFrame:
        wall = float(df.pop("_wall_s").iloc[0])
        curves[job] = store.save(job, df, wall) if store is not None else df  # read back, as a taken one is
        return curves[job]

    def corrections(engine: str) -> list[str]:
        return corrections_for(engine) if corrections_for else list(p.corrections)

    def phases(engine: str) -> Iterator[list[GridRun]]:
        wanted = corrections(engine)
        skip = getattr(p, "skip_at_floor", False) and "none" in wanted and len(wanted) > 1
        runs = [[GridRun(engine, c, s) for c in wanted for s in p.seeds]]
        if skip:
            first = [GridRun(engine, "none", s) for s in p.seeds]
            runs = [first, [GridRun(engine, c, s) for c in wanted if c != "none" for s in p.seeds]]
        for i, phase in enumerate(runs):
            if i and at_floor(pd.concat([curves[j] for j in runs[0]])):
                return
            walked.setdefault(engine, []).extend(phase)
            yield phase

    def all_taken(engine: str) -> bool:
        """Does every run of `engine` come from the run resumed (walking its phases on the taken curves)?"""
        walked.pop(engine, None)
        done = all(taken(j) for phase in phases(engine) for j in phase)
        walked.pop(engine, None)
        return done

    engines = list(p.engines)
    left = [e for e in engines if store is None or not store.resuming or not all_taken(e)]
    if store is not None:
        store.start()
    for e in engines:
        if e not in left and on_start and (info := store.reused_engine(e)):
            on_start(info)

    def plan(w):
        return (len(corrections(w.preset.name)) * len(p.seeds),
                ([j for j in phase if not taken(j)] for phase in phases(w.preset.name)))

    if left:
        run_grid(p, model_path, left, plan, one_run, on_start=on_start, progress=progress, on_done=finished)
    for e in engines:
        if e not in left:
            list(phases(e))  # its runs, every one taken over, in their order
    order = [j for e in engines for j in walked.get(e, [])]
    if store is not None:
        store.finish(total=len(order))
    return pd.concat([curves[j] for j in order], ignore_index=True)


def at_floor(none_curves: pd.DataFrame) -> bool:
    """Did these `none` runs measure engine-trainer k3 at rlwb's float floor (`formatting.KL_FLOOR`) on every
    step? Then every correction's weight is 1 to the float floor and its run would repeat `none`'s."""
    return bool((none_curves["mismatch_k3"] <= KL_FLOOR).all())


def floor_breaches(curves: pd.DataFrame) -> dict[str, float]:
    """`<engine>/floor_breach_k3`: the largest per-step k3 of an engine that should sit at the float floor against
    the fp32 trainer (fp32, processed logprobs: `engine_expects`, from its read-back settings) but measured k3 above
    rlwb's float floor for divergences (`formatting.KL_FLOOR`) in this run; nothing for engines at their floor.
    Why: an engine can leave its floor in one run (k3 1e-8 on every seed where its other runs measure 1e-13);
    such a run measures other engine numerics than the ones it names and must say so (`floor_lines`), not pass as
    a reproduction. `curves` holds only runs the engine's numerics alone decide (a notebook that perturbs an engine
    on purpose passes its clean runs)."""
    if "engine_expects" not in curves:
        return {}
    at = curves[curves["engine_expects"] == "float floor"].groupby("engine", sort=False)["mismatch_k3"].max()
    return {f"{e}/floor_breach_k3": float(k3) for e, k3 in at.items() if not k3 <= KL_FLOOR}


