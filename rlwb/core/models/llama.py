"""The embedded default policy: a tiny Llama (GQA + RoPE) that rlwb builds and SFT-trains itself: its recipe,
training and evaluation. Building, caching and publishing it (like every embedded model) is `store`.

Why: nothing can be downloaded from a model hub here, and the experiments need a policy that (a) real
vLLM loads as a Llama, (b) is deterministic from a seed, (c) solves the toy task only partly, so RL has
headroom, and (d) writes completions long enough for per-token mismatch to accumulate.

Why the SFT corpus has a bad habit: half its examples write the final sum reversed ("#521" for 125). A
policy whose only errors are capability errors (miscopied digits) gives an RL gradient that is mostly
noise at this size: with the habit-free recipe (190 steps, greedy accuracy 0.435) every learning rate
tried made GRPO *lower* the reward (Adam lr 3e-4: 0.45 -> 0.03 in 40 steps; a step of norm 0.03 along
a 512-rollout policy gradient already lowered the sampled reward 0.437 -> 0.409). A habit that the
reward alone reveals is one consistent direction, so GRPO learns it in tens of steps (measured with the
HF engine, lr 1e-4, T 0.7: batch reward 0.67 -> 0.86 over 30 steps, greedy accuracy 0.525 -> 0.84) and
the engines' logprob errors have something to disturb. Toy RL testbeds use the same construction.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlwb.core.data import tasks, tokenizer

RECIPE_VERSION = 2  # bump when the training code changes in a way the fields below do not capture
# 2: built under BUILD_ENV (ISA-independent weights); version-1 builds depended on the machine's CPU.


@dataclass(frozen=True)
class ModelRecipe:
    """Everything that determines the default policy's weights."""

    hidden_size: int = 128  # d_model
    intermediate_size: int = 384  # SwiGLU width
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # head_dim = 32
    num_key_value_heads: int = 2  # GQA: 2 query heads share each KV head
    max_position_embeddings: int = 4096  # long enough for the long-context checks on CPU
    rope_theta: float = 10000.0
    seed: int = 0
    train_steps: int = 400  # SFT steps: digits copied reliably, the reversal habit the only common error
    reversed_answer_frac: float = 0.5  # share of SFT targets with the sum reversed (the habit RL removes)
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    max_digits: int = 3  # operands of 1..3 digits
    version: int = RECIPE_VERSION

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def llama_config(recipe: ModelRecipe):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer.VOCAB),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_theta=recipe.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.BOS_ID,
        eos_token_id=tokenizer.EOS_ID,
        pad_token_id=tokenizer.PAD_ID,
        torch_dtype="float32",
    )


def sft_batch(problems: list[tasks.Problem], reversed_mask: list[bool] | None = None):
    """(input_ids, labels) for teacher forcing: loss only on completion tokens (+ EOS). `reversed_mask[i]`
    makes example i a `reversed_answer` (the corpus's bad habit)."""
    import torch

    reversed_mask = reversed_mask or [False] * len(problems)
    seqs, labels = [], []
    for p, rev in zip(problems, reversed_mask):
        prompt = tokenizer.encode_prompt(p.prompt)
        target = p.reversed_answer if rev else p.worked_answer
        completion = tokenizer.encode_prompt(target)[1:] + [tokenizer.EOS_ID]
        seqs.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.PAD_ID, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, lab_i) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(lab_i)] = torch.tensor(lab_i)
    return ids, lab


def train(recipe: ModelRecipe, progress: bool = True):
    """SFT from a seeded random init. Deterministic for a given recipe and thread count."""
    import torch
    from transformers import LlamaForCausalLM

    from rlwb.progress import progress_bar

    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(llama_config(recipe)).float()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / recipe.warmup_steps) * max(0.05, 1 - s / recipe.train_steps)
    )
    # Training data seeds are disjoint from evaluation seeds (eval uses seed + 10**6 upward).
    model.train()
    for step in progress_bar(range(recipe.train_steps), desc="SFT default policy", disable=not progress):
        problems = tasks.make_problems(recipe.batch_size, seed=recipe.seed * 100_003 + step,
                                       max_digits=recipe.max_digits)
        habit = random.Random(f"habit-{recipe.seed}-{step}")  # independent of the problem stream
        ids, lab = sft_batch(problems, [habit.random() < recipe.reversed_answer_frac for _ in problems])
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return model


def greedy_eval(model, n: int = 200, seed: int = 10**6, max_digits: int = 3, max_new_tokens: int = 40):
    """Greedy accuracy, mean completion length (tokens incl. EOS) and the share of answers written reversed
    (the SFT habit; sums that read the same both ways are not counted) on `n` held-out problems."""
    import torch

    problems = tasks.make_problems(n, seed=seed, max_digits=max_digits)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in problems]
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), tokenizer.PAD_ID, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.PAD_ID, eos_token_id=tokenizer.EOS_ID)
    rows, lengths, rewards, habit = [], [], [], 0
    for p, seq in zip(problems, out[:, width:].tolist()):
        n_tok = seq.index(tokenizer.EOS_ID) + 1 if tokenizer.EOS_ID in seq else len(seq)
        text = tokenizer.decode(seq)
        r = tasks.reward(p, text)
        rows.append({"prompt": p.prompt, "completion": text, "target": p.worked_answer, "reward": r})
        lengths.append(n_tok)
        rewards.append(r)
        habit += tasks.is_reversed(p, text)
    return {
        "greedy_accuracy": sum(rewards) / n,
        "reversed_answer_frac": habit / n,
        "mean_completion_tokens": sum(lengths) / n,
        "samples": rows,
    }


def build(recipe: ModelRecipe, out: Path, progress: bool) -> tuple[object, dict]:
    """Train the default policy and save it into `out`; returns (model, card fields)."""
    t0 = time.time()
    model = train(recipe, progress=progress)
    build_s = time.time() - t0
    ev = greedy_eval(model, max_digits=recipe.max_digits)
    model.save_pretrained(out, safe_serialization=True)
    gen_cfg = out / "generation_config.json"
    gen_cfg.write_text(json.dumps({"bos_token_id": tokenizer.BOS_ID, "eos_token_id": tokenizer.EOS_ID,
                                   "pad_token_id": tokenizer.PAD_ID}, indent=2))
    tokenizer.save_tokenizer(tokenizer.build_tokenizer(), out)
    return model, {
        "name": "rlwb-default-policy",
        "architecture": "LlamaForCausalLM (GQA + RoPE), char-level tokenizer",
        "greedy_accuracy": ev["greedy_accuracy"],
        "reversed_answer_frac": ev["reversed_answer_frac"],
        "mean_completion_tokens": ev["mean_completion_tokens"],
        "eval_problems": 200,
        "build_s": round(build_s, 1),
    }
