"""A toy GRPO loop whose rollouts come from a real engine worker, with in-flight weight sync.

Each step: sample prompts x group from the engine -> verifiable rewards -> group-normalised advantages ->
trainer recomputes old logprobs (for mismatch logging and corrections) -> token-level clipped loss ->
optimizer step -> `update_weights` into the running engine (prefix cache reset or not, as its preset says).

`old_logprobs="engine"` uses the engine's reported logprobs as the behaviour policy (PipelineRL style):
any engine/trainer mismatch then enters the PPO ratio directly. `"trainer"` recomputes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from . import losses, stats, tasks, tokenizer
from . import metrics as M
from .engines.worker import EngineWorker, Sampling
from .trainer import completion_logprobs, make_batch

LEARNING_MIN_GAIN = 0.15  # reward_last - reward_first the correct configuration must reach (notebook 03)
CURVE_COLUMNS = ["step", "engine", "correction", "seed", "reward_mean", "reversed_frac", "clip_frac", "mismatch_k3",
                 "abs_dlogp_mean", "entropy", "grad_norm", "t_rollout", "t_score", "t_update", "t_sync"]


@dataclass
class GRPOConfig:
    steps: int = 50
    prompts_per_step: int = 8
    group_size: int = 8
    lr: float = 1.5e-4
    temperature: float = 0.7
    max_tokens: int = 32
    clip_eps: float = 0.2
    beta: float = 0.0
    old_logprobs: str = "engine"  # engine | trainer
    correction: str = "none"  # none | tis | mis | seq_mask
    tis_cap: float = 2.0
    mask_lo: float = 0.5
    mask_hi: float = 2.0
    seed: int = 0
    max_grad_norm: float = 1.0
    max_digits: int = 3  # operand size of the training prompts
    micro_batch: int = 0  # sequences per forward/backward of the update (gradient accumulation); 0 = all at once


def _pad(rows: list[np.ndarray], width: int, fill: float = 0.0) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=torch.float32)
    return out


def _per_seq(flat: torch.Tensor, lengths: list[int], width: int) -> torch.Tensor:
    """Flat completion-token tensor -> [B, width] (zeros beyond each length), keeping grad."""
    out, s = [], 0
    for n in lengths:
        out.append(torch.nn.functional.pad(flat[s: s + n], (0, width - n)))
        s += n
    return torch.stack(out)


def _is_reversed(problem: tasks.Problem, text: str) -> bool:
    """The completion shows the SFT habit: its answer is the sum reversed (palindromic sums excluded)."""
    digits = str(problem.answer)
    return digits != digits[::-1] and tasks.parse_answer(text) == int(digits[::-1])


@dataclass
class StepResult:
    row: dict
    batch: dict = field(default_factory=dict)  # the step's rollouts, for post-mortems (drift monitor)


def _rows(t: torch.Tensor | None, sl: slice) -> torch.Tensor | None:
    return None if t is None or t.dim() == 0 else t[sl]


def accumulate_policy_gradient(model: torch.nn.Module, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                               cfg: GRPOConfig, behaviour: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                               weights: torch.Tensor | None = None, keep: torch.Tensor | None = None,
                               ref: torch.Tensor | None = None) -> losses.LossStats:
    """Backpropagate the GRPO loss of the whole batch into `model`'s .grad, `cfg.micro_batch` sequences per
    forward/backward (0: all at once), and return the whole batch's loss statistics.

    Why it equals the unsplit gradient: the loss is a sum over the batch's kept tokens divided by their
    count, so each micro-batch contributes its own token sum divided by the *whole batch's* count; the
    gradients add up to the full-batch gradient (to float reassociation). A real model's 256 x 512-token
    batch does not fit one forward/backward on a GPU; the toy one does, so 0 stays the CPU default."""
    lengths = [len(c) for c in completion_ids]
    width = mask.shape[1]
    n_seq = len(completion_ids)
    step = cfg.micro_batch if cfg.micro_batch > 0 else n_seq
    kept = mask.bool() if keep is None else mask.bool() & keep.bool()
    total = kept.sum().clamp(min=1)
    cur_parts = []
    for s in range(0, n_seq, step):
        sl = slice(s, min(s + step, n_seq))
        sub = make_batch(prompt_ids[sl], completion_ids[sl])
        cur = _per_seq(completion_logprobs(model, sub, cfg.temperature)["logp"], lengths[sl], width)
        part, _ = losses.grpo_loss(cur, behaviour[sl], adv[sl], mask[sl], cfg.clip_eps, _rows(weights, sl),
                                   _rows(keep, sl), _rows(ref, sl), cfg.beta)
        n_part = (kept[sl]).sum()
        (part * n_part.clamp(min=1) / total).backward()  # token-sum of this slice over the batch's count
        cur_parts.append(cur.detach())
    with torch.no_grad():  # statistics over the whole batch, as if it had been one forward pass
        _, st = losses.grpo_loss(torch.cat(cur_parts), behaviour, adv, mask, cfg.clip_eps, weights, keep, ref,
                                 cfg.beta)
    return st


def grpo_step(step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, engine: EngineWorker, cfg: GRPOConfig,
              ref_model: torch.nn.Module | None = None, codec: tokenizer.PromptCodec | None = None) -> StepResult:
    codec = codec or tokenizer.PromptCodec()
    t0 = time.perf_counter()
    problems = tasks.make_problems(cfg.prompts_per_step, seed=cfg.seed * 1_000_003 + step, max_digits=cfg.max_digits)
    prompts = [codec.encode(p.prompt) for p in problems for _ in range(cfg.group_size)]
    sampling = Sampling(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed * 10_000_019 + step * 1000)
    comps = engine.generate(prompts, sampling)
    texts = [codec.decode(c.token_ids) for c in comps]
    rewards = torch.tensor([tasks.reward(problems[i // cfg.group_size], t) for i, t in enumerate(texts)])
    reversed_frac = float(np.mean([_is_reversed(problems[i // cfg.group_size], t) for i, t in enumerate(texts)]))
    t1 = time.perf_counter()

    dev = next(model.parameters()).device
    batch = make_batch([c.prompt_token_ids for c in comps], [c.token_ids for c in comps])
    lengths = batch.completion_lens
    width = max(lengths)
    mask = _pad([np.ones(n) for n in lengths], width).bool().to(dev)
    logp_engine = _pad([c.logprobs for c in comps], width).to(dev)
    with torch.no_grad():
        old = completion_logprobs(model, batch, cfg.temperature, entropy=True)
    logp_trainer_old = _per_seq(old["logp"], lengths, width)
    adv = losses.group_advantages(rewards, cfg.group_size).to(dev)
    e_flat, t_flat = logp_engine[mask].double().cpu().numpy(), logp_trainer_old[mask].double().cpu().numpy()
    mm = M.mismatch_metrics(e_flat, t_flat)
    t2 = time.perf_counter()

    behaviour = logp_engine if cfg.old_logprobs == "engine" else logp_trainer_old
    weights, keep = losses.correction_terms(cfg.correction, logp_trainer_old, logp_engine, mask, cfg.tis_cap,
                                            cfg.mask_lo, cfg.mask_hi)
    ref = None
    if ref_model is not None and cfg.beta:
        with torch.no_grad():
            ref = _per_seq(completion_logprobs(ref_model, batch, cfg.temperature)["logp"], lengths, width)
    opt.zero_grad(set_to_none=True)
    st = accumulate_policy_gradient(model, [c.prompt_token_ids for c in comps], [c.token_ids for c in comps], cfg,
                                    behaviour, adv, mask, weights, keep, ref)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
    opt.step()
    t3 = time.perf_counter()

    engine.update_weights(model.state_dict())  # moved to CPU and written to shared memory by the worker client
    t4 = time.perf_counter()
    row = {"step": step, "reward_mean": float(rewards.mean()), "reversed_frac": reversed_frac,
           "clip_frac": st.clip_frac,
           "mismatch_k3": mm["k3_mean"], "abs_dlogp_mean": mm["abs_dlogp_mean"],
           "entropy": float(old["entropy"].mean()), "grad_norm": grad_norm, "loss": st.loss,
           "kept_frac": st.kept_frac, "completion_tokens": float(np.mean(lengths)),
           "t_rollout": t1 - t0, "t_score": t2 - t1, "t_update": t3 - t2, "t_sync": t4 - t3, "t_step": t4 - t0}
    batch_record = {"prompt_token_ids": [c.prompt_token_ids for c in comps], "token_ids": [c.token_ids for c in comps],
                    "logp_engine": [c.logprobs for c in comps],
                    "logp_trainer": [x.cpu().numpy() for x in old["logp"].split(lengths)], "reward": rewards.numpy()}
    return StepResult(row, batch_record)


def train(model: torch.nn.Module, engine: EngineWorker, cfg: GRPOConfig, initial_state: dict | None = None,
          monitor=None, progress: bool = True, desc: str = "grpo", on_step=None,
          codec: tokenizer.PromptCodec | None = None) -> pd.DataFrame:
    """Run `cfg.steps` GRPO steps from `initial_state` (weights are loaded into the trainer *and* the engine
    first, so every run starts from the same policy). Returns one row per step."""
    from .progress import progress_bar

    torch.manual_seed(cfg.seed)
    if initial_state is not None:
        model.load_state_dict(initial_state)
        engine.update_weights(initial_state)
        engine.reset_prefix_cache()
    ref_model = None
    if cfg.beta:
        import copy

        ref_model = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    rows = []
    bar = progress_bar(range(cfg.steps), desc=desc, disable=not progress, leave=False)
    for step in bar:
        res = grpo_step(step, model, opt, engine, cfg, ref_model, codec)
        rows.append(res.row)
        bar.set_postfix(reward=f"{res.row['reward_mean']:.2f}", k3=f"{res.row['mismatch_k3']:.1e}")
        if on_step:
            on_step(res)
        if monitor is not None:
            monitor.update(res.row, res.batch)
    return pd.DataFrame(rows)


# -- notebook 03: every engine x correction x seed from the same initial weights ---------------------
def trainer_device() -> str:
    """The trainer runs on the GPU when there is one (engines manage their own devices)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def config_from_params(p, correction: str, seed: int) -> GRPOConfig:
    return GRPOConfig(steps=p.steps, prompts_per_step=p.prompts_per_step, group_size=p.group_size, lr=p.lr,
                      temperature=p.temperature, max_tokens=p.max_tokens, clip_eps=p.clip_eps,
                      old_logprobs=p.old_logprobs, correction=correction, tis_cap=p.tis_cap, seed=seed,
                      micro_batch=p.micro_batch)


