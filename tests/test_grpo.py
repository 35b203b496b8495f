"""The GRPO loop against a real engine: weights really change inside the engine, in flight."""

import numpy as np
import pytest
import torch

from rlwb.core.rl import grpo, losses
from rlwb.core.scoring.trainer import completion_logprobs, make_batch

pytestmark = pytest.mark.engines


def test_grpo_steps_update_the_running_engine(engine, default_model):
    from transformers import AutoModelForCausalLM

    w = engine("vllm-v1-fixed")
    pid = w.pid
    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    before = w.weights_checksum()
    cfg = grpo.GRPOConfig(steps=2, prompts_per_step=4, group_size=4, lr=1e-3, max_tokens=16)
    try:
        curves = grpo.train(model, w, cfg, initial, progress=False)
        assert list(curves["step"]) == [0, 1]
        assert w.pid == pid, "no restart"
        assert w.weights_checksum() != pytest.approx(before, rel=1e-12)
        # the engine now samples from the trainer's new weights: processed logprobs match them
        res = grpo.grpo_step(2, model, torch.optim.SGD(model.parameters(), lr=0.0), w, cfg)
        assert res.row["abs_dlogp_mean"] < 1e-5
    finally:
        w.update_weights(initial)


def test_one_step_moves_logprobs_along_the_advantages(engine, default_model):
    from transformers import AutoModelForCausalLM

    w = engine("vllm-v1-fixed")
    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = grpo.GRPOConfig(prompts_per_step=8, group_size=8, lr=1e-4, seed=1)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        res = grpo.grpo_step(0, model, opt, w, cfg)
        b = res.batch
        lens = [len(t) for t in b["token_ids"]]
        with torch.no_grad():
            new = completion_logprobs(model, make_batch(b["prompt_token_ids"], b["token_ids"]), cfg.temperature)["logp"]
        d_seq = np.array([x.sum().item() for x in new.split(lens)]) - np.array([x.sum() for x in b["logp_trainer"]])
        adv = losses.group_advantages(torch.tensor(b["reward"]), cfg.group_size).numpy()
        assert (adv != 0).any(), "this seed's batch must carry a learning signal"
        assert float((adv * d_seq).sum()) > 0
    finally:
        w.update_weights(initial)


@pytest.mark.parametrize("correction", ["none", "tis", "seq_mask", "verl.seq_mis"])
def test_micro_batched_gradient_equals_the_unsplit_one(default_model, correction):
    """Gradient accumulation over micro-batches (uneven: 13 sequences in slices of 4) gives the whole batch's
    gradient and loss statistics to float tolerance, with and without corrections."""
    from rlwb.core.data import tasks, tokenizer
    from rlwb.core.rl import corrections
    from rlwb.core.scoring.trainer import TrainerScorer

    g = torch.Generator().manual_seed(0)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in tasks.make_problems(13, seed=3)]
    comps = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(4, 20, (13,), generator=g)]
    width = max(map(len, comps))
    mask = grpo._pad([np.ones(len(c)) for c in comps], width).bool()
    behaviour = grpo._pad([-torch.rand(len(c), generator=g).numpy() * 3 for c in comps], width)
    trainer_old = behaviour + grpo._pad([torch.randn(len(c), generator=g).numpy() * 0.3 for c in comps], width)
    adv = torch.randn(13, generator=g)
    c = corrections.apply(correction, trainer_old - behaviour, mask, adv)
    weights, keep = c.weights, c.keep
    grads, stats = {}, {}
    for micro in (0, 4):
        model = TrainerScorer(default_model.path).model.train()
        cfg = grpo.GRPOConfig(micro_batch=micro)
        stats[micro] = grpo.accumulate_policy_gradient(model, prompts, comps, cfg, behaviour, adv, mask, weights, keep)
        grads[micro] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[0].keys() == grads[4].keys() and len(grads[0]) > 10
    for n in grads[0]:
        torch.testing.assert_close(grads[4][n], grads[0][n], rtol=1e-4, atol=1e-7, msg=n)
    assert stats[4].loss == pytest.approx(stats[0].loss, rel=1e-5)
    assert stats[4].clip_frac == pytest.approx(stats[0].clip_frac) and stats[0].clip_frac > 0
    assert (stats[0].passes, stats[4].passes) == (1, 4)  # 13 sequences really went through in 4 passes


