"""Notebook 09's experiment: how far the trainer's own settings move its logprobs, beside the engine's.

One engine preset (`sampler`, fp32) samples the prompts once (task and open-ended); every trainer setting
(`rlwb.core.scoring.trainer_choices`: dtype, autocast, attention implementation, batch composition, the update's
micro-batch with grad, checkpointing, torch.compile, an fp32 head) scores the same sequences, each against a
float64 forward of the same weights run one sequence at a time (the reference), through the scorer's own loop
(`rlwb.core.scoring.trainer.score_sequences`). `fp64` (float64 in the scorer's batches) is always measured first: the
reference's control, which must agree with the reference far below fp32's floor (bitwise where the batched kernels
round as the single-sequence ones do; transformers' Qwen2 norm computes in fp32 even in float64, so a batched
kernel's last-bit difference can flip one of its fp32 roundings: 2e-07 on an H100, docs/gpu.md).
Per setting: |Δlogp| and k3 against the reference (95% sequence-bootstrap intervals), the share of sequences bitwise
identical to the same setting one sequence per forward (batch invariance), time per 1k tokens (relative to `fp32` in
the same run) and, for a setting with grad, its PPO ratio at the first micro-step (update pass / its own old-logprob
pass).

The grid: each `grid_engines` preset (bf16 engines without and with an fp32 head) samples the same prompts and
each `grid_settings` trainer scores its sequences: k3 engine vs trainer (what a user sees), engine vs reference
and trainer vs reference (each side alone). The ranking puts trainer settings, the grid's engines and notebook
06's engine knobs (its latest run, when there is one) on one scale, k3 per token.

A setting that cannot run here (a kernel without its package, a dtype without CPU kernels) is a row with the
library's own error, as notebook 06 does for engine knobs.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rlwb import timing
from rlwb.core.data import tokenizer
from rlwb.core.measure import metrics as M
from rlwb.core.measure import stats
from rlwb.core.prompts.generated import make_prompts
from rlwb.core.scoring.trainer import TrainerScorer, apply_setting
from rlwb.core.scoring.trainer_choices import REFERENCE, TrainerSetting, describe, parse_setting
from rlwb.engines.worker import EngineWorker, Sampling
from rlwb.errors import EngineCrashed, EngineError, PresetError
from rlwb.experiments.base import OnStart, Result, split_metrics
from rlwb.experiments.engine_readback import error_line, not_applied
from rlwb.experiments.wording import ci_text
from rlwb.experiments.wording import trainer_settings as wording_09
from rlwb.run_record import read_record

CONTROL = ("fp64", "fp32")  # measured first whatever the params list: the reference's control, rlwb's scorer
CI_NAMES = ("abs_dlogp_mean", "k3_mean")
KNOBS_NOTEBOOK = "06_engine_knobs"


@dataclass
class Sequences:
    """The sampled sequences every setting scores, and where each prompt came from."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    sources: list[str]

    @property
    def tokens(self) -> int:
        return sum(len(p) + len(c) for p, c in zip(self.prompt_ids, self.completion_ids))

    def seq_ids(self) -> np.ndarray:
        return np.concatenate([np.full(len(c), i) for i, c in enumerate(self.completion_ids)])