DRIFT_WINDOW, DRIFT_PATIENCE = 2, 2  # notebook 03's drift monitor: 2-step windows, 2 in a row above


def drift_monitor_factory(threshold: float, save_dir=None):
    """Monitors that record (never stop) a trip per run, saving the offending batch under `save_dir`."""
    from .monitor import DriftMonitor

    def make(engine: str, correction: str, seed: int) -> DriftMonitor:
        return DriftMonitor(threshold, DRIFT_WINDOW, DRIFT_PATIENCE, raise_on_trip=False, save_dir=save_dir,
                            name=f"drift_{engine}+{correction}_seed{seed}")
    return make


def run_grid(p, model_path, on_start=None, progress: bool = True, monitor_factory=None,
             drift_dir=None) -> pd.DataFrame:
    """`data/curves.parquet`: one row per (engine, correction, seed, step). Each engine starts once; every
    run reloads the initial weights into the trainer and (in flight) into the engine. With
    `p.drift_threshold` > 0 every run has a drift monitor; `drift_trip_step` records where it tripped."""
    from transformers import AutoModelForCausalLM

    from .mismatch import iter_engines

    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).to(trainer_device())
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    frames = []
    if monitor_factory is None and getattr(p, "drift_threshold", 0) > 0:
        monitor_factory = drift_monitor_factory(p.drift_threshold, drift_dir)
    for w in iter_engines(p.engines, model_path, p.dtype, progress, on_start):
        for corr in p.corrections:
            for seed in p.seeds:
                monitor = monitor_factory(w.preset.name, corr, seed) if monitor_factory else None
                df = train(model, w, config_from_params(p, corr, seed), initial, monitor=monitor, progress=progress,
                           desc=f"{w.preset.name}+{corr} seed {seed}", codec=tokenizer.PromptCodec(model_path))
                df.insert(1, "engine", w.preset.name)
                df.insert(2, "correction", corr)
                df.insert(3, "seed", seed)
                df["drift_trip_step"] = np.nan if monitor is None or monitor.trip_step is None else monitor.trip_step
                frames.append(df)
    return pd.concat(frames, ignore_index=True)


