"""Embedded models with a real checkpoint's shapes and random weights: Qwen2.5-0.5B's config, built here.

Why: numerics that depend on shapes (GEMM blocking, attention kernels, a 151,936-row lm_head, batch invariance on
a GPU) only show at a real model's sizes, and no hub is reachable from these machines (nor from the lent GPU
machines) to download one. The published config (`config.json` of the checkpoint, every field that decides a
shape or a numeric path: hidden 896, 24 layers, 14 heads / 2 KV heads, intermediate 4,864, vocabulary 151,936,
RoPE theta 1e6, RMSNorm eps 1e-6, tied embeddings) is built with transformers' own initialisation from a fixed
seed, in the pinned child process every embedded model is built in (`rlwb.core.models.pinned_build.BUILD_ENV`), so
one recipe gives one checksum per CPU vendor, whatever machine (a GPU box included) builds it.

What it is not: a trained policy. Its next-token distributions are nearly uniform over the vocabulary (entropy
~11.7 nats), so it measures kernels and shapes, never behaviour. Its tokenizer is the chat model's byte-level
BPE (`rlwb.core.models.bpe`, 8,192 tokens trained on the standard library, ChatML template): the embedding rows past it
are never prompted but are sampled, as a real checkpoint's padded rows can be.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlwb.core.models import bpe

# config.json of Qwen/Qwen2.5-0.5B-Instruct as published (the fields that decide shapes and numerics); token ids
# come from rlwb's BPE tokenizer instead of Qwen's (`build`)
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
              "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
              "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
              "tie_word_embeddings": True, "vocab_size": 151936, "hidden_act": "silu", "initializer_range": 0.02,
              "use_sliding_window": False, "max_window_layers": 21, "attention_dropout": 0.0}


@dataclass(frozen=True)
class RandomInitRecipe:
    """A published config, random weights from `seed`: everything that determines the weights."""

    name: str = "qwen2.5-0.5b-random"  # the `model:` value that selects it
    config_json: str = json.dumps(QWEN25_05B, sort_keys=True)  # the transformers config, as JSON (hashable)
    seed: int = 0
    tokenizer_vocab: int = 8192  # rlwb's BPE tokenizer (the chat model's), trained on the standard library
    corpus_sha256: str = ""  # the tokenizer's corpus (filled by `with_corpus`)
    version: int = 1

    @property
    def config(self) -> dict:
        return json.loads(self.config_json)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def with_corpus(self) -> RandomInitRecipe:
        """Bound to the running interpreter's standard library, which the tokenizer is trained on."""
        return replace(self, corpus_sha256=bpe.stdlib_corpus()[1])


@functools.cache
def bpe_tokenizer(vocab_size: int):
    """rlwb's BPE tokenizer trained on this interpreter's standard library (deterministic; trained once per process:
    ~13 s here)."""
    from rlwb.core.models.chat import corpus_split

    return bpe.train_tokenizer(corpus_split()[0], vocab_size)


def build(recipe: RandomInitRecipe, out: Path, progress: bool = True) -> tuple[object, dict]:
    """Initialise from the seed and save into `out` as a hub checkpoint is laid out; returns (model, card fields)."""
    import time

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.time()
    tok = bpe_tokenizer(recipe.tokenizer_vocab)
    cfg_d = recipe.config
    arch = cfg_d.pop("architectures")[0]
    model_type = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}[arch]
    eos, pad = tok.convert_tokens_to_ids(bpe.IM_END), tok.convert_tokens_to_ids(bpe.PAD)
    cfg = AutoConfig.for_model(model_type, **cfg_d, architectures=[arch], bos_token_id=None, eos_token_id=eos,
                               pad_token_id=pad, torch_dtype="float32")
    torch.manual_seed(recipe.seed)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    model.save_pretrained(out, safe_serialization=True)
    saved = json.loads((out / "config.json").read_text())
    saved["rope_theta"] = cfg_d["rope_theta"]  # transformers < 5 (vLLM 0.8.5) reads the top-level key only
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": pad}, indent=2))
    bpe.save_tokenizer(tok, out)
    return model, {
        "name": f"rlwb-{recipe.name}",
        "architecture": f"{arch} with a published config ({cfg_d['num_hidden_layers']} layers, hidden "
                        f"{cfg_d['hidden_size']}, vocabulary {cfg_d['vocab_size']}), random weights (seed "
                        f"{recipe.seed}, transformers' initialisation): shapes and kernels, not a trained policy",
        "tokenizer": f"byte-level BPE, {len(tok)} tokens (the chat model's), no BOS",
        "build_s": round(time.time() - t0, 1),
    }