@dataclass
class SettingsResult(Result):
    status: pd.DataFrame  # one row per trainer setting and grid engine: what ran, or the library's error
    logprobs: pd.DataFrame  # per token and setting: the logprob, the reference's beside it
    grid: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per (engine, trainer setting) cell
    ranking: pd.DataFrame = field(default_factory=pd.DataFrame)  # trainer and engine settings, one k3 scale
    knobs_run: dict = field(default_factory=dict)  # the notebook 06 run ranked beside (run id, model), or why none

    def frames(self) -> dict[str, pd.DataFrame]:
        out = {"status": self.status, "metrics": split_metrics(self.metrics, group="setting"),
               "logprobs": self.logprobs, "ranking": self.ranking}
        if not self.grid.empty:  # no grid engines asked for: no table, and no figure to rebuild from it
            out["grid"] = self.grid
        return out

    def summary(self) -> pd.DataFrame:
        """One row per trainer setting: the mismatch against the float64 reference, batch invariance, price."""
        rows, m = [], self.metrics
        for s in self.status[self.status.section == "setting"].itertuples():
            row = {"setting": s.setting, "changes": s.changes}
            if s.status != "ok":  # the library's error is in the conclusion and the status table
                rows.append({**row, "k3 95% CI": "", "status": s.status})
                continue
            g = s.setting
            row.update({"max |Δlogp|": m[f"{g}/abs_dlogp_max"], "mean |Δlogp|": m[f"{g}/abs_dlogp_mean"],
                        "k3": m[f"{g}/k3_mean"], "k3 95% CI": ci_text(m, g, "k3_mean", ".2e"),
                        "same as batch 1": m.get(f"{g}/batch1_identical_frac", np.nan),
                        "ms / 1k tokens": m[f"{g}/per_1k_tokens_ms"], "time ×": m.get(f"{g}/time_ratio", np.nan),
                        "status": "ok"})
            rows.append(row)
        return pd.DataFrame(rows).set_index("setting") if rows else pd.DataFrame()

    def grid_table(self) -> pd.DataFrame:
        """k3 per (engine, trainer setting), the engine's and the trainer's own distance to the reference beside."""
        if self.grid.empty:
            return pd.DataFrame()
        ok = self.grid[self.grid.status == "ok"]
        t = ok.pivot(index="engine", columns="trainer", values="k3_mean")
        t = t.loc[list(dict.fromkeys(ok.engine)), list(dict.fromkeys(ok.trainer))]
        t.columns = [f"k3 vs trainer {c}" for c in t.columns]
        side = ok.drop_duplicates("engine").set_index("engine")["engine_k3_vs_reference"]
        t.insert(0, "k3 engine vs float64", side)
        return t

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.status, self.grid, self.ranking, self.knobs_run, self.params)

    def answer(self) -> str:
        """One line for the index (`wording.trainer_settings.answer`): each side's largest k3, and whether rlwb's own
        fp32 scorer is batch-invariant."""
        trainer, engine = largest(self.ranking)
        return (wording_09.answer(trainer, engine, self.metrics.get("fp32/batch1_identical_frac"))
                or super().answer())

    def ranking_table(self) -> pd.DataFrame:
        """The ranking for a reader: one row per setting, largest k3 first."""
        r = self.ranking
        return pd.DataFrame({"side": r.side, "setting": r.name, "k3": r.k3_mean,
                             "k3 95% CI": [wording_09.k3_interval(lo, hi)
                                           for lo, hi in zip(r.k3_mean_ci_low, r.k3_mean_ci_high)],
                             "model": r.model, "against": r.against})


def prompts_by_source(p, codec) -> tuple[list[list[int]], list[str]]:
    """The prompts of every source in `prompt_sources`, and each one's source."""
    prompts, sources = [], []
    for src in p.prompt_sources:
        ps = make_prompts(src, p.prompts, p.seed, codec)
        prompts += ps
        sources += [src] * len(ps)
    return prompts, sources


def sample_sequences(p, model_path, prompts: list[list[int]], sources: list[str], on_start: OnStart) -> Sequences:
    """The prompts sampled once by the `sampler` preset."""
    with EngineWorker(p.sampler, model_path, dtype=p.dtype) as w:
        if on_start:
            on_start(w.info())
        comps = w.generate(prompts, sampling(p))
    return Sequences([c.prompt_token_ids for c in comps], [c.token_ids for c in comps], sources)


def sampling(p) -> Sampling:
    return Sampling(temperature=p.temperature, max_tokens=p.max_tokens, seed=p.seed)


def mismatch(ref: list[np.ndarray], logp: list[np.ndarray], seq: Sequences | None, seed: int) -> dict[str, float]:
    """`logp` against `ref` (log r = logp - ref, per token): the mismatch metrics with intervals, k3 per source."""
    e, t = np.concatenate(ref), np.concatenate(logp)
    seq_ids = np.concatenate([np.full(len(x), i) for i, x in enumerate(ref)])
    lrs = [b - a for a, b in zip(ref, logp)]
    out = {**M.mismatch_metrics(e, t, seq_ids=seq_ids), **stats.mismatch_cis(lrs, seed=seed, names=CI_NAMES)}
    if seq is not None:
        for src in dict.fromkeys(seq.sources):
            pick = [lr for lr, s in zip(lrs, seq.sources) if s == src]
            out[f"{src}/k3_mean"] = M.k3(np.concatenate(pick))
    return out


