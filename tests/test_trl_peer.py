"""Peer check: rlwb's GRPO loss equals TRL's, computed by TRL's own GRPOTrainer code on the same batch.

TRL (`trl`, pinned in pyproject) runs its `_compute_loss` — its per-token logprobs from the model, its
clipped surrogate, its `bnpo` aggregation — on a batch of real default-policy completions with
behaviour logprobs perturbed so that the clip is active. rlwb computes the same loss from
`completion_logprobs` + `losses.grpo_loss`. Values and every parameter's gradient must agree.
"""

import pytest
import torch

from rlwb.bench import trl_peer
from rlwb.core.data import tasks, tokenizer
from rlwb.core.rl import losses
from rlwb.core.rl.grpo import _pad, _per_seq
from rlwb.core.scoring.trainer import completion_logprobs, make_batch

T, EPS = 0.7, 0.2


def _batch():
    probs = tasks.make_problems(6, seed=11)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in probs]
    targets = [p.reversed_answer if i % 2 else p.worked_answer for i, p in enumerate(probs)]
    comps = [tokenizer.encode_prompt(t)[1:] + [tokenizer.EOS_ID] for t in targets]
    comps[2] = comps[2][:5]  # a short, unterminated one: padding differs per row
    return prompts, comps


def _loss_setup(default_model, tmp_path, seed: int):
    """The default policy, TRL's trainer around it, the batch, seeded advantages and the completion mask."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    trainer = trl_peer.make_trainer(model, default_model.path, tmp_path, temperature=T, clip_eps=EPS)
    trainer.current_gradient_accumulation_steps = 1
    prompts, comps = _batch()
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(len(prompts), generator=g)
    lengths = [len(c) for c in comps]
    width = max(lengths)
    mask = _pad([[1] * n for n in lengths], width).bool()
    return model, trainer, prompts, comps, g, adv, lengths, width, mask


def _trl_inputs(prompts, comps, width, mask, adv, old) -> dict:
    """The batch as TRL's trainer builds it: left-padded prompts, right-padded completions."""
    pw = max(len(p) for p in prompts)
    return {"prompt_ids": torch.tensor([[tokenizer.PAD_ID] * (pw - len(p)) + p for p in prompts]),
            "prompt_mask": torch.tensor([[0] * (pw - len(p)) + [1] * len(p) for p in prompts]),
            "completion_ids": torch.tensor([c + [tokenizer.PAD_ID] * (width - len(c)) for c in comps]),
            "completion_mask": mask.long(), "advantages": adv, "old_per_token_logps": old}