def test_shared_forward_gives_the_separate_passes_bitwise(default_model):
    """An unsplit update runs one forward pass with grad and reads the old logprobs and entropy from it
    (`grpo_step`): they must equal a separate no-grad scoring pass bit for bit, and the gradient from those
    precomputed logprobs must equal the one `accumulate_policy_gradient` gets from its own forward, or the
    shortcut would change every GRPO curve."""
    from rlwb.core.data import tasks, tokenizer
    from rlwb.core.rl import corrections
    from rlwb.core.scoring.trainer import TrainerScorer

    g = torch.Generator().manual_seed(1)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in tasks.make_problems(12, seed=5)]
    comps = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(3, 24, (12,), generator=g)]
    lengths, width = [len(c) for c in comps], max(map(len, comps))
    mask = grpo._pad([np.ones(n) for n in lengths], width).bool()
    engine_lp = grpo._pad([-torch.rand(n, generator=g).numpy() * 3 for n in lengths], width)
    adv = torch.randn(12, generator=g)
    cfg = grpo.GRPOConfig(temperature=0.7, correction="tis", old_logprobs="trainer")
    batch = make_batch(prompts, comps)
    grads, olds = {}, {}
    for shared in (False, True):
        model = TrainerScorer(default_model.path).model
        if shared:
            out = completion_logprobs(model, batch, cfg.temperature, entropy=True)
            cur = grpo._per_seq(out["logp"], lengths, width)
            old = cur.detach()
        else:
            with torch.no_grad():
                out = completion_logprobs(model, batch, cfg.temperature, entropy=True)
            cur, old = None, grpo._per_seq(out["logp"], lengths, width)
        c = corrections.apply(cfg.correction, old - engine_lp, mask, adv, cfg.tis_cap)
        st = grpo.accumulate_policy_gradient(model, prompts, comps, cfg, engine_lp, adv, mask, c.weights, c.keep,
                                             cur=cur)
        olds[shared] = (old, out["entropy"], st.loss, st.clip_frac)
        grads[shared] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert torch.equal(olds[True][0], olds[False][0]) and torch.equal(olds[True][1], olds[False][1])
    assert olds[True][2:] == olds[False][2:]
    assert grads[True].keys() == grads[False].keys() and len(grads[True]) > 10
    assert all(torch.equal(grads[True][n], grads[False][n]) for n in grads[True])
    with pytest.raises(ValueError, match="unsplit"):
        grpo.accumulate_policy_gradient(model, prompts, comps, grpo.GRPOConfig(micro_batch=4), engine_lp, adv, mask,
                                        cur=torch.zeros(12, width))


def test_concurrent_runs_train_the_curves_of_one_at_a_time(default_model):
    """Notebook 03's grid with two runs at once (two trainer copies, two engine processes of the preset, one
    thread each) must give every run bitwise the curve it has when the runs go one at a time: each run reloads
    the initial weights into its lane and draws from no shared random state. Only the wall-time columns may
    differ (and `concurrent_runs`, which says so). Three jobs on two lanes: a lane takes a second job, after
    another run on its engine."""
    from rlwb import params
    from rlwb.experiments.grpo_grid import train_grid

    curves = {}
    for lanes in (1, 2):
        p = params.load("03_toy_grpo", ["params/03_toy_grpo/smoke.yaml"],
                        {"num_seeds": 3, "corrections": ["none"], "drift_threshold": 0.0, "concurrent_runs": lanes})
        curves[lanes] = train_grid(p, default_model.path, progress=False)
    a, b = curves[1], curves[2]
    assert len(a) == 9 and list(a.columns) == list(b.columns)
    same = [c for c in a.columns if not c.startswith("t_") and c != "concurrent_runs"]
    assert a[same].equals(b[same]), a[same].compare(b[same])
    assert set(a["concurrent_runs"]) == {1} and set(b["concurrent_runs"]) == {2}  # what the t_* were measured under
    assert a["reward_mean"].nunique() > 1  # seeds really differ: the check compares distinct runs