def identical(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[float, float]:
    """(share of sequences whose logprobs are bitwise equal, max |a - b|)."""
    same = [np.array_equal(x, y) for x, y in zip(a, b)]
    return float(np.mean(same)), float(np.max(np.abs(np.concatenate(a) - np.concatenate(b))))


def timed(fn):
    """(fn(), seconds), with CUDA work finished inside the clock."""
    import torch

    t0 = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def measure_setting(master, s: TrainerSetting, seq: Sequences, ref: list[np.ndarray], p) -> tuple[dict, list]:
    """A setting's metrics and per-sequence logprobs. Its main pass runs twice and the second is timed (the
    first pays compilation and warm-up: `first_pass_s`); then its batch-1 twin and, with grad, its old-logprob
    pass, on the same applied model."""
    with timing.phase("scoring"):
        applied = apply_setting(master, s)

        def score(setting=None):
            return applied.score(seq.prompt_ids, seq.completion_ids, p.temperature, batch_size=p.batch_size,
                                 setting=setting)

        _, first = timed(score)
        logp, secs = timed(score)
        out = {**mismatch(ref, logp, seq, p.seed), "per_1k_tokens_ms": secs / seq.tokens * 1e6, "first_pass_s": first}
        if s.batch != 1:
            out["batch1_identical_frac"], out["batch1_abs_dlogp_max"] = identical(logp, score(s.batch1()))
        if s.grad:
            old = score(s.old_pass())
            out["ppo_ratio_identical_frac"], out["ppo_ratio_abs_log_max"] = identical(logp, old)
            out["ppo_ratio_k3"] = M.k3(np.concatenate(logp) - np.concatenate(old))
    return out, logp


def reference(master, seq: Sequences, p) -> list[np.ndarray]:
    """The float64 forward of the master weights, one sequence per forward (batch-invariant by construction)."""
    with timing.phase("scoring"):
        return apply_setting(master, REFERENCE).score(seq.prompt_ids, seq.completion_ids, p.temperature, batch_size=1)


def _status(section: str, name: str, changes: str, record: str = "") -> dict:
    """A row of the status table: what the setting (or grid engine) is, and whether it ran."""
    return {"section": section, "setting": name, "changes": changes, "record": record, "status": "ok", "error": ""}


def library_error(e: BaseException) -> str:
    """The library's own one-line reason, with its exception type (unless the line already starts with one)."""
    import re

    line = error_line(e)
    return line if re.match(r"^(\w+\.)*\w*(Error|Exception)\b:", line) else f"{type(e).__name__}: {line}"


def failure_status(e: BaseException) -> str:
    """How a setting that raised is listed: its numbers were unusable, or the library refused it here."""
    return "non-finite logprobs" if "non-finite" in str(e) else "unsupported here"


def free_accelerator_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> SettingsResult:
    from rlwb.progress import progress_bar

    p = params
    prompts, sources = prompts_by_source(p, tokenizer.PromptCodec(model_path, p.chat_template))
    seq = sample_sequences(p, model_path, prompts, sources, on_start)
    master = TrainerScorer(model_path, "float32").model
    ref = reference(master, seq, p)
    mets: dict = {}
    rows: list[dict] = []
    logps: dict[str, list[np.ndarray]] = {"float64 reference": ref}
    names = list(dict.fromkeys([*CONTROL, *p.settings]))
    for name in progress_bar(names, desc="trainer settings", disable=not progress):
        row = _status("setting", name, describe(name), parse_setting(name).changes())
        try:
            with warnings.catch_warnings():  # compile and flex attention warn about their own internals
                warnings.simplefilter("ignore")
                m, logp = measure_setting(master, parse_setting(name), seq, ref, p)
        except Exception as e:  # noqa: BLE001 (a setting this machine cannot run is a finding: its row says why)
            row.update(status=failure_status(e), error=library_error(e))
            rows.append(row)
            continue
        finally:
            free_accelerator_memory()  # the setting's model copy is gone: give its memory back before the next
        mets.update(M.prefixed(name, m))
        logps[name] = logp
        rows.append(row)
    if "fp32/per_1k_tokens_ms" in mets:
        for r in rows:
            if r["status"] == "ok":
                mets[f"{r['setting']}/time_ratio"] = mets[f"{r['setting']}/per_1k_tokens_ms"] / mets[
                    "fp32/per_1k_tokens_ms"]
    grid, grid_rows = head_grid(master, p, model_path, prompts, mets, on_start, progress)
    rows += grid_rows
    knobs_run, knob_rows = engine_knobs_run(p)
    status = pd.DataFrame(rows)
    return SettingsResult(p, mets, status, logprob_frame(seq, logps), grid,
                          ranking(mets, status, grid, knob_rows), knobs_run)


def logprob_frame(seq: Sequences, logps: dict[str, list[np.ndarray]]) -> pd.DataFrame:
    ref = np.concatenate(logps["float64 reference"])
    seq_ids, src = seq.seq_ids(), np.repeat(seq.sources, [len(c) for c in seq.completion_ids])
    pos = np.concatenate([np.arange(len(c)) for c in seq.completion_ids])
    return pd.concat([pd.DataFrame({"setting": name, "sequence": seq_ids, "source": src, "position": pos,
                                    "logp": np.concatenate(lp), "logp_reference": ref})
                      for name, lp in logps.items()], ignore_index=True)


def head_grid(master, p, model_path, prompts: list[list[int]], mets: dict, on_start: OnStart,
              progress: bool) -> tuple[pd.DataFrame, list[dict]]:
    """Each grid engine samples the prompts; each grid trainer setting scores its sequences. Cells: k3 engine vs
    trainer (`grid/<engine>/<trainer>/...`), with the engine's and the trainer's own k3 against the reference."""
    from rlwb.progress import progress_bar

    cells, rows = [], []
    for preset in progress_bar(p.grid_engines, desc="head grid", disable=not progress):
        row = _status("grid", preset, "engine: " + preset)
        try:
            with EngineWorker(preset, model_path, dtype=p.dtype) as w:
                info = w.info()
                if on_start:
                    on_start(info)
                missing = not_applied(w.preset.vllm_kwargs, info.get("settings") or {}, w.preset.fp32_lm_head)
                if missing:
                    row.update(status="did not take effect", error="; ".join(missing))
                    rows.append(row)
                    continue
                comps = w.generate(prompts, sampling(p))
        except (EngineCrashed, EngineError, PresetError) as e:
            row.update(status="unsupported here", error=error_line(e))
            rows.append(row)
            continue
        rows.append(row)
        seq = Sequences([c.prompt_token_ids for c in comps], [c.token_ids for c in comps], [])
        eng = [c.logprobs.astype(np.float64) for c in comps]
        ref = reference(master, seq, p)
        side = mismatch(ref, eng, None, p.seed)  # log r = engine - reference: the engine side alone
        mets.update(M.prefixed(f"grid/{preset}/engine_vs_reference", side))
        for name in p.grid_settings:
            cell = {"engine": preset, "trainer": name, "status": "ok", "error": "",
                    "engine_k3_vs_reference": side["k3_mean"]}
            try:
                with timing.phase("scoring"):
                    logp = apply_setting(master, parse_setting(name)).score(seq.prompt_ids, seq.completion_ids,
                                                                    p.temperature, batch_size=p.batch_size)
            except Exception as e:  # noqa: BLE001 (as for the settings: the library's error is the row)
                cell.update(status=failure_status(e), error=library_error(e))
                cells.append(cell)
                continue
            m = {**mismatch(eng, logp, None, p.seed), "trainer_k3_vs_reference": M.k3(
                np.concatenate(logp) - np.concatenate(ref))}
            mets.update(M.prefixed(f"grid/{preset}/{name}", m))
            cell.update({k: m[k] for k in ("k3_mean", "k3_mean_ci_low", "k3_mean_ci_high", "abs_dlogp_mean",
                                           "abs_dlogp_max", "trainer_k3_vs_reference")})
            cells.append(cell)
    return pd.DataFrame(cells), rows


def archive_root() -> Path:
    """The archive this run is written to: the parent of its notebook's folder under `rlwb run`, else the default."""
    from rlwb.paths import outputs_dir

    run_dir = os.environ.get("RLWB_RUN_DIR")
    return Path(run_dir).parent.parent if run_dir else outputs_dir()


def engine_knobs_run(p) -> tuple[dict, list[dict]]:
    """Notebook 06's run named by `compare_run` ("latest": `latest/06_engine_knobs` of this run's archive): its
    id and model, and one row per knob that ran (k3 against its fp32 trainer, with the interval); or why none."""
    if p.compare_run == "none":
        return {"note": "not asked for (compare_run: none)"}, []
    d = archive_root() / "latest" / KNOBS_NOTEBOOK if p.compare_run == "latest" else Path(p.compare_run)
    if not (d / "metrics.json").exists():
        return {"note": f"no notebook 06 run at {d.name if p.compare_run == 'latest' else d}: run "
                        f"06_engine_knobs first to rank its engine knobs here"}, []
    import yaml

    info = read_record(d, {})
    m = json.loads((d / "metrics.json").read_text())
    ran = yaml.safe_load((d / "params.yaml").read_text()) or {}
    status = pd.read_parquet(d / "data" / "status.parquet")
    knobs = status[(status.section == "knob") & (status.status == "ok")].knob
    run = {"run_id": info.get("run_id", d.resolve().name), "model": ran.get("model"),
           "baseline": ran.get("baseline"), "prompt_source": ran.get("prompt_source")}
    rows = [{"side": "engine (notebook 06)", "name": f"{run['baseline']}@{k}" if k != "baseline" else run["baseline"],
             "k3_mean": m[f"{k}/k3_mean"], "k3_mean_ci_low": m.get(f"{k}/k3_mean_ci_low", np.nan),
             "k3_mean_ci_high": m.get(f"{k}/k3_mean_ci_high", np.nan), "model": run["model"],
             "against": f"fp32 trainer, {run['run_id']}"} for k in knobs if f"{k}/k3_mean" in m]
    return run, rows


def ranking(mets: dict, status: pd.DataFrame, grid: pd.DataFrame, knob_rows: list[dict]) -> pd.DataFrame:
    """Trainer settings (k3 against the float64 reference), this run's grid engines (k3 against the fp32 trainer)
    and notebook 06's knobs (k3 against its fp32 trainer), largest first."""
    rows = []
    for s in status[(status.section == "setting") & (status.status == "ok")].setting:
        rows.append({"side": "trainer", "name": s, "k3_mean": mets[f"{s}/k3_mean"],
                     "k3_mean_ci_low": mets[f"{s}/k3_mean_ci_low"], "k3_mean_ci_high": mets[f"{s}/k3_mean_ci_high"],
                     "model": "this run", "against": "float64 reference"})
    if not grid.empty:
        for e in grid[(grid.trainer == "fp32") & (grid.status == "ok")].engine:
            c = grid[(grid.engine == e) & (grid.trainer == "fp32")].iloc[0]
            rows.append({"side": "engine (this run)", "name": e, "k3_mean": c.k3_mean,
                         "k3_mean_ci_low": c.k3_mean_ci_low, "k3_mean_ci_high": c.k3_mean_ci_high,
                         "model": "this run", "against": "fp32 trainer"})
    rows += knob_rows
    out = pd.DataFrame(rows, columns=["side", "name", "k3_mean", "k3_mean_ci_low", "k3_mean_ci_high", "model",
                                      "against"])
    return out.sort_values("k3_mean", ascending=False, kind="stable").reset_index(drop=True)


def largest(ranking_df: pd.DataFrame) -> tuple[dict | None, dict | None]:
    """The ranking's largest trainer setting (the control `fp64` aside) and largest engine setting, as rows
    (`name`, `k3_mean` and its interval ...), None where that side has none. The ranking is sorted largest first."""
    r = ranking_df
    if r.empty:
        return None, None
    trainer = r[(r.side == "trainer") & (r["name"] != "fp64")]
    engine = r[r.side.str.startswith("engine")]
    return (trainer.iloc[0].to_dict() if len(trainer) else None, engine.iloc[0].to_dict() if len(engine) else None)


def conclusion(metrics: dict, status: pd.DataFrame, grid: pd.DataFrame, ranking_df: pd.DataFrame, knobs_run: dict,
               p) -> str:
    """The answer in Markdown (`wording.trainer_settings`), every number from the metrics and the tables built from
    them. Decided here: the settings' order (largest k3 first), whether the float64 reference is batch-invariant,
    the grid's least and most mismatched cells and whether their intervals separate, and the ranking's verdict."""
    m = metrics
    settings = status[status.section == "setting"]
    control = None
    if "fp64/abs_dlogp_max" in m:
        same = m["fp64/batch1_identical_frac"]
        control = {"abs_dlogp_max": m["fp64/abs_dlogp_max"], "identical_frac": same, "batch_invariant": same == 1}
    ok = settings[settings.status == "ok"].setting.tolist()
    engines = status[status.section == "grid"]
    setup = {"run": {"sampler": p.sampler, "model": p.model, "prompt_sources": list(p.prompt_sources),
                     "prompts": len(p.prompt_sources) * p.prompts, "temperature": p.temperature,
                     "max_tokens": p.max_tokens},
             "control": control,
             "ordered": sorted((s for s in ok if s != "fp64"), key=lambda s: -m[f"{s}/k3_mean"]),
             "not_run": {r.setting: r.error for r in settings[settings.status != "ok"].itertuples()},
             "grid_failed": [(r.setting, r.status, r.error) for r in engines[engines.status != "ok"].itertuples()],
             **grid_verdict(grid),
             "ranking": None if ranking_df.empty else ranking_verdict(ranking_df, knobs_run, p)}
    return wording_09.conclusion(m, setup)


def grid_verdict(grid: pd.DataFrame) -> dict:
    """The head grid's cells that ran, grouped by engine (`grid`), and its least and most mismatched cells with
    whether their intervals separate (`grid_extremes`, None without a cell)."""
    if grid.empty or not (grid.status == "ok").any():
        return {"grid": [], "grid_extremes": None}
    ok = grid[grid.status == "ok"]
    engines = [{"engine": e, "engine_k3": cells.engine_k3_vs_reference.iloc[0],
                "cells": [{"trainer": c.trainer, "k3": c.k3_mean, "trainer_k3": c.trainer_k3_vs_reference}
                          for c in cells.itertuples()]}
               for e, cells in ok.groupby("engine", sort=False)]
    lo, hi = ok.loc[ok.k3_mean.idxmin()], ok.loc[ok.k3_mean.idxmax()]
    return {"grid": engines, "grid_extremes": {"least": lo.to_dict(), "most": hi.to_dict(),
                                               "separate": _separate(lo, hi)}}


def ranking_verdict(ranking_df: pd.DataFrame, knobs_run: dict, p) -> dict:
    """What the one k3 scale says (`wording.trainer_settings.ranking_lines`'s arguments): notebook 06's run and
    whether it is this run's model, each side's largest setting, which is larger and whether their intervals
    separate."""
    t, e = largest(ranking_df)
    both = t is not None and e is not None
    return {"knobs_run": knobs_run, "model": p.model,
            "same_model": knobs_run["model"] == p.model if "run_id" in knobs_run else None,
            "largest_trainer": t, "largest_engine": e,
            "engine_bigger": bool(both and e["k3_mean"] > t["k3_mean"]), "separate": both and _separate(t, e)}


def _separate(a, b) -> bool:
    """Do two rows' k3 intervals not overlap?"""
    return bool(a["k3_mean_ci_low"] > b["k3_mean_ci_high"] or b["k3_mean_ci_low"] > a["k3_mean_ci_high"])
