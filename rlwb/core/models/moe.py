"""The embedded MoE policy: the chat model (`qwen2-chat`) upcycled into a Qwen2-MoE, for router audits.

Why upcycle instead of train: the question notebook 06 asks of an MoE model is whether the engine's router
picks the same experts as the trainer's, token by token. That needs a real MoE architecture both vLLM and
transformers run (Qwen2-MoE: top-k softmax router, routed experts, a gated shared expert), weights that
behave like the dense policy (so the prompts and completions stay realistic), and routers whose decisions
are sometimes close calls (so numerics can flip them), not a good MoE. Sparse upcycling (Komatsuzaki et
al. 2022, https://arxiv.org/abs/2212.05055) gives all three without a training budget:

- attention, norms and embeddings are the dense model's;
- the shared expert is the dense MLP, its gate zero (sigmoid(0) = 1/2 of the dense MLP's output);
- each routed expert is the dense MLP with independent multiplicative noise (`expert_noise`) on its weights
  and half its down projection, so the routed mixture (top-k weights renormalised to 1) adds the other half;
- the router is a seeded random projection scaled so its logits have unit spread.

The MoE model is the dense one up to the expert noise (max |Δlogit| ~ 0.06 on the built chat model) and its
routing is decided by the router's projection of the real hidden states. Deterministic: same base weights,
same seed, same model (no training, no threads involved).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class MoeRecipe:
    name: str = "qwen2-moe-chat"  # the `model:` value that selects it
    base: str = "qwen2-chat"  # the embedded dense model it is upcycled from
    num_experts: int = 4
    top_k: int = 2  # experts per token
    expert_noise: float = 0.05  # relative std of the multiplicative noise that makes the experts differ
    seed: int = 0
    base_hash: str = ""  # the base recipe's hash on this machine (filled by `with_corpus`)
    version: int = 1

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def with_corpus(self, base_hash: str) -> MoeRecipe:
        """Bound to the base model's recipe hash (which is bound to this interpreter's corpus; `models` passes
        it in, so this module never imports `models`: the import goes one way)."""
        return replace(self, base_hash=base_hash)


def upcycle(dense, recipe: MoeRecipe):
    """A `Qwen2MoeForCausalLM` built from a dense `Qwen2ForCausalLM` as the module docstring says."""
    import torch
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    c = dense.config
    cfg = Qwen2MoeConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        moe_intermediate_size=c.intermediate_size, shared_expert_intermediate_size=c.intermediate_size,
        num_experts=recipe.num_experts, num_experts_per_tok=recipe.top_k, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        max_position_embeddings=c.max_position_embeddings, rope_theta=float(c.rope_parameters["rope_theta"]),
        tie_word_embeddings=True, use_sliding_window=False, qkv_bias=True, bos_token_id=None,
        eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id, router_aux_loss_coef=0.0, torch_dtype="float32")
    moe = Qwen2MoeForCausalLM(cfg)
    g = torch.Generator().manual_seed(recipe.seed)
    src, dst = dense.state_dict(), moe.state_dict()
    H = c.hidden_size
    with torch.no_grad():
        for k, v in src.items():
            if ".mlp." not in k and k in dst:
                dst[k].copy_(v)
        for layer in range(c.num_hidden_layers):
            p = f"model.layers.{layer}.mlp."
            gw, uw, dw = src[p + "gate_proj.weight"], src[p + "up_proj.weight"], src[p + "down_proj.weight"]
            for name, w in (("gate_proj", gw), ("up_proj", uw), ("down_proj", dw)):
                dst[p + f"shared_expert.{name}.weight"].copy_(w)
            dst[p + "shared_expert_gate.weight"].zero_()
            dst[p + "gate.weight"].copy_(torch.randn(recipe.num_experts, H, generator=g) / H**0.5)

            def noisy(w):
                return w * (1 + recipe.expert_noise * torch.randn(w.shape, generator=g))

            for e in range(recipe.num_experts):
                dst[p + "experts.gate_up_proj"][e].copy_(torch.cat([noisy(gw), noisy(uw)], 0))
                dst[p + "experts.down_proj"][e].copy_(0.5 * noisy(dw))
    moe.load_state_dict(dst)
    return moe.eval()


def build(recipe: MoeRecipe, base, out: Path, progress: bool = True) -> tuple[object, dict]:
    """Upcycle the base embedded model (`base`: its `models.EmbeddedModel`, built by the caller) and save into
    `out`; returns (model, card fields)."""
    import time

    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    dense = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32).eval()
    moe = upcycle(dense, recipe)
    moe.save_pretrained(out, safe_serialization=True)
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_theta"] = moe.config.rope_parameters["rope_theta"]  # transformers < 5 reads the top-level key
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in base.path.iterdir():  # tokenizer, chat template, generation config: the base model's
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(f, out / f.name)
    probe = torch.tensor([[min(5 + 37 * i, dense.config.vocab_size - 1) for i in range(24)]])
    with torch.no_grad():
        gap = float((moe(probe).logits - dense(probe).logits).abs().max())
    return moe, {
        "name": f"rlwb-{recipe.name}",
        "architecture": f"Qwen2MoeForCausalLM: {recipe.num_experts} routed experts (top-{recipe.top_k}, "
                        f"renormalised) + a gated shared expert per layer, upcycled from {recipe.base}",
        "base_model": recipe.base, "base_recipe_hash": base.recipe_hash,
        "max_abs_logit_gap_vs_base": round(gap, 4),
        "build_s": round(time.time() - t0, 1),
    }
