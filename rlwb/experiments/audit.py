"""Notebook 10's experiment: is MY rollout engine, as I serve it, on-policy with MY trainer, on MY prompts?

The other notebooks audit rlwb's own presets against rlwb's scorer on prompts rlwb makes. Here every part can be
the team's own: the prompts come from a file (`rlwb.core.prompts.from_file`), the engine is a preset or a running
OpenAI-compatible server (`rlwb.engines.served`), the trainer is rlwb's scorer in a chosen dtype and attention
kernel or the team's own command (`rlwb.core.scoring.external`). Or the rollouts come from an archived run and only
the trainer is new (`rollouts_from`: `rlwb rescore`). The report gives the mismatch metrics with intervals, the
tokens where engine and trainer disagree most, and the same numbers under the names and thresholds each RL
framework logs (`rlwb.core.measure.framework_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.measure import metrics as M
from rlwb.core.measure.framework_metrics import panel
from rlwb.core.prompts import from_file
from rlwb.core.rl.mismatch_doses import dose_kinds, kinds_for
from rlwb.core.scoring.external import ExternalScorer
from rlwb.core.scoring.rollouts import Rollouts, rollouts_from_frame, sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.presets import is_url, resolve_preset, served_preset
from rlwb.engines.served import ServedEngine
from rlwb.engines.worker import EngineWorker, Sampling
from rlwb.experiments.base import OnStart, Result, engine_metrics, split_metrics
from rlwb.experiments.wording import audit as wording_10
from rlwb.experiments.wording.audit import alert_text
from rlwb.formatting import metric
from rlwb.paths import repo_path

# a text every tokenizer here can encode (the 64-symbol char vocabulary included): a served engine must tokenize it
# exactly as the trainer does, or it is another model
PROBE_TEXT = "what is 58+67? 8+7=15,5+6+1=12#125. the quick brown fox (jumps) over: 3 dogs!\n"
SUMMARY_COLUMNS = ["abs_dlogp_mean", "abs_dlogp_max", "k3_mean", "clip_frac", "ess_frac", "mult_prob_error",
                   "abs_dlogp_raw_mean", "full_kl_mean", "token_entropy_mean", "n_tokens"]
FLOOR = 1e-4  # max |Δlogp| at or under this: engine and trainer agree to float precision (fp32)


@dataclass
class AuditResult(Result):
    rollouts: dict[str, Rollouts]  # per engine (label)
    panels: pd.DataFrame  # the cross-framework panel, one row per engine and framework metric
    worst: pd.DataFrame  # the tokens with the largest |Δlogp|
    source: dict = field(default_factory=dict)  # the prompts file (path, sha256, rows) or the archived run
    trainer: dict = field(default_factory=dict)  # what scored (kind, dtype, attention, or the command)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {"rollouts": pd.concat([r.to_frame() for r in self.rollouts.values()], ignore_index=True),
                "metrics": split_metrics({k: v for k, v in self.metrics.items() if not k.startswith("audit/")}),
                "panel": self.panels, "worst_tokens": self.worst}

    def summary(self) -> pd.DataFrame:
        t = split_metrics(self.metrics).pivot(index="engine", columns="metric", values="value")
        return t.loc[[e for e in self.rollouts if e in t.index], [c for c in SUMMARY_COLUMNS if c in t.columns]]

    def panel_table(self) -> pd.DataFrame:
        """The panel as a reader wants it: per framework metric, when the framework alerts, and each engine's value
        [95% CI] with its verdict (formatted as rlwb formats that metric: "≤ 1e-08" at the float floor)."""
        rows: dict[tuple, dict] = {}
        for _, r in self.panels.iterrows():
            row = rows.setdefault((r["framework"], r["metric"]), {
                "framework": r["framework"], "metric": r["metric"],
                "alerts when": alert_text(r["alert"], r["threshold"])})
            name = r["rlwb_metric"]
            verdict = "" if r["verdict"] == "no threshold" else f" · {r['verdict']}"
            row[r["engine"]] = (f"{metric(name, r['value'], '.3g')} [{metric(name, r['ci_low'], '.3g')}, "
                                f"{metric(name, r['ci_high'], '.3g')}]{verdict}")
        return pd.DataFrame(list(rows.values()))

    def worst_table(self) -> pd.DataFrame:
        """The worst tokens for a reader: logprobs in nats to 7 decimals (a float32 logprob's resolution near 0:
        -0.0000007 is a token with p = 0.9999993, not float noise), the gap as measured."""
        t = self.worst.copy()
        for c in ("logp_engine", "logp_trainer"):
            t[c] = [f"{v:.7f}" for v in t[c]]
        return t

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.params, list(self.rollouts), self.panels, self.source, self.trainer)


def make_scorer(p, model_path):
    """rlwb's scorer in the chosen dtype and attention kernel, or the team's command (`trainer` not `hf`)."""
    if p.trainer == "hf":
        return TrainerScorer(model_path, p.trainer_dtype, attn_implementation=p.trainer_attn)
    from rlwb.paths import REPO_ROOT

    return ExternalScorer(p.trainer, model_path, cwd=REPO_ROOT)


def open_engines(p, model_path, codec: PromptCodec, on_start: OnStart) -> Iterator[EngineWorker | ServedEngine]:
    """Each of `p.engines` in turn, started (a preset) or checked (a served engine: reachable, serving the model,
    tokenizing as the trainer does, returning the logprobs the audit asks for), yielded, closed."""
    vocab, _ = from_file.model_limits(model_path)
    for name in p.engines:
        preset = served_preset(name, p.served_model) if is_url(name) else resolve_preset(name)
        if preset.backend == "openai":
            engine = ServedEngine(preset, probe=(PROBE_TEXT, codec.encode(PROBE_TEXT)),
                                  full_logprobs=vocab if p.full_vocab else 0)
        else:
            engine = EngineWorker(preset, model_path, dtype=p.dtype)
        with engine:
            if on_start:
                on_start(engine.info())
            yield engine
            if on_start:  # what a served engine echoed while sampling (its system_fingerprint)
                on_start(engine.info())


def audit_metrics(ro: Rollouts, p) -> dict[str, float]:
    """`engine_metrics` (notebook 01's, with intervals) plus, where the trainer scored raw (T = 1) logprobs too,
    the mean gap to those: an engine that reports raw logprobs sits at the float floor there."""
    m = engine_metrics(ro, p.clip_eps, p.seed)
    if ro.logp_trainer_raw is not None and ro.completions:
        e = np.concatenate(ro.logp_engine).astype(np.float64)
        m["abs_dlogp_raw_mean"] = M.abs_mean(np.concatenate(ro.logp_trainer_raw).astype(np.float64) - e)
    return m


def worst_tokens(rollouts: dict[str, Rollouts], codec: PromptCodec, ids: list[str] | None, n: int) -> pd.DataFrame:
    """The `n` tokens with the largest |logp_trainer - logp_engine| over every engine: where, what, both logprobs."""
    rows = []
    for label, ro in rollouts.items():
        for c, t in zip(ro.completions, ro.logp_trainer):
            d = np.abs(t.astype(np.float64) - c.logprobs.astype(np.float64))
            for pos in np.argsort(-d)[:n]:
                rows.append({"engine": label, "prompt": ids[c.request_id] if ids else str(c.request_id),
                             "sample": c.sample_index, "position": int(pos), "token_id": int(c.token_ids[pos]),
                             "token": repr(codec.decode([c.token_ids[pos]])), "logp_engine": float(c.logprobs[pos]),
                             "logp_trainer": float(t[pos]), "abs_dlogp": float(d[pos])})
    cols = ["engine", "prompt", "sample", "position", "token_id", "token", "logp_engine", "logp_trainer", "abs_dlogp"]
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values("abs_dlogp", ascending=False, kind="stable").head(n).reset_index(drop=True)


def archived_rollouts(run_dir) -> tuple[dict[str, Rollouts], dict]:
    """An archived run's rollouts (`rollouts_from`) and what the audit records of its source."""
    from rlwb.run_record import read_record

    d = repo_path(run_dir)
    table = pd.read_parquet(d / "data" / "rollouts.parquet")
    info = read_record(d)
    return rollouts_from_frame(table), {"kind": "archived run", "run": str(d), "notebook": info.get("notebook"),
                                        "run_id": info.get("run_id", d.name), "git_commit": info.get("git_commit")}


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> AuditResult:
    """Sample the prompts file with each engine (or take an archived run's rollouts), score with the trainer, and
    measure: mismatch metrics with intervals, worst tokens, the cross-framework panel."""
    from rlwb.progress import progress_bar

    p = params
    codec = PromptCodec(model_path, "auto")
    scorer = make_scorer(p, model_path)
    raw = isinstance(scorer, TrainerScorer)
    out: dict[str, Rollouts] = {}
    mets: dict[str, float] = {}
    ids = None
    if p.rollouts_from:
        archived, source = archived_rollouts(p.rollouts_from)
        for label, ro in progress_bar(list(archived.items()), desc="re-scoring", disable=not progress):
            comps = ro.completions
            s = scorer.score([c.prompt_token_ids for c in comps], [c.token_ids for c in comps],
                             temperature=ro.sampling.temperature, top_k=ro.sampling.top_k, top_p=ro.sampling.top_p,
                             raw=raw, entropy=raw)
            out[label] = Rollouts(label, ro.sampling, comps, s["logp"], s.get("logp_raw"), None, s.get("entropy"))
            before = np.concatenate(ro.logp_trainer) if comps else np.zeros(0)
            after = np.concatenate(s["logp"]).astype(np.float64) if comps else np.zeros(0)
            mets[f"{label}/vs_archived_trainer_abs_dlogp_max"] = float(np.max(np.abs(after - before))) \
                if after.size else float("nan")
    else:
        vocab, context = from_file.model_limits(model_path)
        prompts = from_file.load_prompts(repo_path(p.prompts_file), codec, vocab_size=vocab, context=context,
                                            max_tokens=p.max_tokens)  # every row checked before an engine starts
        ids = prompts.ids
        source = {"kind": "prompts file", "path": prompts.path, "sha256": prompts.sha256, "rows": len(prompts),
                  "fields": {f: prompts.fields.count(f) for f in from_file.FIELDS if f in prompts.fields}}
        sampling = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens,
                            seed=p.seed, n=p.samples_per_prompt)
        for w in progress_bar(open_engines(p, model_path, codec, on_start), desc="engines", total=len(p.engines),
                              disable=not progress):
            out[w.preset.name] = sample_and_score(w, scorer, prompts.token_ids, sampling, full=p.full_vocab, raw=raw)
    for label, ro in out.items():
        mets.update(M.prefixed(label, audit_metrics(ro, p)))
    panels = pd.DataFrame([{"engine": label, **row} for label, ro in out.items()
                           for row in panel(ro.logp_engine, ro.logp_trainer, seed=p.seed)])
    for label in out:
        flagged = panels[(panels["engine"] == label) & (panels["verdict"] == "flagged")]
        mets[f"{label}/frameworks_flagged"] = len(flagged)
    labels = list(out)
    mets["audit/k3_mean_worst"] = max((mets[f"{e}/k3_mean"] for e in labels), default=float("nan"))
    mets["audit/abs_dlogp_max_worst"] = max((mets[f"{e}/abs_dlogp_max"] for e in labels), default=float("nan"))
    trainer = scorer.describe()
    return AuditResult(p, mets, out, panels, worst_tokens(out, codec, ids, p.worst_tokens), source, trainer)