def test_a_failing_lane_stops_the_others_and_raises():
    """`run_in_lanes`: the first error is raised in the caller and the other lane stops at its next check
    instead of finishing the remaining jobs (a GRPO run checks every step)."""
    import threading
    import time

    from rlwb.experiments.base import run_in_lanes

    done, started = [], threading.Event()

    def run(lane, job, should_stop):
        if job == "bad":
            started.wait(5)
            raise RuntimeError("lane failed")
        started.set()
        for _ in range(100):  # a long job: 10 s unless stopped
            should_stop()
            time.sleep(0.1)
        done.append(job)

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="lane failed"):
        run_in_lanes(["long", "bad", "never"], ["a", "b"], run)
    assert time.monotonic() - t0 < 5 and done == []
    assert run_in_lanes([1, 2, 3], ["only"], lambda lane, job, stop: (lane, job * 10)) == [
        ("only", 10), ("only", 20), ("only", 30)]


def test_runs_share_the_machine_only_beside_an_engine_that_leaves_cores(monkeypatch):
    """`lanes_for`: two runs at once beside a one-thread V1 engine; one at a time beside engines that take every
    core (V0, tensor parallel over both cores), where a second run only oversubscribes them."""
    from rlwb.engines.presets import resolve_preset
    from rlwb.experiments import grpo_grid

    monkeypatch.setattr(grpo_grid.os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setattr(grpo_grid, "cuda_available", lambda: False)
    got = {n: grpo_grid.lanes_for(resolve_preset(n, cuda=False), 2)
           for n in ("vllm-v1", "vllm-v1-fixed", "vllm-v1-fixed@kv-fp8-e5m2", "vllm-v0", "vllm-v1-fixed@tp2")}
    assert got == {"vllm-v1": 2, "vllm-v1-fixed": 2, "vllm-v1-fixed@kv-fp8-e5m2": 2, "vllm-v0": 1,
                   "vllm-v1-fixed@tp2": 1}
    assert grpo_grid.lanes_for(resolve_preset("vllm-v1-fixed", cuda=False), 1) == 1


def test_an_engine_that_leaves_its_float_floor_is_named_in_the_report():
    """`floor_breaches`: an engine that should sit at the float floor (fp32, processed logprobs, from its read-back
    settings) but measured per-step k3 above 1e-8 is named with its worst k3 (as V0 once did in an archived 03 run,
    1.5e-8 instead of 1.7e-13); engines at their floor, and engines not expected there (bf16, raw logprobs), are
    not."""
    import pandas as pd

    from rlwb.experiments.grpo_grid import floor_breaches
    from rlwb.experiments.wording import floor_lines

    curves = pd.DataFrame({"engine": ["vllm-v0"] * 3 + ["vllm-v1-fixed"] * 2 + ["vllm-v1-bf16"] * 2,
                           "seed": [0, 1, 1, 0, 1, 0, 1],
                           "mismatch_k3": [1.7e-13, 1.5e-8, 2e-13, 3e-13, 2e-13, 1e-5, 2e-5],
                           "engine_expects": ["float floor"] * 5 + ["low-precision band"] * 2})
    m = floor_breaches(curves)
    assert m == {"vllm-v0/floor_breach_k3": 1.5e-8}
    (line,) = floor_lines(m)
    assert "`vllm-v0`" in line and "1.5e-08" in line and "did not reproduce its float floor" in line
    assert floor_breaches(curves.drop(columns="engine_expects")) == {}


def test_several_updates_per_batch_move_the_decoupled_ratio_off_one(default_model):
    """`policy_updates` with the trainer's own logprobs as the behaviour policy (decoupled mode, no mismatch): one
    update per batch has the ratio exactly 1 on every token (the clip never acts, issue 46's point 7); three
    mini-batch updates do not (the weights moved after the first), and the clip then acts in the decoupled mode
    too. Each update is one optimizer step."""
    from rlwb.core.data import tasks, tokenizer
    from rlwb.core.scoring.trainer import TrainerScorer

    g = torch.Generator().manual_seed(2)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in tasks.make_problems(12, seed=7)]
    comps = [torch.randint(3, 60, (int(n),), generator=g).tolist() for n in torch.randint(3, 20, (12,), generator=g)]
    lengths, width = [len(c) for c in comps], max(map(len, comps))
    mask = grpo._pad([np.ones(n) for n in lengths], width).bool()
    adv = torch.randn(12, generator=g)
    out = {}
    for k in (1, 3):
        model = TrainerScorer(default_model.path).model.train()
        with torch.no_grad():
            old = grpo._per_seq(completion_logprobs(model, make_batch(prompts, comps), 0.7)["logp"], lengths, width)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        cfg = grpo.GRPOConfig(temperature=0.7, old_logprobs="trainer", updates_per_batch=k, prompts_per_step=3,
                              group_size=4)
        steps = []
        opt.register_step_post_hook(lambda *_: steps.append(1))
        out[k] = grpo.policy_updates(model, opt, prompts, comps, cfg, old, adv, mask)[0]
        assert len(steps) == k
    assert out[1].ratio_mean == 1.0 and out[1].ratio_abs_log_mean == 0.0 and out[1].clip_frac == 0.0
    assert out[3].ratio_abs_log_mean > 1e-3 and out[3].ratio_mean != 1.0 and out[3].clip_frac > 0
    assert out[3].passes == 3
    with pytest.raises(ValueError, match="updates_per_batch"):
        grpo.GRPOConfig(updates_per_batch=0)