def curve_metrics(curves: pd.DataFrame) -> dict[str, float]:
    """Per `<engine>+<correction>`, means over seeds: reward over the first / last 10% of steps (with 95%
    Student-t intervals across seeds), clip fraction, engine-trainer k3 and seconds per step."""
    out = {}
    for (e, c), d in curves.groupby(["engine", "correction"], sort=False):
        steps = sorted(d["step"].unique())
        k = max(1, round(0.1 * len(steps)))
        first, last = d[d["step"].isin(steps[:k])], d[d["step"].isin(steps[-k:])]
        L = f"{e}+{c}"
        per_seed = {}
        for name, window in (("reward_first", first), ("reward_last", last)):
            per_seed[name] = window.groupby("seed")["reward_mean"].mean()
            out[f"{L}/{name}"] = float(per_seed[name].mean())
            out[f"{L}/{name}_ci_low"], out[f"{L}/{name}_ci_high"] = stats.seed_ci(per_seed[name].to_numpy())
        gain = (per_seed["reward_last"] - per_seed["reward_first"]).to_numpy()  # paired within each seed
        out[f"{L}/reward_gain"] = float(gain.mean())
        out[f"{L}/reward_gain_ci_low"], out[f"{L}/reward_gain_ci_high"] = stats.seed_ci(gain)
        out[f"{L}/clip_frac_mean"] = float(d["clip_frac"].mean())
        out[f"{L}/mismatch_k3_mean"] = float(d["mismatch_k3"].mean())
        out[f"{L}/step_s_mean"] = float(d[["t_rollout", "t_score", "t_update", "t_sync"]].sum(axis=1).mean())
        if "drift_trip_step" in d:
            trips = d.groupby("seed")["drift_trip_step"].first()
            out[f"{L}/drift_trip_frac"] = float(trips.notna().mean())
            out[f"{L}/drift_trip_step_mean"] = float(trips.mean()) if trips.notna().any() else float("nan")
    return out