def conclusion(metrics: dict, p, engines: list[str], panels: pd.DataFrame, source: dict, trainer: dict) -> str:
    """Markdown (`wording.audit`); every number from `metrics` or the panel. Decided here: which engines report the
    trainer's raw logprobs (off the float floor, yet within 1% of the mean gap of the raw ones), which panel rows
    are flagged, and which engines sit at the float floor (`FLOOR`)."""
    def g(e, k):
        return metrics.get(f"{e}/{k}")

    verdicts = {}
    for e in engines:
        if g(e, "abs_dlogp_max") is None:
            continue
        raw = g(e, "abs_dlogp_raw_mean")
        mine = panels[panels["engine"] == e] if len(panels) else panels
        flagged = mine[mine["verdict"] == "flagged"] if len(mine) else mine
        verdicts[e] = {"reports_raw": bool(raw is not None and g(e, "abs_dlogp_max") > FLOOR
                                           and raw < 0.01 * g(e, "abs_dlogp_mean")),
                       "panel": {"flagged": flagged.to_dict("records"),
                                 "thresholds": int((mine["threshold"].notna()).sum())} if len(mine) else None}
    setup = {"run": {"source": source, "trainer": trainer, "samples_per_prompt": p.samples_per_prompt,
                     "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "max_tokens": p.max_tokens},
             "engines": verdicts, "temperature": p.temperature, "floor": FLOOR,
             # an engine without metrics is in neither list; one at exactly 0 (bitwise the trainer's) is at the floor
             "at_floor": [e for e in engines if g(e, "abs_dlogp_max") is not None and g(e, "abs_dlogp_max") <= FLOOR],
             "off_floor": [e for e in engines if g(e, "abs_dlogp_max") is not None and g(e, "abs_dlogp_max") > FLOOR]}
    setup["study"] = study_context(metrics, {e: v["reports_raw"] for e, v in verdicts.items()})
    return wording_10.conclusion(metrics, setup)


SEED_DESIGN = ("seed", "num_seeds", "max_seeds", "seed_power")  # a study's params that say how its seeds were drawn


def study_context(metrics: dict, reports_raw: dict[str, bool], runs_dir=None) -> dict:
    """Each audited engine's measured k3 beside notebook 08's benchmark doses of its kind of mismatch:
    the kinds that sample right for an engine that reports raw logprobs (it samples right, reports wrong: ratio),
    the distribution kinds otherwise (perturbed weights, stale weights; `mismatch_doses.kinds_for`), per arm:
    the BMDL and its status, from the study's runs of record (`dose_response.study_benchmarks`, measured on rlwb's
    small embedded models). `runs` empty: no study run of record yet."""
    from rlwb.core.measure import dose_response
    from rlwb.experiments.mismatch_study.benchmarks import MIN_DOSES

    runs = dose_response.study_benchmarks(runs_dir, [k.param for k in dose_kinds()], MIN_DOSES)
    # per run, once: whether its benchmark doses were fitted by EPA's convention (a study analysed before has no
    # `scale_agree`), and its seed design (`SEED_DESIGN`), which tells a model's equally broad studies apart
    fitted = {r["run"]: "scale_agree" in r["benchmarks"] for r in runs}
    seeds = {r["run"]: {k: r["params"][k] for k in SEED_DESIGN if k in r["params"]} for r in runs}
    engines = []
    for e, raw in reports_raw.items():
        k3 = metrics.get(f"{e}/k3_mean")
        if k3 is None:
            continue
        kinds = kinds_for(raw)
        per_run = []
        for r in runs:
            b = r["benchmarks"]
            rows = b[b["kind"].isin(kinds)]
            per_run.append({"run": r["run"], "model": r["model"], "fitted": fitted[r["run"]],
                            "seeds": seeds[r["run"]],
                            "rows": [{"kind": x.kind, "arm": x.arm, "status": x.status, "bmdl": float(x.bmdl),
                                      "bmd": float(getattr(x, "bmd", float("nan"))),
                                      "scale_agree": bool(getattr(x, "scale_agree", False)),
                                      "keep_below": float(getattr(x, "keep_below", float("nan"))),
                                      "k3_min": float(x.k3_min), "k3_max": float(x.k3_max)}
                                     for x in rows.itertuples()]})
        engines.append({"engine": e, "k3": float(k3), "raw": bool(raw), "kinds": kinds, "runs": per_run})
    models = [r["model"] for r in runs if fitted[r["run"]]]
    twice = sorted({m for m in models if models.count(m) > 1})  # models read from more than one fitted study
    for eng in engines:
        eng["act_on"] = lower_levels(eng["runs"], {m: models.count(m) for m in twice})
    return {"dir": f"docs/runs/{dose_response.STUDY_DIR}", "runs": [r["run"] for r in runs], "engines": engines,
            "models_twice": twice}


def lower_levels(per_run: list[dict], studies: dict[str, int]) -> list[dict]:
    """README's advice where a model has more than one study as broad (a study and its rerun on fresh seeds), made
    per row: for each model of `studies` (model -> how many fitted studies it has), kind and arm, the lowest level
    ("keep k3 below") any of its fitted studies quotes, the run that quotes it, and how many of the model's fitted
    studies quote one (`studies` is the denominator: a study with no level for the row, or no such row, still
    counts, so the reader sees a level that rests on fewer studies). Rows no study quotes a level for are left
    out: the per-run lines say why each has none."""
    out: dict[tuple, dict] = {}
    for r in per_run:
        if r["model"] not in studies or not r["fitted"]:
            continue
        for x in r["rows"]:
            row = out.setdefault((r["model"], x["kind"], x["arm"]), {
                "model": r["model"], "kind": x["kind"], "arm": x["arm"], "keep_below": float("nan"), "run": None,
                "studies": studies[r["model"]], "quoting": 0})
            if x["keep_below"] == x["keep_below"]:  # a level (not NaN)
                row["quoting"] += 1
                if not row["keep_below"] <= x["keep_below"]:  # NaN so far, or lower
                    row["keep_below"], row["run"] = x["keep_below"], r["run"]
    return [row for row in out.values() if row["run"] is not None]
