"""Notebook 06's experiment: one engine setting at a time, measured against the trainer and priced in throughput.

A *knob* is a named change to a baseline preset (`params/engine_knobs.yaml`; `vllm-v1-fixed@kv-fp8` is the
baseline with the knob applied). The baseline and every knob sample the same prompts with the same seeds and
are scored by the same fp32 trainer; each gets the mismatch metrics with 95% sequence-bootstrap intervals, its
change against the baseline (difference of the two, with a paired interval: completion i of a knob and of
the baseline come from the same prompt and seed), its throughput relative to the
baseline's measured in the same run, and a verdict against the health rules RL frameworks publish
(`HEALTH_RULES`). A knob the engine refuses is a row too: "unsupported here" and the engine's own error line (or
rlwb's reason, where the machine is known to refuse it before it starts: `presets.unsupported_here`).

Three more sections use the same machinery: the *version* axis (other vLLM builds, each its own preset and
environment, with the baseline's settings), and the *MoE router audit* on the embedded MoE model
(`qwen2-moe-chat`): per layer, how often the engine's router picks the experts the trainer's picks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlwb.core.data import tokenizer
from rlwb.core.measure import metrics as M
from rlwb.core.measure import stats
from rlwb.core.prompts.generated import make_prompts
from rlwb.core.scoring.rollouts import Rollouts, sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.presets import KNOB_SEP, load_knobs, resolve_preset
from rlwb.engines.worker import EngineWorker, Sampling
from rlwb.errors import EngineCrashed, EngineError, PresetError
from rlwb.experiments.base import OnStart, Result, launch_engine, prefetch_engines, split_metrics
from rlwb.experiments.engine_readback import EFFECTIVE, ENV_READBACK, error_line, not_applied
from rlwb.experiments.wording import engine_knobs as wording_06
from rlwb.experiments.wording.engine_knobs import VERDICTS

# (metric, comparison, bound, source). verl: docs/algo/rollout_corr.md's health check warns when
# |rollout_corr/kl| > 0.1, rollout_is_eff_sample_size < 0.3 or chi2_token > 1.0
# (https://github.com/volcengine/verl/blob/main/docs/algo/rollout_corr.md); its ESS is over the truncated token
# TIS weights at verl's default cap (`metrics.ess_tis`, held to verl's own code by tests/test_corrections.py),
# not the raw ratios. NeMo-RL: its GRPO tests require train/token_mult_prob_error < 1.05
# (NVIDIA-NeMo/RL tests/test_suites/llm/*.sh; the metric is defined in nemo_rl/algorithms/loss_functions.py).
HEALTH_RULES = (("ess_tis", ">=", 0.3, "verl"), ("chi2_token", "<=", 1.0, "verl"),
                ("abs_k1", "<=", 0.1, "verl"), ("mult_prob_error", "<=", 1.05, "NeMo-RL"))
CI_NAMES = ("abs_dlogp_mean", "k3_mean", "clip_frac", "ess_tis", "chi2_token", "mult_prob_error")
DELTA_NAMES = ("k3_mean", "abs_dlogp_mean")  # change vs the baseline, with an interval
FLOAT_FLOOR = 1e-4  # max |Δlogp| at or under this: the knob keeps engine and trainer at float precision
BASELINE = "baseline"


def knob_preset(baseline: str, knob: str) -> str:
    return baseline if knob == BASELINE else f"{baseline}{KNOB_SEP}{knob}"





def health(metrics: dict, group: str) -> tuple[bool, list[str]]:
    """(all rules pass, the rules that fail as text)."""
    failed = []
    for name, op, bound, source in HEALTH_RULES:
        v = abs(metrics[f"{group}/k1_mean"]) if name == "abs_k1" else metrics[f"{group}/{name}"]
        ok = v >= bound if op == ">=" else v <= bound
        if not ok:
            failed.append(wording_06.failed_rule(name, v, op, bound, source))
    return not failed, failed


def not_verified(vllm_kwargs: dict, env: dict, settings: dict) -> list[str]:
    """What a knob sets (`vllm_kwargs`, `env`: its changes to the baseline) that nothing read back from the running
    engine confirms: it is measured as configured and marked "not verified" in the report, never passed off as
    checked. A vLLM kwarg is confirmed by its own name in the engine's settings (`EFFECTIVE`), `head_dtype` and a
    speculative method by theirs; an environment variable only through `ENV_READBACK`."""
    out = []
    for k, v in vllm_kwargs.items():
        if k == "hf_overrides":
            out += [f"hf_overrides {n}={x}" for n, x in v.items()
                    if n != "head_dtype" or settings.get("head_dtype") is None]
        elif k == "speculative_config":
            if "speculative" not in settings:
                out.append(f"{k}={v}")
        elif k not in EFFECTIVE or settings.get(k) is None:
            out.append(f"{k}={v}")
    for name, v in env.items():
        key = ENV_READBACK.get(name, (None,))[0]
        if key is None or settings.get(key) is None:
            out.append(f"env {name}={v}")
    return out


def knob_changes(baseline: str, preset: str) -> tuple[dict, dict]:
    """(vLLM kwargs, environment) that `preset` sets differently from `baseline`: what a knob changes."""
    base, p = resolve_preset(baseline), resolve_preset(preset)
    return ({n: v for n, v in p.vllm_kwargs.items() if base.vllm_kwargs.get(n) != v},
            {n: v for n, v in p.env.items() if base.env.get(n) != v})


def same_tokens_frac(a: Rollouts, b: Rollouts) -> float:
    """Share of requests whose sampled tokens are identical in both runs (same prompts, same seeds)."""
    pairs = list(zip(a.completions, b.completions))
    return float(np.mean([x.token_ids == y.token_ids for x, y in pairs])) if pairs else float("nan")


def throughput(w: EngineWorker, prompts: list[list[int]], sampling: Sampling, repeats: int) -> dict[str, float]:
    """Completion tokens per second of `prompts` (logprob of the sampled token only, as an RL rollout asks),
    median of `repeats` timed calls after one warm-up call."""
    w.generate(prompts[: max(1, len(prompts) // 4)], sampling)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        comps = w.generate(prompts, sampling)
        rates.append(sum(len(c.token_ids) for c in comps) / (time.perf_counter() - t0))
    return {"tok_s": statistics.median(rates)}


def knob_metrics(ro: Rollouts, base: Rollouts | None, clip_eps: float, seed: int) -> dict[str, float]:
    e, t = ro.flat()
    lrs = ro.log_ratios()
    out = {**M.mismatch_metrics(e, t, seq_ids=ro.seq_ids(), clip_eps=clip_eps),
           **stats.mismatch_cis(lrs, clip_eps, seed=seed, names=CI_NAMES)}
    if base is not None:
        fns = stats.token_statistics(clip_eps)
        base_lrs = base.log_ratios()
        for k in DELTA_NAMES:
            out[f"delta_{k}"] = out[k] - fns[k](np.concatenate(base_lrs))
            # same prompts, same seeds: completion i of the knob and of the baseline are a pair
            out[f"delta_{k}_ci_low"], out[f"delta_{k}_ci_high"] = stats.paired_difference_ci(lrs, base_lrs, fns[k],
                                                                                             seed=seed)
        out["same_tokens_frac"] = same_tokens_frac(ro, base)
    return out


@dataclass
class KnobResult(Result):
    rollouts: dict[str, Rollouts]  # per knob (and version), as sampled
    status: pd.DataFrame  # one row per knob / version: what ran, or the engine's error
    routing: pd.DataFrame = field(default_factory=pd.DataFrame)  # MoE: one row per (dtype, layer)

    def frames(self) -> dict[str, pd.DataFrame]:
        out = {"status": self.status, "metrics": split_metrics(self.metrics, group="knob"),
               "rollouts": pd.concat([r.to_frame(knob=k) for k, r in self.rollouts.items()], ignore_index=True)
               if self.rollouts else pd.DataFrame()}
        if not self.routing.empty:
            out["routing"] = self.routing
        return out

    def table(self, section: str = "knob") -> pd.DataFrame:
        """One row per knob (or version): verdict, mismatch with intervals, change vs baseline, price."""
        rows = []
        for _, s in self.status[self.status.section == section].iterrows():
            k, m = s.knob, self.metrics
            row = {"knob": k}
            if section == "version":
                row["vLLM"] = s.vllm_version or "–"
            if s.status != "ok":
                row["verdict"] = s.status  # the engine's error: in the conclusion and the status table
                rows.append(row)
                continue
            row["verdict"] = s.verdict
            for name in ("abs_dlogp_max", "k3_mean", "chi2_token", "ess_tis", "mult_prob_error"):
                row[name] = m[f"{k}/{name}"]
            if f"{k}/delta_k3_mean" in m:
                row["Δk3 vs baseline"] = m[f"{k}/delta_k3_mean"]
                row["same tokens"] = m[f"{k}/same_tokens_frac"]
            row["throughput ×"] = m.get(f"{k}/throughput_ratio", float("nan"))  # none for the baseline itself
            row["tok/s"] = m[f"{k}/tok_s"]
            rows.append(row)
        return pd.DataFrame(rows).set_index("knob") if rows else pd.DataFrame()

    def summary(self) -> pd.DataFrame:
        return self.table("knob")

    def conclusion(self) -> str:
        return conclusion(self.metrics, self.status, self.params)


def verdict(metrics: dict, group: str) -> str:
    if metrics[f"{group}/abs_dlogp_max"] <= FLOAT_FLOOR:
        return VERDICTS["floor"]
    ok, _ = health(metrics, group)
    return VERDICTS["healthy"] if ok else VERDICTS["unhealthy"]


def _status_row(section: str, name: str, preset: str, description: str) -> dict:
    """A row of the status table (`data/status.parquet`), before anything ran."""
    return {"section": section, "knob": name, "preset": preset, "description": description, "status": "ok",
            "error": "", "verdict": "", "not_verified": "", "vllm_version": "", "engine_start_s": float("nan")}


def _measure(name: str, preset: str, engine: EngineWorker | Exception, p, prompts, sampling, scorer, base_ro,
             section: str, description: str, on_start: OnStart, mets: dict, rollouts: dict, rows: list,
             launch_next: Callable[[], EngineWorker | Exception | None]) -> Rollouts | None:
    """Sample, score and time `preset`'s launched `engine` (`base.launch_engine`); a row in `rows` either way. Once the
    engine is ready, `launch_next()` starts the next plan entry's engine, whose start-up overlaps this one's
    sampling and scoring; it has finished starting (or failed to) before this engine's throughput is timed,
    so nothing else runs while the clock does."""
    row = _status_row(section, name, preset, description)
    try:
        if isinstance(engine, BaseException):
            raise engine
        with engine as w:
            w.wait_ready()
            launch_next()
            row["engine_start_s"] = w.start_s
            info = w.info()
            row["vllm_version"] = info.get("vllm_version") or ""
            if on_start:
                on_start(info)
            settings = info.get("settings") or {}
            missing = not_applied(w.preset.vllm_kwargs, settings, w.preset.fp32_lm_head, w.preset.env)
            if section == "knob" and name != BASELINE:
                row["not_verified"] = "; ".join(not_verified(*knob_changes(p.baseline, preset), settings))
            if missing:
                row.update(status="did not take effect", error="; ".join(missing))
                rows.append(row)
                return None
            ro = sample_and_score(w, scorer, prompts, sampling)
            bad = int(sum((~np.isfinite(c.logprobs)).sum() for c in ro.completions))
            if bad:  # the engine ran but its numbers are unusable: a finding, not a crash of the notebook
                n = sum(len(c.logprobs) for c in ro.completions)
                row.update(status="non-finite logprobs", error=f"{bad} of {n} sampled-token logprobs are NaN or "
                                                               f"infinite (the engine reports them as such)")
                rows.append(row)
                return None
            settle(launch_next())
            tp = throughput(w, prompts, sampling, p.throughput_repeats)
    except (EngineCrashed, EngineError, PresetError) as e:
        row.update(status="unsupported here", error=error_line(e))
        rows.append(row)
        return None
    m = {**knob_metrics(ro, base_ro, p.clip_eps, p.seed), **tp}
    mets.update(M.prefixed(name, m))
    row["verdict"] = verdict(mets, name)
    rollouts[name] = ro
    rows.append(row)
    return ro


def settle(engine: EngineWorker | Exception | None) -> None:
    """Let a launched engine finish starting (a failure is recorded when its turn comes)."""
    if isinstance(engine, EngineWorker):
        try:
            engine.wait_ready()
        except (EngineCrashed, EngineError):
            pass


def run(params, model_path, *, on_start: OnStart = None, progress: bool = True) -> KnobResult:
    """Baseline first, then each knob, then each version preset, then (with `moe`) the MoE router audit. On CPU
    the next entry's engine starts while the current one is measured (`base.prefetch_engines`)."""
    from rlwb.progress import progress_bar

    p = params
    codec = tokenizer.PromptCodec(model_path, p.chat_template)
    scorer = TrainerScorer(model_path, p.trainer_dtype)
    prompts = make_prompts(p.prompt_source, p.prompts, p.seed, codec)
    sampling = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens, seed=p.seed)
    catalog = load_knobs()
    plan = [("knob", BASELINE, p.baseline, f"`{p.baseline}` as it is")]
    plan += [("knob", k, knob_preset(p.baseline, k), catalog[k].get("description", "")) for k in p.knobs]
    plan += [("version", v, v, "") for v in p.versions]
    mets: dict = {}
    rollouts: dict = {}
    rows: list = []
    base_ro = None
    ahead = prefetch_engines()
    engine: EngineWorker | Exception | None = launch_engine(plan[0][2], model_path, p.dtype)
    launched: list = []
    bar = progress_bar(plan, desc="knobs", disable=not progress)
    try:
        for i, (section, name, preset, desc) in enumerate(bar):
            bar.set_postfix_str(name)
            if section == "version":
                desc = resolve_preset(preset).description
            following = plan[i + 1][2] if i + 1 < len(plan) else None
            launched = []  # the next entry's engine, once `_measure` has launched it

            def launch_next(following=following, launched=launched):
                if ahead and following is not None and not launched:
                    launched.append(launch_engine(following, model_path, p.dtype))
                return launched[0] if launched else None

            ro = _measure(name, preset, engine, p, prompts, sampling, scorer, None if name == BASELINE else base_ro,
                          section, desc, on_start, mets, rollouts, rows, launch_next)
            engine = launched[0] if launched else None
            if engine is None and following is not None:
                engine = launch_engine(following, model_path, p.dtype)
            if name == BASELINE:
                if ro is None:
                    raise EngineError(f"the baseline {p.baseline!r} did not run: {rows[-1]['error']}")
                base_ro = ro
    finally:  # an interrupt or a failed baseline: no engine outlives the loop
        for e in (engine, *launched):
            if isinstance(e, EngineWorker):
                e.close()
    base_tok_s = mets[f"{BASELINE}/tok_s"]
    for r in rows:  # the baseline has none: its ratio to itself would be 1 by construction
        if r["status"] == "ok" and r["knob"] != BASELINE:
            mets[f"{r['knob']}/throughput_ratio"] = mets[f"{r['knob']}/tok_s"] / base_tok_s
    routing = pd.DataFrame()
    if p.moe:
        routing = moe_audit(p, mets, rows, on_start, progress)
    return KnobResult(p, mets, rollouts, pd.DataFrame(rows), routing)


