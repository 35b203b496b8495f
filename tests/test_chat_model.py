"""The realistic embedded model (issue #18): built like a hub checkpoint, loaded natively by every engine at the
float floor, chat-template prompts that round-trip, open-ended prompts, and its card. The smoke budget
(`qwen2-chat-smoke`, same recipe but a few steps) stands in for the full build in tests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlwb.core.data import tasks
from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.prompts import generated


def test_checkpoint_is_a_qwen2_as_a_hub_checkpoint_is(chat_smoke_model):
    cfg = json.loads((chat_smoke_model.path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == 1e6  # top level: transformers 4.51 (vLLM 0.8.5) reads only that
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # GQA
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_smoke_model.path)
    assert len(tok) == 8192 < cfg["vocab_size"]  # padded vocabulary, as Qwen2.5's 151,936 rows for 151,665 tokens
    assert tok.bos_token is None and cfg["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "lm_head.weight" not in __import__("safetensors.torch").torch.load_file(
        chat_smoke_model.path / "model.safetensors")  # tied: stored once, as a tied hub checkpoint is


def test_card_reports_size_entropy_and_the_build(chat_smoke_model):
    from rlwb.core.models.store import recipe_for

    card = chat_smoke_model.card
    assert card["name"] == "rlwb-qwen2-chat-smoke" and card["recipe_hash"] == recipe_for("qwen2-chat-smoke").hash()
    assert 1e6 < card["params"] < 5e6
    assert card["held_out_entropy"] > 1.0 and card["held_out_cross_entropy"] > 1.0
    assert len(card["recipe"]["corpus_sha256"]) == 64 and "standard library" in card["corpus"]
    assert 0 <= card["greedy_accuracy"] <= 1


def test_recipe_hash_covers_the_corpus(chat_smoke_model):
    from dataclasses import replace

    from rlwb.core.models.store import recipe_for

    r = recipe_for("qwen2-chat-smoke")
    assert replace(r, corpus_sha256="0" * 64).hash() != r.hash()  # another interpreter's stdlib: another model


def test_chat_prompts_round_trip_through_the_template(chat_smoke_model):
    codec = PromptCodec(chat_smoke_model.path)
    assert codec.chat
    p = tasks.Problem(58, 67)
    ids = codec.encode_task(p)
    assert codec.hf.decode(ids) == "<|im_start|>user\nWhat is 58+67?<|im_end|>\n<|im_start|>assistant\n"
    shots = tasks.make_problems(2, seed=1)
    multi = codec.hf.decode(codec.encode_task(p, shots))
    assert multi.count("<|im_start|>assistant\n") == 3 and shots[0].worked_answer in multi
    raw = PromptCodec(chat_smoke_model.path, chat_template="off")
    assert raw.hf.decode(raw.encode_task(p)) == "58+67="  # no BOS, no template
    with pytest.raises(ValueError, match="no chat template"):
        PromptCodec(None, chat_template="on")
    with pytest.raises(ValueError, match="chat_template must be one of"):
        PromptCodec(chat_smoke_model.path, chat_template="yes")


def test_open_ended_prompts_are_held_out_text_and_questions(chat_smoke_model):
    codec = PromptCodec(chat_smoke_model.path)
    a = generated.make_prompts("open_ended", 6, 0, codec)
    assert a == generated.make_prompts("open_ended", 6, 0, codec)
    assert a != generated.make_prompts("open_ended", 6, 1, codec)
    texts = [codec.hf.decode(x) for x in a]
    assert all(not t.startswith("<|im_start|>") for t in texts[0::2])  # corpus prefixes: plain text
    assert all(t.startswith("<|im_start|>user\n") and t[17:-33] in generated.CHAT_QUESTIONS for t in texts[1::2])
    train, held = __import__("rlwb.core.models.chat", fromlist=["x"]).corpus_split()
    assert all(any(t in h for h in held) for t in texts[0::2]) and not any(texts[0] in t for t in train)
    char = generated.make_prompts("open_ended", 4, 0, PromptCodec())  # the default policy: normalized text
    assert all(len(x) > 10 for x in char)
    with pytest.raises(ValueError, match="prompt_source must be one of"):
        generated.make_prompts("wiki", 4, 0, codec)


def test_policy_uncertainty_metric():
    from rlwb.core.measure.metrics import policy_uncertainty

    m = policy_uncertainty(np.log([0.95, 0.5, 0.2, 1.0]), [0.1, 1.0, 2.0, 0.0])
    assert m == {"token_entropy_mean": pytest.approx(0.775), "uncertain_token_frac": 0.5}
    with pytest.raises(ValueError, match="differ in shape"):
        policy_uncertainty(np.log([0.5]), [1.0, 2.0])


@pytest.mark.engines
@pytest.mark.parametrize("name", ["hf", "vllm-v0", "vllm-v1-fixed"])
def test_every_engine_loads_it_natively_at_the_float_floor(chat_smoke_model, name):
    """fp32 engine vs fp32 trainer, processed logprobs, T = 0.7 on open-ended and chat task prompts: the float
    floor (max |Δlogp| ≤ 1e-5) with no BOS, the ChatML specials, a padded vocabulary and a tied head."""
    from rlwb.core.scoring.rollouts import sample_and_score
    from rlwb.core.scoring.trainer import TrainerScorer
    from rlwb.engines.worker import EngineWorker, Sampling

    codec = PromptCodec(chat_smoke_model.path)
    ids = generated.make_prompts("open_ended", 6, 0, codec) + generated.make_prompts("task", 4, 0, codec)
    scorer = TrainerScorer(chat_smoke_model.path, "float32")
    with EngineWorker(name, chat_smoke_model.path) as w:
        ro = sample_and_score(w, scorer, ids, Sampling(temperature=0.7, max_tokens=24, seed=0))
    e, t = ro.flat()
    assert e.size >= 60 and np.max(np.abs(e - t)) <= 1e-5
    assert ro.uncertainty()["uncertain_token_frac"] > 0.3  # unlike the default policy's