def conclusion(metrics: dict, p) -> str:
    lines = [f"**Setup.** {p.steps} steps × {p.prompts_per_step} prompts × {p.group_size} completions, "
             f"T={p.temperature:g}, lr={p.lr:g}, old logprobs from the {p.old_logprobs}, {p.num_seeds} seeds "
             f"(means over seeds; first/last = first/last 10% of steps)."]
    for e in p.engines:
        for c in p.corrections:
            L = f"{e}+{c}"
            if f"{L}/reward_first" not in metrics:
                continue
            a, b = metrics[f"{L}/reward_first"], metrics[f"{L}/reward_last"]
            lo, hi = metrics.get(f"{L}/reward_last_ci_low"), metrics.get(f"{L}/reward_last_ci_high")
            ci = f" [95% CI {lo:.3f}, {hi:.3f}]" if lo is not None and np.isfinite(lo) else ""
            lines.append(f"- `{L}`: reward {a:.3f} → {b:.3f}{ci} ({b - a:+.3f}); clip fraction "
                         f"{metrics[f'{L}/clip_frac_mean']:.1%}; engine-trainer k3 {metrics[f'{L}/mismatch_k3_mean']:.1e}; "
                         f"{metrics[f'{L}/step_s_mean']:.2f} s/step.")
    deltas = {k.rsplit("/", 1)[0]: metrics[k.replace("reward_first", "reward_last")] - metrics[k]
              for k in metrics if k.endswith("/reward_first")}
    ref = "vllm-v1-fixed+none"
    if ref in deltas:
        verdict = "learns" if deltas[ref] >= LEARNING_MIN_GAIN else "does NOT learn"
        lo, hi = metrics.get(f"{ref}/reward_gain_ci_low"), metrics.get(f"{ref}/reward_gain_ci_high")
        ci = f" [95% CI over seeds {lo:+.3f}, {hi:+.3f}]" if lo is not None and np.isfinite(lo) else ""
        lines.append(f"\n**Learning check.** The correct configuration `{ref}` {verdict} on this budget: reward "
                     f"{deltas[ref]:+.3f}{ci} (criterion: ≥ {LEARNING_MIN_GAIN:+.2f}).")
    others = {k: v for k, v in deltas.items() if k != ref}
    if ref in deltas and others:
        worst = min(others, key=others.get)
        lines.append(f"Smallest gain elsewhere: `{worst}` {others[worst]:+.3f}, {others[worst] - deltas[ref]:+.3f} "
                     f"relative to `{ref}`.")
    if getattr(p, "drift_threshold", 0) > 0:
        tripped = [f"`{L}` ({metrics[f'{L}/drift_trip_frac']:.0%} of seeds, at step "
                   f"{metrics[f'{L}/drift_trip_step_mean']:.0f} on average)" for L in deltas
                   if (metrics.get(f"{L}/drift_trip_frac") or 0) > 0]
        quiet = [f"`{L}`" for L in deltas if metrics.get(f"{L}/drift_trip_frac") == 0]
        lines.append(f"\n**Drift monitor** (engine-trainer k3 above {p.drift_threshold:g} in {DRIFT_PATIENCE} "
                     f"consecutive {DRIFT_WINDOW}-step windows): tripped on " + (", ".join(tripped) or "none")
                     + "; quiet on " + (", ".join(quiet) or "none") + ".")
    if deltas and max(deltas.values()) < 0.05:
        lines.append(f"\nNo configuration improved its reward by 0.05 or more within {p.steps} steps (best: "
                     f"{max(deltas.values()):+.3f}).")
    return "\n".join(lines)
