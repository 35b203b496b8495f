"""The shape every experiment shares, and the helpers more than one notebook's experiment uses.

Each notebook `notebooks/<stem>.ipynb` (stem `NN_<name>`) has one module `rlwb/experiments/<name>.py` whose entry
point is

    run(params, model_path, *, on_start=None, progress=True) -> Result

`params` is the notebook's validated params object, `on_start` receives each engine's `info()` as it starts
(the archive records it), `progress` turns the progress bars on. The returned `Result` carries `.metrics`
(flat `group/name` numbers, what `metrics.json` and `rlwb compare` see), `.frames()` (the tables archived
as `data/<name>.parquet`), `.summary()` (the key table a report opens with) and `.conclusion()` (Markdown
whose every number comes from `.metrics`). The notebook only wires these to the archive and the plots.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import pandas as pd

from rlwb.engines.worker import EngineWorker
from rlwb.errors import EngineCrashed, EngineError, PresetError
from rlwb.experiments.wording import one_line

OnStart = Callable[[dict], None] | None
J, L, R = TypeVar("J"), TypeVar("L"), TypeVar("R")


@dataclass
class Result:
    """What `run` returns. Subclasses add their own fields (rollouts, curves, ...) for the plots."""

    params: Any
    metrics: dict[str, float]
    # where the conclusion states its finding: paragraph openings `answer` looks for first (wording.one_line)
    ANSWER_LEADS: ClassVar[tuple[str, ...]] = ()

    def frames(self) -> dict[str, pd.DataFrame]:
        """Every table to archive, by name (`data/<name>.parquet`)."""
        raise NotImplementedError

    def summary(self) -> pd.DataFrame:
        """The key table, shown right under the conclusion."""
        raise NotImplementedError

    def conclusion(self) -> str:
        """The answer, in Markdown; every number from `self.metrics`."""
        raise NotImplementedError

    def answer(self) -> str:
        """The answer in one line, plain text (the index lists it beside each notebook's latest report): the
        conclusion's paragraph that opens with one of `ANSWER_LEADS`, else its first that is not its setup, without
        Markdown. Experiments may say it better."""
        return one_line(self.conclusion(), leads=self.ANSWER_LEADS)


def prefetch_engines() -> bool:
    """Start the next engine while the current one works? On CPU, yes: an engine's start-up (its interpreter
    importing vLLM, ~6 s of a V1 start's ~8 s here, then building the engine) runs on one core while the
    current engine samples and the trainer scores. Not on CUDA, where the memory plan gives the GPU's share to
    one engine at a time."""
    from rlwb.engines.presets import cuda_available

    return not cuda_available()


def iter_engines(presets: list[str], model_path, dtype: str, progress: bool = True,
                 on_start: OnStart = None) -> Iterator[EngineWorker]:
    """Start each preset in turn, yield it, close it. With `prefetch_engines()` the next preset's engine is
    launched as soon as the current one is ready (two engine processes alive at most); a start-up that fails
    fails when its turn comes, as without prefetching. A preset this machine is known to refuse
    (`presets.unsupported_here`: an fp8 KV cache under vLLM V1 on a CPU without AVX-512, or for a model whose head
    size is a multiple of 16 but not of 32) fails before any engine starts, so a run does not train every engine
    before it only to fail there (`refused_here`)."""
    from rlwb.progress import progress_bar

    refused_here(presets, model_path)
    ahead = prefetch_engines()
    bar = progress_bar(presets, desc="engines", disable=not progress)
    launched: EngineWorker | BaseException | None = None
    try:
        for i, name in enumerate(bar):
            bar.set_postfix_str(name)
            w = launched if launched is not None else launch_engine(name, model_path, dtype)
            launched = None
            if isinstance(w, BaseException):
                raise w
            with w:
                w.wait_ready()
                if ahead and i + 1 < len(presets):
                    launched = launch_engine(presets[i + 1], model_path, dtype)
                if on_start:
                    on_start(w.info())
                yield w
    finally:
        if isinstance(launched, EngineWorker):
            launched.close()


def refused_here(presets: list[str], model_path=None) -> None:
    """`EngineError` naming every one of `presets` this machine is known to refuse (for `model_path`'s model), and
    why; nothing if none is. A name that does not resolve is left to the engine's start, which reports it in its
    turn."""
    from rlwb.engines.presets import resolve_preset, unsupported_here

    why = {}
    for name in dict.fromkeys(presets):
        try:
            reason = unsupported_here(resolve_preset(name), model=model_path)
        except PresetError:
            continue
        if reason:
            why[name] = reason
    if why:
        raise EngineError("this machine cannot start " + "; ".join(f"{n!r}: {r}" for n, r in why.items())
                          + ". Nothing was started: leave it out of the params, or run on a machine that has it.")


def launch_engine(preset: str, model_path, dtype: str) -> EngineWorker | Exception:
    """`preset`'s engine, launched without waiting for it to start, or the error launching it raised (a missing
    environment, a bad preset): the caller raises or records it when the engine's turn comes, as if it had
    started the engine then."""
    try:
        return EngineWorker(preset, model_path, dtype=dtype, wait=False)
    except (EngineCrashed, EngineError, PresetError) as e:
        return e


class _Stopped(Exception):
    """Raised by `should_stop()` inside a lane once another lane has failed."""


def run_in_lanes(jobs: list[J], lanes: list[L], run: Callable[[L, J, Callable[[], None]], R]) -> list[R]:
    """`run(lane, job, should_stop)` for every job, results in job order. Each lane (a trainer and its engine,
    say) works on one job at a time, in a thread of its own when there is more than one lane; a free lane
    takes the next job. `run` calls `should_stop()` now and then (a GRPO run: every step), which raises once
    another lane has failed, so the first error ends every lane soon and is raised here; so is an interrupt
    of the waiting caller, after the lanes have stopped."""
    if len(lanes) <= 1:
        return [run(lanes[0], job, lambda: None) for job in jobs]
    results: list = [None] * len(jobs)
    order, lock, stop, errors = iter(range(len(jobs))), threading.Lock(), threading.Event(), []

    def should_stop() -> None:
        if stop.is_set():
            raise _Stopped

    def work(lane) -> None:
        try:
            while not stop.is_set():
                with lock:
                    i = next(order, None)
                if i is None:
                    return
                results[i] = run(lane, jobs[i], should_stop)
        except _Stopped:
            pass
        except BaseException as e:  # noqa: BLE001 (re-raised by the caller's thread)
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=work, args=(lane,), name=f"rlwb-lane-{k}", daemon=True)
               for k, lane in enumerate(lanes)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # a short wait, so that an interrupt reaches this thread
    except BaseException:
        stop.set()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]
    return results


def engine_metrics(ro, clip_eps: float, seed: int = 0) -> dict[str, float]:
    """Every mismatch metric of one engine's `rlwb.core.scoring.rollouts.Rollouts`, plus 95% sequence-bootstrap
    intervals of the headline ones and the policy's uncertainty where it sampled (notebooks 01 and 10)."""
    from rlwb.core.measure import metrics as M
    from rlwb.core.measure import stats

    e, t = ro.flat()
    return {**M.mismatch_metrics(e, t, seq_ids=ro.seq_ids(), clip_eps=clip_eps,
                                 full_engine=ro.full_engine, full_trainer=ro.full_trainer),
            **stats.mismatch_cis(ro.log_ratios(), clip_eps, seed=seed), **ro.uncertainty()}


def split_metrics(metrics: dict[str, float], group: str = "engine", name: str = "metric") -> pd.DataFrame:
    """`{"a/b/c": v}` -> rows (group="a/b", name="c", value=v): the long form the plots and tables use."""
    return pd.DataFrame([{group: k.rsplit("/", 1)[0], name: k.rsplit("/", 1)[1], "value": v}
                         for k, v in metrics.items()], columns=[group, name, "value"])


def measures_table(measures: pd.DataFrame, engines: list[str]) -> pd.DataFrame:
    """(engine, measure, value) rows -> measures (rows, in the order they were measured) by engine (columns, in
    params order): the summary of experiments that measure many different things per engine."""
    t = measures.pivot(index="measure", columns="engine", values="value")
    return t.loc[list(dict.fromkeys(measures["measure"])), [e for e in engines if e in t.columns]]
