"""The trainer scorer: processed-distribution semantics and memory-aware chunking."""

import numpy as np
import pytest
import torch

from rlwb.core.scoring import trainer


def _ref(z, T, k, p):
    """Independent reference: temperature, keep top-k (ties kept), then the smallest nucleus >= p."""
    z = np.asarray(z, dtype=np.float64) / T
    keep = np.ones_like(z, dtype=bool)
    if k:
        keep &= z >= np.sort(z)[::-1][k - 1]
    zz = np.where(keep, z, -np.inf)
    if p < 1:
        order = np.argsort(-zz, kind="stable")
        probs = np.exp(zz[order] - zz[order][0])
        probs /= probs.sum()
        cum_before = np.cumsum(probs) - probs  # mass of strictly better tokens
        drop_sorted = cum_before >= p - 1e-12
        drop_sorted[0] = False
        keep2 = np.ones_like(keep)
        keep2[order[drop_sorted]] = False
        zz = np.where(keep2, zz, -np.inf)
    return zz - np.log(np.sum(np.exp(zz[np.isfinite(zz)] - zz[np.isfinite(zz)].max()))) - zz[np.isfinite(zz)].max()


@pytest.mark.parametrize("T,k,p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (0.7, 0, 0.9), (0.5, 8, 0.8)])
def test_process_logits_matches_reference(T, k, p):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 64, generator=g) * 3
    got = trainer.process_logits(z, T, k, p).log_softmax(-1).numpy()
    for row, zr in zip(got, z.numpy()):
        ref = _ref(zr, T, k, p)
        assert np.array_equal(np.isfinite(row), np.isfinite(ref))
        np.testing.assert_allclose(row[np.isfinite(row)], ref[np.isfinite(ref)], atol=2e-5)


def test_truncation_renormalises_over_kept_tokens():
    z = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    lp = trainer.process_logits(z, 1.0, top_k=2).log_softmax(-1)
    assert torch.isinf(lp[0, 2:]).all()
    assert torch.allclose(lp[0, :2].exp().sum(), torch.tensor(1.0))


def test_chunked_scoring_equals_full_log_softmax(default_model):
    from rlwb.core.data import tasks, tokenizer

    sc = trainer.TrainerScorer(default_model.path)
    probs = tasks.make_problems(5, seed=2)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in probs]
    comps = [tokenizer.encode_prompt(p.worked_answer)[1:] + [tokenizer.EOS_ID] for p in probs]
    b = trainer.make_batch(prompts, comps)
    with torch.no_grad():
        small = trainer.completion_logprobs(sc.model, b, 0.7, raw=True, chunk_tokens=3)
        big = trainer.completion_logprobs(sc.model, b, 0.7, raw=True, chunk_tokens=10_000)
        logits = sc.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
    naive = (logits[:, :-1] / 0.7).log_softmax(-1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    naive = naive[b.completion_mask[:, 1:]]
    # chunk size changes GEMM blocking, so equality is to float precision, not bitwise
    torch.testing.assert_close(small["logp"], big["logp"], atol=1e-5, rtol=0)
    torch.testing.assert_close(small["logp"], naive, atol=1e-5, rtol=0)
    assert small["logp"].shape[0] == sum(len(c) for c in comps)
    # scoring one sequence alone gives the same values as inside the padded batch
    alone = sc.score(prompts[:1], comps[:1], temperature=0.7)["logp"][0]
    np.testing.assert_allclose(alone, small["logp"][: len(comps[0])].numpy(), atol=1e-5)


def test_empty_prompt_is_rejected():
    with pytest.raises(ValueError, match="empty prompt"):
        trainer.make_batch([[]], [[1, 2]])


def test_batch_logprobs_cuts_the_whole_batch_and_stays_bitwise(default_model):
    """GRPO's no-grad old-logprob pass before a micro-batched update (`grpo_step`): cut into slices of the batch's
    rows as the scorer cuts, at the batch's own width, it gives bitwise the values of one forward over the whole
    batch on CPU, while no forward holds more than `batch_size` rows."""
    from rlwb.core.data import tasks, tokenizer

    sc = trainer.TrainerScorer(default_model.path)
    probs = tasks.make_problems(10, seed=3)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in probs]
    comps = [tokenizer.encode_prompt((p.worked_answer if i % 2 else p.reversed_answer) * (1 + i % 3))[1:]
             for i, p in enumerate(probs)]  # completions of 3 very different lengths: padded rows
    b = trainer.make_batch(prompts, comps)
    rows = []
    hook = sc.model.get_decoder().register_forward_pre_hook(lambda mod, args, kw: rows.append(kw["input_ids"].shape),
                                                            with_kwargs=True)
    try:
        with torch.no_grad():
            whole = trainer.completion_logprobs(sc.model, b, 0.7, entropy=True)
            rows.clear()
            cut = trainer.batch_logprobs(sc.model, b, 0.7, entropy=True, batch_size=3)
    finally:
        hook.remove()
    assert [r[0] for r in rows] == [2, 3, 3, 2] and {r[1] for r in rows} == {b.input_ids.shape[1]}
    for k in ("logp", "entropy"):
        assert torch.equal(cut[k], whole[k]), k


@pytest.mark.parametrize("name, max_digits", [("default", 3), ("qwen2-chat", 2)])
def test_greedy_rewards_reproduce_each_models_card(name, max_digits):
    """The generic greedy evaluation (prompts through the codec, as the engines get them) gives each embedded
    model's greedy accuracy exactly as its own build measured it (its card), on the card's problems."""
    from transformers import AutoModelForCausalLM

    from rlwb.core.data import tasks, tokenizer
    from rlwb.core.models import store
    from rlwb.core.scoring.trainer import greedy_rewards

    m = store.build_embedded_model(name, progress=False)
    model = AutoModelForCausalLM.from_pretrained(str(m.path), dtype=torch.float32)
    r = greedy_rewards(model, tokenizer.PromptCodec(m.path), tasks.make_problems(200, seed=10**6,
                                                                                 max_digits=max_digits), 48)
    assert r.shape == (200,) and set(np.unique(r)) <= {0.0, 1.0}
    assert r.mean() == m.card["greedy_accuracy"]
