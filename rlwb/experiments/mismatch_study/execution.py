"""Notebook 08's study on real engines: every training run from the same initial weights (`train_study`), each
kept in the run's job store the moment it finishes and, in a resumed run, taken over from the run it resumes
(`reuse`); every trained policy scored by a clean engine (`CleanScorer`) and probed against its clean twin's
(`TwinKL`)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import torch

from rlwb.core.data import tokenizer
from rlwb.core.measure import stats
from rlwb.core.rl.grpo import train
from rlwb.core.scoring.trainer import completion_logprobs, greedy_rewards
from rlwb.engines.worker import reports_raw_logprobs
from rlwb.experiments.base import OnStart
from rlwb.experiments.grpo_grid import one_phase, run_grid
from rlwb.experiments.mismatch_study import sequential
from rlwb.experiments.mismatch_study.analysis import SAMPLE_COLUMN, SET_COLUMN
from rlwb.experiments.mismatch_study.design import (
    HELDOUT_PROBLEMS,
    HELDOUT_SEED,
    PROBE_PROBLEMS,
    PROBE_SEED,
    TrainingRun,
    config,
    held_out,
    training_runs,
)


def train_study(p, model_path, *, on_start: OnStart = None, progress: bool = True,
                store=None) -> tuple[pd.DataFrame, int, int]:
    """(curves, runs reused, runs in all): every training run from the same initial weights (`grpo_grid.run_grid`):
    the base engine's first, then each point engine's. Every run's tested outcome is sampled by a clean engine
    (`CleanScorer`); the curves hold every per-run number the analysis needs (`kl_to_clean` included).

    A study with a sequential seed rule (`max_seeds` > `num_seeds`, `sequential`) trains in two passes in the same
    run: the first pass is every run above; once it has all finished, the rule decides on its curves
    (`sequential.first_pass`) which rows train more seeds, and the base engine's last phase trains them (the grid's
    `Plan`: a phase drawn after the previous ran). The base engine comes back after the point engines for it, so the
    rule reads the whole first pass (the points' tests are in the family whose level it sizes at).

    With `store` (the run's job store, `archive.Run.jobs()`) each job is kept the moment it finishes, so an
    interrupted study keeps its finished jobs; in a run that resumes one (`rlwb run --resume-from`) the store offers
    that run's finished jobs, which are reused instead of trained again (`reuse`); a first pass all reused is decided
    on at once, the same decision (a function of its curves), and the second pass's finished jobs reused too. Jobs
    are seeded and independent, so a resumed study's curves are the uninterrupted study's, bar the wall-time
    columns."""
    first = training_runs(p)
    todo = list(first)  # the second pass joins once decided
    base = p.engines[0]
    kl, raw = TwinKL(todo, store), {}
    start: dict[str, float] = {}  # the initial policy's outcomes, measured once (`initial_outcomes`)
    done: dict[TrainingRun, pd.DataFrame] = {}
    resuming = store is not None and store.resuming
    reused = reuse(store, todo, kl, start, done) if resuming else []
    second: list[TrainingRun] | None = None if sequential.enabled(p) else []

    def decide() -> list[TrainingRun]:
        """The second pass, decided once on the whole first pass (its runs and reused ones alike)."""
        nonlocal second
        if second is None:
            calls, _ = sequential.first_pass(assembled(first, done), p)
            second = sequential.second_pass_runs(calls, first, p)
            kl.expect(second)
            todo.extend(second)
            if resuming:
                reused.extend(reuse(store, second, kl, start, done))
            if store is not None:
                store.start(len(todo))
            bar.total = len(todo)
            bar.refresh()
        return second

    codec = tokenizer.PromptCodec(model_path, p.chat_template)
    probe = probe_batch(codec, p)
    heldout, _ = held_out(p, HELDOUT_PROBLEMS, HELDOUT_SEED)
    scorer = CleanScorer(base, model_path, p.dtype, on_start)
    start_lock, done_lock = threading.Lock(), threading.Lock()
    from rlwb.progress import progress_bar

    bar = progress_bar(total=len(todo), initial=len(done), desc="jobs (reused: done)" if done else "jobs",
                       disable=not progress)
    if second is None and all(j in done for j in first):
        decide()  # a resumed study whose first pass is all reused: its second pass is known now
    if store is not None:
        store.start(len(todo) if second is not None else None)
    if on_start and reused:
        for info in reused_engines(store, todo, done) if second is not None else []:
            on_start(info)

    def one_run(m, engine, job: TrainingRun, initial, should_stop) -> pd.DataFrame:
        with start_lock:  # the study's once-only scoring of the initial policy is no run's wall time
            if not start and job.engine == scorer.preset:
                start.update(initial_outcomes(m, engine, initial, codec, heldout, p))
                if store is not None:
                    store.put_shared("start", start)
        t0 = time.time()
        df = train(m, engine, config(p, job), initial, progress=progress,
                   desc=f"{job.label} {job.arm} seed {job.seed}", codec=codec, on_step=lambda _res: should_stop())
        with torch.no_grad():  # the trained policy's sampling distributions on the fixed probe
            full = completion_logprobs(m, probe, p.temperature, full=True)["full"].float().cpu()
        kl.add(job, full)
        df["heldout_greedy_acc"] = float(greedy_rewards(m, codec, heldout, p.max_tokens).mean())
        if p.policy_samples:
            t1 = time.time()
            draws = scorer.policy_draws(m, job, engine, codec, heldout, p)
            df = df.assign(**outcome_columns(draws), t_policy=time.time() - t1)
            df["outcome_engine"], df["outcome_temperature"] = scorer.preset, p.temperature
        for i, (k, v) in enumerate((("kind", job.kind), ("label", job.label), ("dose", job.dose),
                                    ("arm", job.arm), ("seed", job.seed), ("temperature", job.temperature),
                                    ("updates", job.updates), ("epochs", job.epochs))):
            df.insert(1 + i, k, v)
        wall = time.time() - t0
        # one concat, not a column at a time: the initial policy's columns are many with seed sets (`se_check_sets`)
        # and assigning them one by one fragments the frame (pandas warns, and the report would show it)
        extra = {"engine": job.engine, "stream": job.stream, **start, "t_job": wall, "_wall_s": wall}
        return pd.concat([df, pd.DataFrame(extra, index=df.index)], axis=1)

    def finished(job: TrainingRun, df: pd.DataFrame) -> pd.DataFrame:
        wall = float(df.pop("_wall_s").iloc[0])
        df = df.assign(raw_logprobs=raw[job.engine])
        if store is not None:
            df = store.save(job, df, wall)  # read back: a fresh job's frame is what a reused one's is
        with done_lock:
            done[job] = df
            bar.update(1)
        return df

    # the engines to start, in order: each with jobs left, and the base engine last once more while the second pass
    # is undecided (it is decided after every first-pass job, the points' included, has run)
    visits = list(dict.fromkeys(j.engine for j in todo if j not in done))
    if second is None and (not visits or visits[-1] != base):
        visits.append(base)
    planned: set[TrainingRun] = set()
    visit = iter(range(len(visits)))

    def plan(w):
        last = next(visit) == len(visits) - 1
        raw[w.preset.name] = reports_raw_logprobs(w.info())
        mine = [j for j in todo if j.engine == w.preset.name and j not in done and j not in planned]
        planned.update(mine)
        if not (last and second is None):
            return one_phase(mine)
        most = len(mine) + sum(j.engine == base for j in first) * (p.max_seeds - p.num_seeds)

        def phases():
            if mine:
                yield mine
            yield [j for j in decide() if j not in done]  # drawn once the first pass has run

        return most, phases()

    try:
        if visits:
            run_grid(p, model_path, visits, plan, one_run, on_start=on_start, progress=progress, on_done=finished)
    finally:
        scorer.close()
        bar.close()
    order = [j for e in dict.fromkeys(j.engine for j in todo) for j in todo if j.engine == e]  # engine by engine
    curves = assembled(order, done)
    # each run's KL to its clean twin, known once both finished: a column of the curves, so `analyze` needs no more
    by_run = {(j.label, j.arm, j.seed): v for j, v in kl.values.items()}
    curves["kl_to_clean"] = [by_run.get(k, float("nan")) for k in zip(curves["label"], curves["arm"],
                                                                        curves["seed"])]
    if store is not None:
        store.finish(drop=("probe.pt",), total=len(todo))  # every KL is in the curves now
    return curves, len(reused), len(todo)


def assembled(jobs: list[TrainingRun], done: dict) -> pd.DataFrame:
    """The curves of `jobs` (each finished, in `done`), engine by engine as the grid ran them."""
    order = [j for e in dict.fromkeys(j.engine for j in jobs) for j in jobs if j.engine == e]
    curves = pd.concat([done[j] for j in order], ignore_index=True)
    curves["raw_logprobs"] = curves["raw_logprobs"].astype(bool)
    return curves


def reused_engines(store, todo: list[TrainingRun], done: dict) -> list[dict]:
    """The engines no job of this run needs (every job of theirs reused): their records in the run resumed from,
    each tagged `from_run` (the run's record then says which were started here and which were not)."""
    engines = dict.fromkeys(j.engine for j in todo)
    return [info for e in engines if all(j in done for j in todo if j.engine == e) and (info := store.reused_engine(e))]


def reuse(store, todo: list[TrainingRun], kl: TwinKL, start: dict, done: dict) -> list[TrainingRun]:
    """Take over every job of `todo` the run resumed from finished (`store.offered`) and whose KL to its clean twin
    can be had: its curve into `done`, its KL (or its probe, while the KL waits for its twin) into `kl`, the initial
    policy's outcomes into `start`. A clean run's probe is what its twins' KLs need (a finished study dropped them:
    such a clean run trains again). Returns the jobs reused."""
    start.update(store.shared("start") or {})
    reused = []
    for job in sorted(todo, key=lambda j: j.kind != "clean"):  # clean first: their twins' KLs need them
        have_kl, have_probe = store.offered(job, "kl.json"), store.offered(job, "probe.pt")
        usable = have_probe if job.kind == "clean" else have_kl or have_probe
        if not store.offered(job) or not usable or not start:
            continue
        done[job] = store.take(job)
        if have_kl and job.kind != "clean":
            kl.known(job, store.get_json(job, "kl.json")["kl_to_clean"])
        else:
            kl.add(job, store.get_tensor(job, "probe.pt"))
        reused.append(job)
    return reused


POLICY_SEED = 999_961
# `se_check_sets`: seed set k scores the initial policy with base seed POLICY_SEED + k x SEED_SET_STRIDE, so no
# request of one set shares a seed with another's (a set is problems x policy_samples requests, far fewer)
SEED_SET_STRIDE = 1_000_000


def initial_outcomes(model, engine, initial: dict, codec, problems, p) -> dict[str, float]:
    """The tested outcomes of the *initial* policy, as every trained one is scored (`initial_policy_reward` and the
    rest of `outcome_columns`, each prefixed `initial_`: sampled
    by the base engine at the study's T with the same fixed seed; `initial_heldout_greedy_acc`: greedy, no engine):
    what a clean run's gain in the tested outcome is measured from (the benchmark response). `model` and `engine`
    are a lane's trainer and base engine before its run; `train` reloads the initial weights into both after."""
    model.load_state_dict(initial)
    out = {"initial_heldout_greedy_acc": float(greedy_rewards(model, codec, problems, p.max_tokens).mean())}
    if p.policy_samples:
        # scored as every trained policy is (`outcome_columns`): with two draws or more per problem its sampling
        # noise (`analysis.INITIAL_SE`) is measured from the problems' own repeated draws
        draws = policy_rewards(model, engine, codec, problems, p, p.temperature)
        out.update({f"initial_{k}": v for k, v in outcome_columns(draws).items()})
        out.update(seed_set_scores(model, engine, codec, problems, p))
    return out


def seed_set_scores(model, engine, codec, problems, p) -> dict[str, float]:
    """The initial policy scored again on `p.se_check_sets` independent seed sets, each as every run is scored
    (`policy_rewards`, the same problems): `<SET_COLUMN><k>` and its standard error `<SET_COLUMN><k>_se`. Why: a
    study scores every run on one shared seed set, so its runs cannot check the outcome's standard error (the
    draws' spread given the problems, `stats.fixed_items_mean_se`), which prices the benchmark response's noise;
    independent sets of the same policy vary by exactly that if it holds (`scoring_noise.seed_set_check`)."""
    out = {}
    for k in range(1, p.se_check_sets + 1):
        draws = policy_rewards(model, engine, codec, problems, p, p.temperature, seed=POLICY_SEED + k * SEED_SET_STRIDE)
        cols = outcome_columns(draws)
        out[f"{SET_COLUMN}{k}"], out[f"{SET_COLUMN}{k}_se"] = cols["policy_reward"], cols["policy_reward_se"]
    return out


class CleanScorer:
    """Where every run's tested outcome is sampled: the study's base preset (`engines[0]`, fp32 at `dtype`: the
    trainer's distribution to the float floor) at the study's temperature, holding the trained weights
    unperturbed, whatever engine and temperature the run trained with. A run on the base preset is scored by its
    own engine (the same preset); an engine point's run by a base-preset engine of the scorer's own, started on
    first use and shared by the lanes (a lock): a point is a way of *training*, and its trained policy is scored as
    every other row's is, so each row's outcome is comparable with its clean run's (a bf16 point scored by its
    bf16 engine, or V1 at T 1 scored at T 1, would mix the engine's sampling into the outcome)."""

    def __init__(self, preset: str, model_path, dtype: str, on_start: OnStart = None):
        self.preset, self._model, self._dtype, self._on_start = preset, model_path, dtype, on_start
        self._own = None
        self._lock = threading.Lock()

    def policy_draws(self, model, job: TrainingRun, engine, codec, problems, p) -> np.ndarray:
        """The trained policy's draws on `problems` (`policy_rewards`), sampled by the engine this class picks."""
        if job.engine == self.preset:
            return policy_rewards(model, engine, codec, problems, p, p.temperature)
        with self._lock:
            if self._own is None:
                from rlwb.engines.worker import EngineWorker

                self._own = EngineWorker(self.preset, self._model, dtype=self._dtype)
                if self._on_start:  # run.json's record of it, beside the base engine's (the same preset)
                    self._on_start({**self._own.info(), "preset": self.scorer_key, "role": "clean scorer"})
            return policy_rewards(model, self._own, codec, problems, p, p.temperature)

    @property
    def scorer_key(self) -> str:
        return f"{self.preset}#clean-scorer"

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None


def outcome_columns(draws: np.ndarray) -> dict[str, float]:
    """A run's tested outcome from its draws ([problems, policy_samples] of 0/1 rewards): `policy_reward`, their
    mean; with two draws or more per problem also its standard error over the draws, the problems fixed
    (`policy_reward_se`, `stats.fixed_items_mean_se`), and each sample index's own mean over the problems
    (`policy_reward_sample<j>`). Why keep those: sample index j of problem i is drawn with the same seed in every
    run (`policy_rewards`), so the columns are what the shared scoring seed's common noise and the worth of more
    samples are measured from (`scoring_noise`): a mean of k of the columns is distributed as the outcome of a study
    with `policy_samples` k on these policies (its seeds would be others, as exchangeable), not that outcome."""
    d = np.asarray(draws, dtype=np.float64)
    out = {"policy_reward": float(d.mean())}
    if d.shape[1] >= 2:
        out["policy_reward_se"] = stats.fixed_items_mean_se(d)
        out.update({f"{SAMPLE_COLUMN}{j}": float(v) for j, v in enumerate(d.mean(axis=0))})
    return out


def policy_rewards(model, engine, codec, problems, p, temperature: float, seed: int = POLICY_SEED) -> np.ndarray:
    """The tested outcome's draws, [problems, policy_samples]: each completion's 0/1 reward, by problem. The trained
    policy's completions (`p.policy_samples` each at `temperature`) are sampled by `engine` after the trained
    weights are loaded into it unperturbed: no dose between the policy and its reward (under a distribution dose
    the training reward is what the perturbed or stale engine sampled; this is what the run trained). One fixed
    seed for every run: request i (problem i // policy_samples, sample index i % policy_samples) is drawn with seed
    POLICY_SEED + i in every run (`seed`: another set's base, `seed_set_scores`), so the runs' outcomes are paired
    down to each draw's seed. `CleanScorer` picks the engine (the base preset) and the temperature (the study's)
    for every run."""
    from rlwb.core.data import tasks as task_mod
    from rlwb.engines.worker import Sampling

    engine.update_weights({k: v.detach() for k, v in model.state_dict().items()})
    engine.reset_prefix_cache()
    prompts = [codec.encode_task(q) for q in problems for _ in range(p.policy_samples)]
    comps = engine.generate(prompts, Sampling(temperature=temperature, max_tokens=p.max_tokens, seed=seed),
                            text=False)
    return np.array([task_mod.reward(problems[i // p.policy_samples], codec.decode(c.token_ids))
                     for i, c in enumerate(comps)], dtype=np.float64).reshape(len(problems), p.policy_samples)


class TwinKL:
    """KL from each run's clean twin's trained policy to its own, on the probe, computed as soon as both exist.
    Only clean policies still awaited by a run and runs still awaiting their twin are held (on a real vocabulary
    each [tokens, V] tensor is tens of MB). Two lanes finish runs in their own threads, hence the lock. With a
    job store each value is kept as soon as it is known, and each probe a later value needs (a clean run's; a
    run's whose twin has not finished) until then, so a resumed study computes the same KLs."""

    def __init__(self, todo: list[TrainingRun], store=None):
        self.values: dict[TrainingRun, float] = {}
        self._users = {}
        for j in todo:
            if j.kind != "clean":
                self._users[j.twin] = self._users.get(j.twin, 0) + 1
        self._clean: dict = {}
        self._pending: dict[TrainingRun, torch.Tensor] = {}
        self._lock = threading.Lock()
        self._store = store

    def add(self, job: TrainingRun, full: torch.Tensor) -> None:
        with self._lock:
            if job.kind == "clean":
                self.values[job] = 0.0
                if self._store is not None:
                    self._store.put_tensor(job, "probe.pt", full)
                    self._store.put_json(job, "kl.json", {"kl_to_clean": 0.0})
                self._clean[job.twin] = full
                for other in [o for o in self._pending if o.twin == job.twin]:
                    self._use(other, self._pending.pop(other))
                if not self._users.get(job.twin):  # no run left that needs it
                    self._clean.pop(job.twin, None)
            elif job.twin in self._clean:
                self._use(job, full)
            else:
                self._pending[job] = full
                if self._store is not None:
                    self._store.put_tensor(job, "probe.pt", full)

    def expect(self, jobs: list[TrainingRun]) -> None:
        """Runs that join the study later (the sequential rule's second pass): their clean twins' probes are held
        for them too."""
        with self._lock:
            for j in jobs:
                if j.kind != "clean":
                    self._users[j.twin] = self._users.get(j.twin, 0) + 1

    def known(self, job: TrainingRun, value: float) -> None:
        """A run whose KL a resumed study reuses (`reuse`): its twin's probe is one user less needed."""
        with self._lock:
            self.values[job] = value
            self._users[job.twin] -= 1
            if not self._users[job.twin]:
                self._clean.pop(job.twin, None)

    def _use(self, job: TrainingRun, full: torch.Tensor) -> None:
        self.values[job] = kl_divergence(self._clean[job.twin], full)
        if self._store is not None:
            self._store.put_json(job, "kl.json", {"kl_to_clean": self.values[job]})
            self._store.drop(job, "probe.pt")
        self._users[job.twin] -= 1
        if not self._users[job.twin]:
            del self._clean[job.twin]


def probe_batch(codec, p):
    """A fixed probe: task prompts no run trains on (`held_out`), each followed by its correct answer
    (teacher-forced), where the trained policies' distributions are compared (`kl_to_clean`)."""
    from rlwb.core.scoring.trainer import make_batch

    problems, _ = held_out(p, PROBE_PROBLEMS, PROBE_SEED)
    return make_batch([codec.encode_task(q) for q in problems],
                      [codec.encode_continuation(str(q.a + q.b)) for q in problems])


def kl_divergence(ref: torch.Tensor, lp: torch.Tensor) -> float:
    """Mean over probe tokens of KL(ref ‖ lp), both [tokens, V] log-distributions (in float64): a dosed run's
    trained policy against its clean twin's (same arm and seed at dose 0), how far a dose moved the policy
    whether or not reward shows it."""
    ref, lp = ref.double(), lp.double()
    return float((ref.exp() * (ref - lp)).sum(-1).mean())
