"""The realistic embedded policy: a tiny Qwen2 chat model with a BPE tokenizer, pretrained on natural text.

Why a second embedded model: the default policy (char-level Llama on column addition) is so peaked that
almost every sampled token has p ~ 1, so the engine-trainer gap is decided by a handful of tokens, and its
64-symbol tokenizer never takes the path a downloaded checkpoint takes (multi-byte BPE tokens, no BOS,
special tokens, a chat template, qkv biases, tied embeddings, a vocabulary padded past the tokenizer).
This model takes that path and has natural-text entropy:

- architecture `Qwen2ForCausalLM` exactly as Qwen2.5-0.5B is configured (GQA, rope_theta 1e6, qkv bias,
  tied embeddings, padded vocabulary), only smaller; saved the way a hub checkpoint is, so every engine loads
  it natively (no rlwb code path);
- tokenizer: `rlwb.core.models.bpe` (byte-level BPE trained on the corpus, ChatML template, no BOS);
- pretraining on the standard library's source and docstrings of the interpreter that builds it (natural
  English and code on every machine; a held-out 1/20 of the files gives the card's entropy and the
  open-ended prompts), then SFT on the arithmetic task in chat form with the default policy's habit (half the
  targets write the sum reversed), so GRPO has a direction the reward alone reveals.

Built, cached, checksummed and pinned exactly like the default policy (`rlwb.core.models.store`,
`pinned_build`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from rlwb.core.data import tasks
from rlwb.core.data.tokenizer import chat_prompt_ids
from rlwb.core.models import bpe

HELD_OUT_EVERY = 20  # 1 in 20 standard-library files is held out of pretraining (entropy, open-ended prompts)


@dataclass(frozen=True)
class ChatModelRecipe:
    """Everything that determines the chat model's weights (the corpus enters through its sha256)."""

    name: str = "qwen2-chat"  # the `model:` value that selects it
    vocab_size: int = 8192  # BPE tokens incl. the 3 specials
    padded_vocab_size: int = 8256  # embedding rows: padded past the tokenizer, as real checkpoints are
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # head_dim 32: vLLM 0.8.5's CPU attention supports 32/64/80/96/112/128/...
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    rope_theta: float = 1e6  # Qwen2.5's value
    seed: int = 0
    pretrain_steps: int = 60
    pretrain_batch: int = 16
    pretrain_seq_len: int = 256
    pretrain_lr: float = 3e-3
    sft_steps: int = 600
    sft_batch: int = 32
    sft_lr: float = 3e-3
    sft_text_batch: int = 2  # corpus windows (of 128 tokens) in every SFT step, so SFT does not erase the text
    sft_text_weight: float = 0.3  # their loss's weight beside the task's
    warmup_steps: int = 20
    reversed_answer_frac: float = 0.5  # the habit only the reward reveals (as the default policy's)
    max_digits: int = 2  # operands of 1..2 digits: 3 digits did not get past greedy accuracy 0.12 in the budget
    corpus_sha256: str = ""  # filled by `with_corpus`
    version: int = 1

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def with_corpus(self) -> ChatModelRecipe:
        """This recipe bound to the running interpreter's standard library (its sha256)."""
        from dataclasses import replace

        return replace(self, corpus_sha256=bpe.stdlib_corpus()[1])


def is_held_out(path: Path, root: Path) -> bool:
    """Deterministic file-level split: held out when the sha256 of the relative path is 0 mod 20."""
    rel = str(Path(path).relative_to(root))
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


@functools.cache
def corpus_split(root: Path | None = None) -> tuple[list[str], list[str]]:
    """(pretraining texts, held-out texts) of the standard library; read once per process (every open-ended
    prompt set draws from it), so callers must not modify the lists."""
    import sysconfig

    root = Path(root or sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for f in bpe.stdlib_files(root):
        (held if is_held_out(f, root) else train).append(f.read_text(encoding="utf-8", errors="replace"))
    return train, held


def qwen2_config(recipe: ChatModelRecipe, tok):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=recipe.padded_vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads, num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings, rope_theta=recipe.rope_theta,
        tie_word_embeddings=True, use_sliding_window=False, bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids(bpe.IM_END), pad_token_id=tok.convert_tokens_to_ids(bpe.PAD),
        torch_dtype="float32",
    )