def test_trl_tokenizes_the_peer_prompts_exactly_as_rlwb(default_model, tmp_path):
    """Through TRL's own prompt tokenization: one BOS, then the task prompt (a doubled BOS once lowered the
    rewards of TRL's rollouts in `rlwb bench` from ~0.6 to ~0.2)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    trainer = trl_peer.make_trainer(model, default_model.path, tmp_path, steps=1)
    texts = list(trainer.train_dataset["prompt"])
    ids = trainer._tokenize_prompts(texts)[0]
    assert [list(x) for x in ids] == [tokenizer.encode_prompt(t) for t in texts]
    assert all(list(x).count(tokenizer.BOS_ID) == 1 for x in ids)
    r = trl_peer._reward(texts[:1], [tasks.make_problems(8, seed=0)[0].worked_answer])
    assert r == [1.0]  # the reward parses the dataset's prompt text


def test_rlwb_grpo_loss_equals_trl_compute_loss(default_model, tmp_path):
    model, trainer, prompts, comps, g, adv, lengths, width, mask = _loss_setup(default_model, tmp_path, seed=0)

    # behaviour logprobs: the model's own, perturbed so that some ratios leave [1 - eps, 1 + eps]
    with torch.no_grad():
        base = _per_seq(completion_logprobs(model, make_batch(prompts, comps), T)["logp"], lengths, width)
    old = (base + 0.3 * torch.randn(base.shape, generator=g)) * mask

    # rlwb
    model.zero_grad()
    cur = _per_seq(completion_logprobs(model, make_batch(prompts, comps), T)["logp"], lengths, width)
    ours, st = losses.grpo_loss(cur, old, adv, mask, EPS)
    ours.backward()
    g_ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert 0 < st.clip_frac < 1, "the batch must exercise the clip"

    # TRL: left-padded prompts, right-padded completions, as its trainer builds them
    inputs = _trl_inputs(prompts, comps, width, mask, adv, old)
    model.zero_grad()
    model.train()
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    g_trl = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert g_ours.keys() == g_trl.keys()
    for n in g_ours:
        torch.testing.assert_close(g_ours[n], g_trl[n], rtol=1e-4, atol=1e-6, msg=f"gradient of {n}")
    # and a wrong loss is caught: a different clip epsilon changes the value
    other, _ = losses.grpo_loss(cur.detach(), old, adv, mask, 0.1)
    assert other.item() != pytest.approx(theirs.item(), rel=1e-5)


def test_trl_corrections_aggregate_as_rlwbs(default_model, tmp_path):
    """TRL's own `_compute_loss` with its vLLM importance-sampling correction (the ratio from TRL's own lines,
    `peers.trl_vllm_is_ratio`; its default `sequence_mask` and `token_mask`) and with its OPSM mask: TRL multiplies
    the per-token loss by the ratio (0 outside the band) and its `bnpo` mean keeps every completion token in the
    count. rlwb's `trl.*` entry must give the same loss and gradient; TRL's per-sequence mean (`loss_type="grpo"`)
    must not."""
    from rlwb.core.rl import corrections
    from tests import peers

    model, trainer, prompts, comps, g, adv, lengths, width, mask = _loss_setup(default_model, tmp_path, seed=1)
    with torch.no_grad():  # one update per batch: the old logprobs are the current ones; the engine's are off
        old = _per_seq(completion_logprobs(model, make_batch(prompts, comps), T)["logp"], lengths, width)
    sign = (1 - 2 * (torch.arange(len(prompts)) % 2)).view(-1, 1)  # some sequences far above TRL's band, some below
    engine = (old - 0.6 * torch.randn(old.shape, generator=g).abs() * sign) * mask
    inputs = {**_trl_inputs(prompts, comps, width, mask, adv, old), "sampling_per_token_logps": engine}
    for mode in ("sequence_mask", "token_mask", "opsm"):
        trainer.loss_type, trainer.off_policy_mask_threshold = "bnpo", None
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = mode != "opsm"
        if mode == "opsm":  # TRL's code at 0.1 (the catalogue holds TRL's suggested 0.5, which this batch never hits)
            trainer.off_policy_mask_threshold = 0.1
            c = corrections.off_policy_sequence_mask(old - engine, mask, adv, 0.1)
        else:
            inputs["importance_sampling_ratio"] = peers.trl_vllm_is_ratio(mode, old, engine, mask.float())
            c = corrections.apply(f"trl.{mode}", old - engine, mask, adv)
        assert c.keep.all() and 0 < (c.weights[mask] == 0).sum() < mask.sum(), mode  # weight 0, still counted

        model.zero_grad()
        cur = _per_seq(completion_logprobs(model, make_batch(prompts, comps), T)["logp"], lengths, width)
        ours, _ = losses.grpo_loss(cur, old, adv, mask, EPS, c.weights, c.keep)
        ours.backward()
        g_ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        model.train()
        theirs = trainer._compute_loss(model, inputs)
        theirs.backward()
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7), mode
        for n, p in model.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(g_ours[n], p.grad, rtol=1e-4, atol=1e-6, msg=f"{mode}: gradient of {n}")
        trainer.loss_type = "grpo"
        with torch.no_grad():
            assert trainer._compute_loss(model, inputs).item() != pytest.approx(ours.item(), rel=1e-4), mode
        inputs.pop("importance_sampling_ratio", None)