def knobs_table(baseline: str, knobs: list[str]) -> pd.DataFrame:
    """What each knob changes: its description and the preset settings that differ from the baseline's."""
    base, catalog, rows = resolve_preset(baseline), load_knobs(), []
    for k in knobs:
        p = resolve_preset(knob_preset(baseline, k))
        kwargs, env = knob_changes(baseline, p.name)
        diff = {**kwargs, **{f"env {n}": v for n, v in env.items()}}
        if p.fp32_lm_head != base.fp32_lm_head:
            diff["fp32_lm_head"] = p.fp32_lm_head
        rows.append({"knob": k, "what it changes": catalog[k].get("description", ""),
                     "settings vs the baseline": ", ".join(f"{n}={v}" for n, v in diff.items())})
    return pd.DataFrame(rows).set_index("knob")


def top_experts(logits: np.ndarray, top_k: int) -> np.ndarray:
    """[tokens, top_k] expert ids, best first (ties: the lower id, as torch.topk)."""
    return np.argsort(-logits, axis=1, kind="stable")[:, :top_k]


def routing_differs(engine_logits: np.ndarray, trainer_logits: np.ndarray, top_k: int) -> np.ndarray:
    """Per token: do engine and trainer pick different sets of top-k experts?"""
    e, t = top_experts(engine_logits, top_k), top_experts(trainer_logits, top_k)
    return np.any(np.sort(e, axis=1) != np.sort(t, axis=1), axis=1)