def _toy_update_batch(default_model, n=12, seed=2):
    """A rollout batch of `n` random completions with the trainer's own logprobs as the behaviour policy (the
    decoupled mode, no mismatch), for `policy_updates` without an engine."""
    from rlwb.core.data import tasks, tokenizer
    from rlwb.core.scoring.trainer import TrainerScorer

    g = torch.Generator().manual_seed(seed)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in tasks.make_problems(n, seed=7)]
    comps = [torch.randint(3, 60, (int(k),), generator=g).tolist() for k in torch.randint(3, 20, (n,), generator=g)]
    lengths, width = [len(c) for c in comps], max(map(len, comps))
    mask = grpo._pad([np.ones(k) for k in lengths], width).bool()
    adv = torch.randn(n, generator=g)
    model = TrainerScorer(default_model.path).model.train()
    with torch.no_grad():
        old = grpo._per_seq(completion_logprobs(model, make_batch(prompts, comps), 0.7)["logp"], lengths, width)
    return model, prompts, comps, old, adv, mask


def test_ppo_epochs_pass_over_the_same_mini_batches_with_the_batchs_behaviour_logprobs(default_model):
    """`ppo_epochs` E: E passes over the same rollout batch, each its `updates_per_batch` contiguous mini-batches in
    the same order, the behaviour logprobs and advantages the batch's (computed once): 2 epochs of 3 mini-batches
    are 6 optimizer steps and leave bitwise the weights of two 1-epoch calls on the same batch one after the other.
    One epoch is the mini-batch loop of before (its curves bitwise unchanged: checked on the embedded model's runs):
    its weights equal 3 steps taken by hand on the contiguous slices."""
    model, prompts, comps, old, adv, mask = _toy_update_batch(default_model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    base = dict(temperature=0.7, old_logprobs="trainer", updates_per_batch=3, prompts_per_step=3, group_size=4)

    def weights_after(calls: list[int]):  # one policy_updates call per entry, with that many epochs
        model.load_state_dict(state)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        steps = []
        opt.register_step_post_hook(lambda *_: steps.append(1))
        stats = [grpo.policy_updates(model, opt, prompts, comps, grpo.GRPOConfig(**base, ppo_epochs=e), old, adv,
                                     mask)[0] for e in calls]
        return {k: v.clone() for k, v in model.state_dict().items()}, len(steps), stats

    two, n_two, (st2,) = weights_after([2])
    twice, n_twice, (first, second) = weights_after([1, 1])
    assert n_two == n_twice == 6 and st2.passes == 6
    assert all(torch.equal(two[k], twice[k]) for k in two)
    # the statistics cover every update of both epochs; the last step's are the second call's last step's
    assert st2.last_ratio_abs_log_mean == second.last_ratio_abs_log_mean > 0
    assert st2.ratio_abs_log_mean == pytest.approx((first.ratio_abs_log_mean + second.ratio_abs_log_mean) / 2,
                                                   rel=1e-9)

    model.load_state_dict(state)  # one epoch, by hand: each contiguous slice once, one optimizer step each
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    cfg = grpo.GRPOConfig(**base)
    for idx in np.array_split(np.arange(len(comps)), 3):
        sl = slice(int(idx[0]), int(idx[-1]) + 1)
        opt.zero_grad(set_to_none=True)
        w = int(mask[sl].sum(1).max())
        grpo.accumulate_policy_gradient(model, prompts[sl], comps[sl], cfg, old[sl, :w], adv[sl], mask[sl, :w])
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
    by_hand = model.state_dict()
    one, _, _ = weights_after([1])
    assert all(torch.equal(one[k], by_hand[k]) for k in one)


def test_a_second_epoch_moves_the_decoupled_ratio_of_a_single_mini_batch(default_model):
    """One mini-batch per pass (`updates_per_batch` 1): with one epoch the decoupled ratio is exactly 1 on every
    token, first and last step alike; with two the second pass sees the batch at weights the first moved, so its
    ratio leaves 1 (`last_ratio_abs_log_mean` > 0) and the mean over both passes is half of it. A bad epoch count is
    refused by the config."""
    out = {}
    for e in (1, 2):
        model, prompts, comps, old, adv, mask = _toy_update_batch(default_model)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        steps = []
        opt.register_step_post_hook(lambda *_: steps.append(1))
        cfg = grpo.GRPOConfig(temperature=0.7, old_logprobs="trainer", ppo_epochs=e, prompts_per_step=3, group_size=4)
        assert cfg.single_update == (e == 1)
        out[e] = grpo.policy_updates(model, opt, prompts, comps, cfg, old, adv, mask)[0]
        assert len(steps) == e
    assert out[1].ratio_abs_log_mean == out[1].last_ratio_abs_log_mean == 0.0 and out[1].last_clip_frac == 0.0
    assert out[2].last_ratio_abs_log_mean > 1e-3 and out[2].last_clip_frac > 0
    assert out[2].ratio_abs_log_mean == pytest.approx(out[2].last_ratio_abs_log_mean / 2, rel=1e-9)
    with pytest.raises(ValueError, match="ppo_epochs must be >= 1"):
        grpo.GRPOConfig(ppo_epochs=0)


def test_rollouts_without_engine_text_are_bitwise_the_ones_with_it(engine, default_model, monkeypatch):
    """The GRPO loop and notebook 08's policy reward ask the engine for no text (`generate(text=False)`: vLLM skips
    its detokenizer; the loop decodes the token ids itself). The tokens, logprobs (full distributions too) and
    finish reasons must be bitwise those of a detokenized call, and a short GRPO run's curve bitwise the one it
    has when every rollout is detokenized (the code path before the cut), or the cut changes every curve."""
    from transformers import AutoModelForCausalLM

    from rlwb.core.data import tasks, tokenizer
    from rlwb.engines.worker import Sampling

    w = engine("vllm-v1-fixed")
    prompts = [tokenizer.encode_prompt(p.prompt) for p in tasks.make_problems(12, seed=7)]
    for full in (False, True):
        s = Sampling(temperature=0.7, max_tokens=16, seed=11)
        on, off = (w.generate(prompts, s, full=full, text=t) for t in (True, False))
        assert [c.token_ids for c in on] == [c.token_ids for c in off]
        assert all(np.array_equal(a.logprobs, b.logprobs) for a, b in zip(on, off))
        assert [c.finish_reason for c in on] == [c.finish_reason for c in off]
        assert not full or all(np.array_equal(a.full, b.full) for a, b in zip(on, off))
        assert all(c.text for c in on) and not any(c.text for c in off)  # the cut really skipped the text

    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = grpo.GRPOConfig(steps=2, prompts_per_step=4, group_size=4, lr=1e-3, max_tokens=16)
    generate, asked = w.generate, []

    def detokenized(prompts, sampling, full=False, timeout=None, text=True):
        asked.append(text)
        return generate(prompts, sampling, full, timeout, text=True)

    curves = {}
    try:
        curves["off"] = grpo.train(model, w, cfg, initial, progress=False)
        monkeypatch.setattr(w, "generate", detokenized)
        curves["on"] = grpo.train(model, w, cfg, initial, progress=False)
    finally:
        w.update_weights(initial)
    assert asked == [False, False]  # the loop asks for no text: the run without it is what ran first
    same = [c for c in curves["on"].columns if not c.startswith("t_")]
    assert curves["on"][same].equals(curves["off"][same])