def sft_example(tok, problem: tasks.Problem, reversed_: bool) -> tuple[list[int], list[int]]:
    """(prompt ids through the chat template, completion ids ending in `<|im_end|>`)."""
    prompt = chat_prompt_ids(tok, problem.question)
    target = problem.reversed_answer if reversed_ else problem.worked_answer
    return prompt, tok(target)["input_ids"] + [tok.convert_tokens_to_ids(bpe.IM_END)]


def token_stream(tok, texts: list[str]):
    """All texts' token ids, each followed by `<|endoftext|>`, as one int64 array (documents are packed)."""
    import numpy as np

    eot = tok.convert_tokens_to_ids(bpe.PAD)
    encs = tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return np.concatenate([np.asarray(e.ids + [eot], dtype=np.int64) for e in encs])


def next_token_loss(model, ids, labels):
    """Mean cross-entropy of next-token prediction where `labels` is not -100; only those positions go
    through the lm_head (a 8k-row head over every prompt token would double the SFT step's cost)."""
    import torch

    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
    target = labels[:, 1:]
    keep = target != -100
    logits = model.lm_head(hidden[keep]).float()
    return torch.nn.functional.cross_entropy(logits, target[keep])


def _schedule(step: int, steps: int, warmup: int) -> float:
    return min(1.0, (step + 1) / warmup) * max(0.05, 1 - step / max(steps, 1))


def train(recipe: ChatModelRecipe, tok, train_texts: list[str], progress: bool = True):
    """Pretrain on random windows of the corpus, then SFT on chat arithmetic. Deterministic for a recipe."""
    import numpy as np
    import torch
    from transformers import Qwen2ForCausalLM

    from rlwb.progress import progress_bar

    torch.manual_seed(recipe.seed)
    model = Qwen2ForCausalLM(qwen2_config(recipe, tok)).float()
    eot = tok.convert_tokens_to_ids(bpe.PAD)
    stream = token_stream(tok, train_texts)
    rng = np.random.default_rng(recipe.seed)

    def run_phase(steps: int, lr: float, batch_fn, desc: str, text_batch_fn=None) -> float:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _schedule(s, steps, recipe.warmup_steps))
        loss = torch.tensor(float("nan"))
        for step in progress_bar(range(steps), desc=desc, disable=not progress):
            ids, lab = batch_fn(step)
            loss = next_token_loss(model, ids, lab)
            if text_batch_fn is not None:
                loss = loss + recipe.sft_text_weight * next_token_loss(model, *text_batch_fn(step))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        return float(loss.detach())

    def text_batch(step: int, batch: int = recipe.pretrain_batch, seq_len: int = recipe.pretrain_seq_len):
        starts = rng.integers(0, len(stream) - seq_len - 1, batch)
        ids = torch.from_numpy(np.stack([stream[s: s + seq_len] for s in starts]))
        return ids, ids.clone()

    def chat_batch(step: int):
        problems = tasks.make_problems(recipe.sft_batch, seed=recipe.seed * 100_003 + step,
                                       max_digits=recipe.max_digits)
        habit = random.Random(f"habit-{recipe.seed}-{step}")
        pairs = [sft_example(tok, p, habit.random() < recipe.reversed_answer_frac) for p in problems]
        width = max(len(p) + len(c) for p, c in pairs)
        ids = torch.full((len(pairs), width), eot, dtype=torch.long)
        lab = torch.full((len(pairs), width), -100, dtype=torch.long)
        for i, (p, c) in enumerate(pairs):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            lab[i, len(p): len(p) + len(c)] = torch.tensor(c)
        return ids, lab

    model.train()
    pretrain_loss = run_phase(recipe.pretrain_steps, recipe.pretrain_lr, text_batch, "pretrain on stdlib")
    sft_loss = run_phase(recipe.sft_steps, recipe.sft_lr, chat_batch, "SFT chat arithmetic",
                         text_batch_fn=(lambda step: text_batch(step, recipe.sft_text_batch, 128))
                         if recipe.sft_text_batch else None)
    model.eval()
    return model, {"pretrain_loss_last": pretrain_loss, "sft_loss_last": sft_loss}


