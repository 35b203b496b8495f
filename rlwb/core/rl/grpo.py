"""A toy GRPO loop whose rollouts come from a real engine worker, with in-flight weight sync.

Each step: sample prompts x group from the engine -> verifiable rewards -> group-normalised advantages ->
trainer recomputes old logprobs (for mismatch logging and corrections) -> token-level clipped loss ->
optimizer step -> `update_weights` into the running engine (prefix cache reset or not, as its preset says).

`old_logprobs="engine"` uses the engine's reported logprobs as the behaviour policy (PipelineRL style, verl's
bypass mode): any engine/trainer mismatch then enters the PPO ratio directly, and only corrections that reject
tokens or sequences are defined (a weight pi_trainer/pi_engine would apply the ratio twice:
`correction_catalog.check_modes`). `"trainer"` recomputes them (the decoupled mode every correction is defined in).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch

from rlwb import timing
from rlwb.core.data import tasks, tokenizer
from rlwb.core.measure import metrics as M
from rlwb.core.rl import corrections, losses, mismatch_doses
from rlwb.core.rl.correction_catalog import HEALTH, check_modes
from rlwb.core.rl.grpo_config import GRPOConfig, sampling_seed, step_problem_seed
from rlwb.core.scoring.trainer import batch_logprobs, completion_logprobs, make_batch
from rlwb.engines.worker import EngineWorker, Sampling

CURVE_COLUMNS = ["step", "engine", "correction", "seed", "reward_mean", "reversed_frac", "clip_frac", "mismatch_k3",
                 "mismatch_k1", "abs_dlogp_mean", "entropy", "grad_norm", *HEALTH, "t_rollout", "t_score", "t_update",
                 "t_sync", "t_correction"]


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


@dataclass
class StepResult:
    row: dict
    batch: dict = field(default_factory=dict)  # the step's rollouts, for post-mortems (mismatch breaker)


def _rows(t: torch.Tensor | None, sl: slice) -> torch.Tensor | None:
    return None if t is None or t.dim() == 0 else t[sl]


def splits_update(cfg: GRPOConfig, n_seq: int) -> bool:
    """Does the policy update run in several forward/backward passes (gradient accumulation)?"""
    return 0 < cfg.micro_batch < n_seq


def accumulate_policy_gradient(model: torch.nn.Module, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                               cfg: GRPOConfig, behaviour: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                               weights: torch.Tensor | None = None, keep: torch.Tensor | None = None,
                               ref: torch.Tensor | None = None, cur: torch.Tensor | None = None) -> losses.LossStats:
    """Backpropagate the GRPO loss of the whole batch into `model`'s .grad, `cfg.micro_batch` sequences per
    forward/backward (0: all at once), and return the whole batch's loss statistics.

    Why it equals the unsplit gradient: the loss is a sum over the batch's kept tokens divided by their
    count, so each micro-batch contributes its own token sum divided by the *whole batch's* count; the
    gradients add up to the full-batch gradient (to float reassociation). A real model's 256 x 512-token
    batch does not fit one forward/backward on a GPU; the toy one does, so 0 stays the CPU default.

    `cur`: the whole batch's [B, width] logprobs at the current weights, still attached to the graph, when the
    caller already ran that forward pass (an unsplit update: `grpo_step` scores the old logprobs with it)."""
    lengths = [len(c) for c in completion_ids]
    width = mask.shape[1]
    n_seq = len(completion_ids)
    step = cfg.micro_batch if splits_update(cfg, n_seq) else n_seq
    if cur is not None and step != n_seq:
        raise ValueError("precomputed logprobs serve an unsplit update only (micro_batch 0 or >= the batch)")
    kept = mask.bool() if keep is None else mask.bool() & keep.bool()
    total = kept.sum().clamp(min=1)
    cur_parts = []
    given = cur
    for s in range(0, n_seq, step):
        sl = slice(s, min(s + step, n_seq))
        if given is not None:
            cur = given
        else:
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
    return replace(st, passes=len(cur_parts))  # counted as they ran: what a GPU config's micro_batch really did


def kept_sequences(corr: corrections.Correction, mask: torch.Tensor) -> float:
    """How many of the batch's sequences keep at least one token in the loss after a correction's weights and masks:
    the survivors a sequence-level rejection (Geo-RS) leaves; the loss averages over their tokens only, so a step
    with one or two survivors moves Adam a full step on them."""
    live = ((corr.weights * corr.keep) != 0) & mask.bool()
    return float(live.any(-1).sum())


def policy_updates(model: torch.nn.Module, opt: torch.optim.Optimizer, prompt_ids: list[list[int]],
                   completion_ids: list[list[int]], cfg: GRPOConfig, behaviour: torch.Tensor, adv: torch.Tensor,
                   mask: torch.Tensor, weights: torch.Tensor | None = None, keep: torch.Tensor | None = None,
                   ref: torch.Tensor | None = None, cur: torch.Tensor | None = None) -> tuple[losses.LossStats, float]:
    """The step's policy update(s): `cfg.ppo_epochs` passes over the rollout batch, each cut into
    `cfg.updates_per_batch` contiguous mini-batches (whole GRPO groups when the count divides the prompts), one
    optimizer step each, in order: updates_per_batch x ppo_epochs steps (PPO's several updates per batch; Schulman et
    al. 2017, https://arxiv.org/abs/1707.06347). Every pass takes the same mini-batches in the same order, as verl
    does by default (verl/utils/tensordict_utils.py `make_iterator`: `epochs` passes of a DataLoader over the batch,
    its `shuffle` False by default, verl/workers/config/actor.py; ppo_epochs x ppo_mini_batch_size,
    verl/trainer/ppo/ray_trainer.py), so nothing random enters and a seed's arms see the same sequence of
    mini-batches. The advantages, behaviour logprobs and a correction's weights/masks are the batch's, computed once
    before any update. Returns the loss statistics over every update of every epoch (token-weighted), with the last
    optimizer step's clip fraction and |log ratio| (`last_*`), and the mean pre-clip gradient norm.

    Why several: with one update the decoupled ratio pi_theta / pi_old is exactly 1 (old = the same weights), so
    PPO's clip acts only when the engine's logprobs are the denominator (bypass); from the second update on the
    weights have moved and the clip acts in both modes; from the second epoch on an update sees tokens the weights
    were already trained on, where the ratio moves most."""
    n_seq = len(completion_ids)
    if cfg.single_update:
        st = accumulate_policy_gradient(model, prompt_ids, completion_ids, cfg, behaviour, adv, mask, weights, keep,
                                        ref, cur=cur)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
        opt.step()
        return replace(st, last_clip_frac=st.clip_frac, last_ratio_abs_log_mean=st.ratio_abs_log_mean), grad_norm
    if cur is not None:
        raise ValueError("precomputed logprobs serve a single update only (updates_per_batch 1, ppo_epochs 1)")
    splits = [slice(int(idx[0]), int(idx[-1]) + 1) for idx in np.array_split(np.arange(n_seq), cfg.updates_per_batch)]
    parts, norms = [], []
    for _epoch in range(cfg.ppo_epochs):  # the same mini-batches, in the same order, every pass
        for sl in splits:
            opt.zero_grad(set_to_none=True)
            sub = [_rows(t, sl) for t in (behaviour, adv, mask, weights, keep, ref)]
            width = int(sub[2].sum(1).max())  # the mini-batch's own longest completion
            b, a, m, w, kp, r = (None if t is None else t[:, :width] if t.dim() == 2 else t for t in sub)
            st = accumulate_policy_gradient(model, prompt_ids[sl], completion_ids[sl], cfg, b, a, m, w, kp, r)
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)))
            opt.step()
            parts.append((st, float((m.bool() if kp is None else m.bool() & kp.bool()).sum()), float(m.sum())))
    kept = sum(p[1] for p in parts)

    def avg(f):  # token-weighted over the updates, as one pass over the batch per epoch would weigh them
        return sum(getattr(s, f) * n for s, n, _ in parts) / max(kept, 1.0)

    last = parts[-1][0]
    st = losses.LossStats(loss=avg("loss"), clip_frac=avg("clip_frac"), ratio_mean=avg("ratio_mean"),
                          kept_frac=kept / max(sum(p[2] for p in parts), 1.0), kl_ref=avg("kl_ref"),
                          passes=sum(s.passes for s, _, _ in parts), ratio_abs_log_mean=avg("ratio_abs_log_mean"),
                          last_clip_frac=last.clip_frac, last_ratio_abs_log_mean=last.ratio_abs_log_mean)
    return st, float(np.mean(norms))


def rescorer(model: torch.nn.Module, batch, temperature: float, own: torch.Tensor) -> Callable[[float], torch.Tensor]:
    """A dose's `trainer_logp` (`mismatch_doses.Dose.reported`): the trainer's logprobs of `batch`'s completion
    tokens ([B, L] as `own`) with its logits scaled by `a` before `temperature`, log_softmax(a z / T): `own` (the
    old logprobs the step computed) at a = 1, one more no-grad forward pass at T / a otherwise, run only when a
    dose asks for it."""
    def trainer_logp(scale: float) -> torch.Tensor:
        if scale == 1:
            return own
        with torch.no_grad(), timing.phase("scoring"):
            return _per_seq(batch_logprobs(model, batch, temperature / scale)["logp"], batch.completion_lens,
                            own.shape[1])

    return trainer_logp


def grpo_step(step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, engine: EngineWorker, cfg: GRPOConfig,
              ref_model: torch.nn.Module | None = None, codec: tokenizer.PromptCodec | None = None,
              dose: mismatch_doses.Dose | None = None) -> StepResult:
    codec = codec or tokenizer.PromptCodec()
    dose = dose or mismatch_doses.Dose()
    t0 = time.perf_counter()
    problems = tasks.make_problems(cfg.prompts_per_step, seed=step_problem_seed(cfg.seed, step),
                                  max_digits=cfg.max_digits)
    prompts = [codec.encode_task(p) for p in problems for _ in range(cfg.group_size)]
    sampling = Sampling(temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                        seed=sampling_seed(cfg.seed, step, cfg.sampling_stream))
    comps = engine.generate(prompts, sampling, text=False)  # decoded here, by the codec: no engine-side text
    texts = [codec.decode(c.token_ids) for c in comps]
    rewards = torch.tensor([tasks.reward(problems[i // cfg.group_size], t) for i, t in enumerate(texts)])
    reversed_frac = float(np.mean([tasks.is_reversed(problems[i // cfg.group_size], t) for i, t in enumerate(texts)]))
    t1 = time.perf_counter()

    dev = next(model.parameters()).device
    batch = make_batch([c.prompt_token_ids for c in comps], [c.token_ids for c in comps])
    lengths = batch.completion_lens
    width = max(lengths)
    mask = _pad([np.ones(n) for n in lengths], width).bool().to(dev)
    logp_engine = _pad([c.logprobs for c in comps], width).to(dev)
    # The trainer's logprobs before the update. An unsplit update's forward pass is at these same weights, so
    # it is run once, with grad, and serves both (bitwise the same values as a separate no-grad pass: one
    # forward fewer per step); a micro-batched update needs them for the whole batch first, in their own pass,
    # cut into slices as the scorer cuts (a GPU's 256 x 768-token batch is not one forward; bitwise the same rows).
    shared = not splits_update(cfg, len(comps)) and cfg.single_update
    opt.zero_grad(set_to_none=True)  # nothing backpropagates before the update: one place for both paths
    with torch.set_grad_enabled(shared), timing.phase("training" if shared else "scoring"):
        old = (completion_logprobs if shared else batch_logprobs)(model, batch, cfg.temperature, entropy=True)
    logp = _per_seq(old["logp"], lengths, width)
    cur, logp_trainer_old = (logp, logp.detach()) if shared else (None, logp)
    # a dose on what the engine reports (mismatch_doses): what it reports is off, what it sampled is not
    logp_engine = dose.reported(logp_engine, mask, step, rescorer(model, batch, cfg.temperature, logp_trainer_old))
    adv = losses.group_advantages(rewards, cfg.group_size).to(dev)
    e_flat, t_flat = logp_engine[mask].double().cpu().numpy(), logp_trainer_old[mask].double().cpu().numpy()
    mm = M.mismatch_metrics(e_flat, t_flat, dosed=dose.reports)
    t2 = time.perf_counter()

    behaviour = logp_engine if cfg.old_logprobs == "engine" else logp_trainer_old
    tc = time.perf_counter()
    corr = corrections.apply(cfg.correction, logp_trainer_old - logp_engine, mask, adv, cfg.tis_cap)
    t_correction = time.perf_counter() - tc
    weights, keep = (None, None) if cfg.correction == "none" else (corr.weights, corr.keep)
    ref = None
    if ref_model is not None and cfg.beta:
        with torch.no_grad():
            ref = _per_seq(batch_logprobs(ref_model, batch, cfg.temperature)["logp"], lengths, width)
    with timing.phase("training"):
        st, grad_norm = policy_updates(model, opt, [c.prompt_token_ids for c in comps], [c.token_ids for c in comps],
                                       cfg, behaviour, adv, mask, weights, keep, ref, cur=cur)
    t3 = time.perf_counter()

    # moved to CPU and written to shared memory by the worker client; a distribution-mismatch dose changes what
    # the engine samples with (perturbed weights, or weights some updates behind); the trainer keeps the current,
    # clean weights
    engine.update_weights(dose.synced(model.state_dict()))
    t4 = time.perf_counter()
    row = {"step": step, "reward_mean": float(rewards.mean()), "reversed_frac": reversed_frac,
           "clip_frac": st.clip_frac, "ratio_mean": st.ratio_mean, "ratio_abs_log_mean": st.ratio_abs_log_mean,
           "updates_per_batch": cfg.updates_per_batch, "ppo_epochs": cfg.ppo_epochs,
           "last_clip_frac": st.last_clip_frac, "last_ratio_abs_log_mean": st.last_ratio_abs_log_mean,
           "mismatch_k3": mm["k3_mean"], "mismatch_k1": mm["k1_mean"], "abs_dlogp_mean": mm["abs_dlogp_mean"],
           "entropy": float(old["entropy"].mean()), "grad_norm": grad_norm, "loss": st.loss,
           **corrections.health(corr, mask),
           "kept_frac": st.kept_frac, "update_passes": st.passes, "kept_seqs": kept_sequences(corr, mask),
           "completion_tokens": float(np.mean(lengths)),
           "t_rollout": t1 - t0, "t_score": t2 - t1, "t_update": t3 - t2, "t_sync": t4 - t3,
           "t_correction": t_correction, "t_step": t4 - t0}
    batch_record = {"prompt_token_ids": [c.prompt_token_ids for c in comps], "token_ids": [c.token_ids for c in comps],
                    "logp_engine": [x.cpu().numpy() for x in logp_engine[mask].split(lengths)],  # as the update saw
                    "logp_trainer": [x.cpu().numpy() for x in old["logp"].detach().split(lengths)],
                    "reward": rewards.numpy()}
    return StepResult(row, batch_record)


def train(model: torch.nn.Module, engine: EngineWorker, cfg: GRPOConfig, initial_state: dict | None = None,
          monitor=None, progress: bool = True, desc: str = "grpo", on_step=None,
          codec: tokenizer.PromptCodec | None = None) -> pd.DataFrame:
    """Run `cfg.steps` GRPO steps from `initial_state` (weights are loaded into the trainer *and* the engine
    first, so every run starts from the same policy). Returns one row per step."""
    from rlwb.progress import progress_bar

    check_modes([cfg.correction], cfg.old_logprobs)  # a weighting correction on pi_theta/pi_engine: refused
    torch.manual_seed(cfg.seed)
    # the run's dose (none for a clean run), drawn from the initial weights: the same in every arm of a seed
    dose = mismatch_doses.start(cfg.dose_kind, cfg.dose, cfg.seed, initial_state or model.state_dict())
    if initial_state is not None:
        model.load_state_dict(initial_state)
        engine.update_weights(dose.initial(initial_state))
        engine.reset_prefix_cache()
    else:
        state = model.state_dict()
        if (first := dose.initial(state)) is not state:  # a dose that changes the engine's starting weights
            engine.update_weights(first)
    ref_model = None
    if cfg.beta:
        import copy

        ref_model = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    rows = []
    bar = progress_bar(range(cfg.steps), desc=desc, disable=not progress, leave=False)
    for step in bar:
        res = grpo_step(step, model, opt, engine, cfg, ref_model, codec, dose)
        rows.append(res.row)
        bar.set_postfix(reward=f"{res.row['reward_mean']:.2f}", k3=f"{res.row['mismatch_k3']:.1e}")
        if on_step:
            on_step(res)
        if monitor is not None:
            monitor.update(res.row, res.batch)
    return pd.DataFrame(rows)


def trainer_device() -> str:
    """The trainer runs on the GPU when there is one (engines manage their own devices)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