def router_agreement(engine_logits: np.ndarray, trainer_logits: np.ndarray, top_k: int) -> dict[str, float]:
    """Per token, does the engine's router choose what the trainer's does? `topk_set_agree`: the same set of
    top-k experts; `top1_agree`: the same first choice; `margin_p10`: 10th percentile of the trainer's gap
    between its k-th and (k+1)-th logit (small: a close call that numerics can flip)."""
    e, t = top_experts(engine_logits, top_k), top_experts(trainer_logits, top_k)
    same_set = ~routing_differs(engine_logits, trainer_logits, top_k)
    srt = -np.sort(-trainer_logits, axis=1)
    margin = srt[:, top_k - 1] - srt[:, top_k] if trainer_logits.shape[1] > top_k else np.full(len(t), np.inf)
    return {"topk_set_agree": float(same_set.mean()), "top1_agree": float((e[:, 0] == t[:, 0]).mean()),
            "margin_p10": float(np.quantile(margin, 0.1)), "n_tokens": int(len(t))}


def moe_audit(p, mets: dict, rows: list, on_start: OnStart, progress: bool) -> pd.DataFrame:
    """Sample `moe_prompts` prompts one request at a time from the baseline (and each `moe_knobs` knob) on the
    MoE model, record the engine's router logits while it decodes, and compare each layer's top-k choice with
    the fp32 trainer's router on the same tokens. Also the MoE model's logprob mismatch (`moe/<knob>/...`)."""
    import torch

    from rlwb.core.models.store import resolve_model
    from rlwb.progress import progress_bar

    path = resolve_model(p.moe_model, progress=progress)
    scorer = TrainerScorer(path, p.trainer_dtype)
    top_k = int(scorer.model.config.num_experts_per_tok)
    codec = tokenizer.PromptCodec(path, p.chat_template)
    prompts = make_prompts(p.prompt_source, p.moe_prompts, p.seed, codec)
    sampling = Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens, seed=p.seed)
    out = []
    for knob in progress_bar([BASELINE, *p.moe_knobs], desc="MoE router", disable=not progress):
        name = f"moe/{knob}"
        row = _status_row("moe", name, knob_preset(p.baseline, knob),
                          f"{p.moe_model}: router agreement engine vs trainer")
        try:
            with EngineWorker(row["preset"], path, dtype=p.dtype) as w:
                if on_start:
                    on_start(w.info())
                if w.record_routing(True) == 0:
                    raise EngineError(f"{p.moe_model} has no router this engine could hook")
                comps, routes = [], []
                for i, prompt in enumerate(prompts):  # one at a time: the recorded rows are this request's
                    s = Sampling(**{**sampling.__dict__, "seed": sampling.seed + i})
                    comps += w.generate([prompt], s)
                    routes.append(w.take_routing())
        except (EngineCrashed, EngineError, PresetError) as e:
            row.update(status="unsupported here", error=error_line(e))
            rows.append(row)
            continue
        rows.append(row)
        s = scorer.score([c.prompt_token_ids for c in comps], [c.token_ids for c in comps],
                         temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
        ro = Rollouts(row["preset"], sampling, comps, s["logp"])
        e, t = ro.flat()
        mets.update(M.prefixed(name, M.mismatch_metrics(e, t, seq_ids=ro.seq_ids(), clip_eps=p.clip_eps)))
        per_layer: dict[int, tuple[list, list]] = {}
        for c, r in zip(comps, routes):
            ids = torch.tensor([c.prompt_token_ids + c.token_ids])
            with torch.no_grad():
                tl = scorer.model(ids.to(scorer.device), output_router_logits=True).router_logits
            for layer, el in r.items():
                n = len(c.prompt_token_ids) + len(c.token_ids) - 1  # the last token is sampled, never forwarded
                if el.shape[0] != n:
                    raise EngineError(f"router rows {el.shape[0]} != prompt + completion - 1 = {n} "
                                      f"(layer {layer}): the engine batched or re-ran this request")
                per_layer.setdefault(layer, ([], []))
                per_layer[layer][0].append(el)
                per_layer[layer][1].append(tl[layer][:n].float().cpu().numpy())
        agree = []
        for layer, (el, tl) in sorted(per_layer.items()):
            a = router_agreement(np.concatenate(el), np.concatenate(tl), top_k)
            out.append({"knob": knob, "layer": layer, **a})
            agree.append(a)
            mets.update({f"{name}/layer{layer}_{k}": v for k, v in a.items() if k != "n_tokens"})
        mets[f"{name}/topk_set_agree"] = float(np.mean([a["topk_set_agree"] for a in agree]))
        mets[f"{name}/top1_agree"] = float(np.mean([a["top1_agree"] for a in agree]))
        flips = [routing_differs(np.concatenate(el), np.concatenate(tl), top_k) for el, tl in per_layer.values()]
        mets[f"{name}/any_layer_differs_frac"] = float(np.any(flips, axis=0).mean()) if flips else float("nan")
    return pd.DataFrame(out)


def conclusion(metrics: dict, status: pd.DataFrame, p) -> str:
    """The answer in Markdown (`wording.engine_knobs`); every number from `metrics`. Here: which knobs ran, which
    stay at the float floor, the others worst first with the health rules they fail, what did not run."""
    m = metrics
    ok = status[(status.section == "knob") & (status.status == "ok") & (status.knob != BASELINE)]
    bad = status[(status.section == "knob") & (status.status != "ok")]
    floor = [k for k in ok.knob if m[f"{k}/abs_dlogp_max"] <= FLOAT_FLOOR]
    moved = sorted((k for k in ok.knob if k not in floor), key=lambda k: -m[f"{k}/k3_mean"])
    unverified = ok[ok.not_verified != ""] if "not_verified" in ok else ok.iloc[:0]
    versions = status[status.section == "version"]
    setup = {"run": {"baseline": p.baseline, "model": p.model, "prompts": p.prompts,
                     "prompt_source": p.prompt_source, "temperature": p.temperature, "max_tokens": p.max_tokens,
                     "trainer_dtype": p.trainer_dtype, "baseline_abs_dlogp_max": m[f"{BASELINE}/abs_dlogp_max"],
                     "baseline_tok_s": m[f"{BASELINE}/tok_s"]},
             "float_floor": FLOAT_FLOOR, "floor": {k: m[f"{k}/throughput_ratio"] for k in floor},
             "failed": {k: health(m, k)[1] for k in moved},
             "not_run": {name: {r.knob: r.error for r in rows.itertuples()}
                         for name, rows in bad.groupby("status", sort=False)},
             "unverified": {r.knob: r.not_verified for r in unverified.itertuples()},
             "versions": [{"knob": r.knob, "status": r.status, "vllm_version": getattr(r, "vllm_version", None),
                           "error": getattr(r, "error", None)} for r in versions.itertuples()],
             "moe_model": p.moe_model,
             "moe": [k for k in status.knob if str(k).startswith("moe/") and f"{k}/topk_set_agree" in m]}
    return wording_06.conclusion(m, setup)