def held_out_entropy(model, tok, held_texts: list[str], windows: int = 64, seq_len: int = 256,
                     seed: int = 10**6) -> dict:
    """Next-token cross-entropy and predictive entropy (nats/token) on windows of held-out files."""
    import numpy as np
    import torch

    stream = token_stream(tok, held_texts)
    starts = np.random.default_rng(seed).integers(0, len(stream) - seq_len - 1, windows)
    ids = torch.from_numpy(np.stack([stream[s: s + seq_len] for s in starts]))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return {"held_out_cross_entropy": float(nll.mean()), "held_out_entropy": float(ent.mean()),
            "held_out_tokens": int(nll.numel())}


def greedy_eval(model, tok, n: int = 200, seed: int = 10**6, max_digits: int = 3, max_new_tokens: int = 48) -> dict:
    """Greedy accuracy, reversed-answer share and completion length on `n` held-out chat problems."""
    import torch

    problems = tasks.make_problems(n, seed=seed, max_digits=max_digits)
    prompts = [chat_prompt_ids(tok, p.question) for p in problems]
    pad, eos = tok.convert_tokens_to_ids(bpe.PAD), tok.convert_tokens_to_ids(bpe.IM_END)
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=pad, eos_token_id=eos)
    rewards, lengths, habit, rows = [], [], 0, []
    for p, seq in zip(problems, out[:, width:].tolist()):
        n_tok = seq.index(eos) + 1 if eos in seq else len(seq)
        text = tok.decode(seq[:n_tok], skip_special_tokens=True)
        r = tasks.reward(p, text)
        rewards.append(r)
        lengths.append(n_tok)
        habit += tasks.is_reversed(p, text)
        rows.append({"prompt": p.question, "completion": text, "target": p.worked_answer, "reward": r})
    return {"greedy_accuracy": sum(rewards) / n, "reversed_answer_frac": habit / n,
            "mean_completion_tokens": sum(lengths) / n, "samples": rows}


def build(recipe: ChatModelRecipe, out: Path, progress: bool = True) -> tuple[object, dict]:
    """Train and save into `out` (a fresh directory); returns (model, card fields)."""
    import sys
    import time

    t0 = time.time()
    train_texts, held_texts = corpus_split()
    tok = bpe.train_tokenizer(train_texts, recipe.vocab_size)
    model, losses = train(recipe, tok, train_texts, progress=progress)
    build_s = time.time() - t0
    model.save_pretrained(out, safe_serialization=True)
    # transformers 5 writes rope_theta only inside `rope_parameters`; transformers 4.51 (vLLM 0.8.5) reads the
    # top-level key and otherwise silently uses Qwen2's default 1e4. Hub checkpoints carry it; so does this one.
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_theta"] = recipe.rope_theta
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": model.config.eos_token_id, "pad_token_id": model.config.pad_token_id}, indent=2))
    bpe.save_tokenizer(tok, out)
    ev = greedy_eval(model, tok, max_digits=recipe.max_digits)
    ent = held_out_entropy(model, tok, held_texts)
    ev.pop("samples")
    return model, {
        "name": f"rlwb-{recipe.name}",
        "architecture": "Qwen2ForCausalLM (GQA, RoPE theta 1e6, qkv bias, tied embeddings), byte-level BPE "
                        "tokenizer with a ChatML chat template",
        "tokenizer": f"byte-level BPE, {len(tok)} tokens (vocabulary padded to {recipe.padded_vocab_size}), no BOS",
        "corpus": f"Python {'.'.join(map(str, sys.version_info[:3]))} standard library: "
                  f"{len(train_texts)} files pretraining, {len(held_texts)} held out",
        **ev, **ent, **losses, "eval_problems": 200, "build_s": round(build_s, 1),
    }
