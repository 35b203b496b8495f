"""The trainer side: recompute the logprob of each sampled token exactly as the sampler defined it.

Why this is subtle: an engine samples from `softmax(top_p(top_k(z / T)))`, renormalised over the kept
tokens. A trainer that scores with `log_softmax(z)` (raw) or `log_softmax(z / T)` without the truncation
sees a systematic gap that is not numerical noise (vLLM V1's raw-logprob default; TRL issue 6789 for the
top-p/top-k renormalisation). `process_logits` reproduces vLLM's order and tie rules exactly.

Memory: only completion positions are projected through the lm_head, in chunks, so a full fp32
`[batch, seq, vocab]` log-softmax is never materialised (matters for 150k-token vocabularies).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlwb.core.fields import DTYPES


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """fp32 logits of the sampling distribution: z / T, then top-k, then top-p (masked with -inf).

    Mirrors vLLM's `apply_top_k_top_p` (sort ascending; top-k keeps values >= the k-th largest, so ties
    are kept; top-p drops the prefix whose cumulative probability is <= 1 - p, always keeping the top
    token). Temperature <= 0 means greedy, which both vLLM engines score with T = 1.
    """
    z = logits.float()
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    if (top_k is None or top_k <= 0) and (top_p is None or top_p >= 1.0):
        return z
    z_sort, idx = z.sort(dim=-1, descending=False)
    if top_k and 0 < top_k < z.shape[-1]:
        kth = z_sort.gather(-1, torch.full((*z.shape[:-1], 1), z.shape[-1] - top_k, dtype=torch.long,
                                            device=z.device))
        z_sort = z_sort.masked_fill(z_sort < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        cum = z_sort.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1 - top_p
        drop[..., -1] = False
        z_sort = z_sort.masked_fill(drop, float("-inf"))
    return z_sort.scatter(-1, idx, z_sort)


@dataclass
class Batch:
    """Right-padded prompt+completion tokens. Right padding keeps positions 0..n-1 for real tokens, so
    causal attention gives every real token exactly the context it had in the engine."""

    input_ids: torch.Tensor  # [B, S]
    attention_mask: torch.Tensor  # [B, S]
    completion_mask: torch.Tensor  # [B, S] True where input_ids[b, s] is a completion token
    completion_lens: list[int]


def make_batch(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int = 0) -> Batch:
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    width = max((len(s) for s in seqs), default=1)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    cmask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (p, s) in enumerate(zip(prompt_ids, seqs)):
        if len(p) == 0:
            raise ValueError(f"sequence {i} has an empty prompt: the first token has no context to be scored")
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attn[i, : len(s)] = 1
        cmask[i, len(p): len(s)] = True
    return Batch(ids, attn, cmask, [len(c) for c in completion_ids])


def completion_logprobs(model, batch: Batch, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                        raw: bool = False, full: bool = False, entropy: bool = False,
                        chunk_tokens: int = 2048) -> dict[str, torch.Tensor]:
    """Per completion token: logprob under the sampling distribution (`logp`, differentiable when grad is
    on), and optionally the T=1 logprob (`logp_raw`), the entropy of the sampling distribution
    (`entropy`) and the full processed log-distribution (`full`, [n_tokens, V]).

    Tensors are flat over the completion tokens of the batch in row-major order ([n_tokens]).
    """
    device = next(model.parameters()).device
    ids, attn = batch.input_ids.to(device), batch.attention_mask.to(device)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, S, H]
    # The token at position s is predicted from the hidden state at s - 1.
    pred_mask = batch.completion_mask[:, 1:].to(device)
    h = hidden[:, :-1][pred_mask]  # [n_tokens, H]
    targets = ids[:, 1:][pred_mask]  # [n_tokens]
    head = model.get_output_embeddings()
    out: dict[str, list[torch.Tensor]] = {"logp": []}
    for k, on in (("logp_raw", raw), ("full", full), ("entropy", entropy)):
        if on:
            out[k] = []
    for s in range(0, h.shape[0], chunk_tokens):
        z = head(h[s: s + chunk_tokens]).float()
        t = targets[s: s + chunk_tokens, None]
        lp = process_logits(z, temperature, top_k, top_p).log_softmax(-1)
        out["logp"].append(lp.gather(-1, t).squeeze(-1))
        if raw:
            out["logp_raw"].append(z.log_softmax(-1).gather(-1, t).squeeze(-1))
        if full:
            out["full"].append(lp.detach())
        if entropy:  # a statistic, never differentiated: no graph kept for it when grad is on
            d = lp.detach()
            p = d.exp()
            out["entropy"].append(-(p * d.masked_fill(p == 0, 0.0)).sum(-1))
    return {k: (torch.cat(v) if v else torch.zeros(0, device=device)) for k, v in out.items()}


def split_by_lengths(flat: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(lengths)[:-1]) if lengths else []


class TrainerScorer:
    """A transformers causal LM in a chosen dtype that scores engine rollouts (no grad)."""

    def __init__(self, model: str | Path | torch.nn.Module, dtype: str = "float32", device: str = "auto",
                 attn_implementation: str | None = None):
        """`device="auto"`: CUDA when available (a GPU box), else CPU. `attn_implementation`: transformers' attention
        kernel (`sdpa`, `eager`, ...; None = transformers' choice, sdpa here), so a trainer's own setting can be
        matched. The checkpoint's generation_config.json plays no part: scoring computes the logits and applies
        only the temperature, top-k and top-p it is given."""
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype not in DTYPES:
            raise ValueError(f"trainer dtype must be one of {list(DTYPES)}, got {dtype!r}")
        if isinstance(model, torch.nn.Module):
            self.model = model
        else:
            from transformers import AutoModelForCausalLM

            kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
            self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype), **kw)
        self.model.to(device=device, dtype=getattr(torch, dtype)).eval()
        self.dtype, self.device = dtype, device
        self.attn_implementation = getattr(self.model.config, "_attn_implementation", attn_implementation)

    def describe(self) -> dict:
        """What this scorer is, for the archive."""
        return {"kind": "hf", "dtype": self.dtype, "attn_implementation": self.attn_implementation,
                "device": self.device}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    @torch.no_grad()
    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0,
              top_k: int = 0, top_p: float = 1.0, raw: bool = False, full: bool = False,
              entropy: bool = False, batch_size: int = 64) -> dict[str, list[np.ndarray]]:
        """Per sequence arrays: `logp` (and `logp_raw`, `full` [L, V], `entropy` of the sampling distribution
        when asked)."""
        from rlwb import timing

        with timing.phase("scoring"):
            return self._score(prompt_ids, completion_ids, temperature, top_k, top_p, raw, full, entropy,
                               batch_size)

    def _score(self, prompt_ids, completion_ids, temperature, top_k, top_p, raw, full, entropy,
               batch_size) -> dict[str, list[np.ndarray]]:
        res: dict[str, list[np.ndarray]] = {"logp": []}
        for k, on in (("logp_raw", raw), ("full", full), ("entropy", entropy)):
            if on:
                res[k] = []
        heads = int(getattr(self.model.config, "num_attention_heads", 1))
        for s, e in score_batches([len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)], batch_size, heads):
            b = make_batch(prompt_ids[s:e], completion_ids[s:e])
            out = completion_logprobs(self.model, b, temperature, top_k, top_p, raw=raw, full=full, entropy=entropy)
            for k in res:
                res[k].extend(split_by_lengths(out[k].cpu().numpy(), b.completion_lens))
        return res


# fp32 attention scores + softmax one forward may hold: b x heads x S^2 x 8 bytes. Measured on an H100 with a
# Qwen2.5-0.5B shape: a batch without padding (or a single sequence) takes SDPA's math path, which
# materialises them (64 x 2,432 tokens: 53 GiB peak; one 32k-token sequence: a 53 GiB allocation).
ATTENTION_BUDGET_BYTES = 8 * 1024**3


def score_batches(seq_lens: list[int], batch_size: int, heads: int,
                  budget: int = ATTENTION_BUDGET_BYTES) -> list[tuple[int, int]]:
    """[start, end) ranges over the sequences, in order: at most `batch_size` each, and a new batch whenever
    the padded batch's attention scores would pass `budget` (a sequence over it alone is scored alone)."""
    out, start, longest = [], 0, 0
    for i, n in enumerate(seq_lens):
        wider = max(longest, n)
        if i > start and (i - start >= batch_size or (i - start + 1) * heads * wider**2 * 8 > budget):
            out.append((start, i))
            start, wider = i, n
        longest = wider
    if start < len(seq_lens):
        out.append((start, len(seq_lens)))
    return out
