"""The trainer side: recompute the logprob of each sampled token exactly as the sampler defined it.

Why this is subtle: an engine samples from `softmax(top_p(top_k(z / T)))`, renormalised over the kept
tokens. A trainer that scores with `log_softmax(z)` (raw) or `log_softmax(z / T)` without the truncation
sees a systematic gap that is not numerical noise (vLLM V1's raw-logprob default; TRL issue 6789 for the
top-p/top-k renormalisation). `process_logits` reproduces vLLM's order and tie rules exactly.

Memory: only completion positions are projected through the lm_head, in chunks, so a full fp32
`[batch, seq, vocab]` log-softmax is never materialised (matters for 150k-token vocabularies).

Trainer settings (`rlwb.core.scoring.trainer_choices`: dtype, autocast, attention implementation, batch layout, grad,
checkpointing, compile, an fp32 head) are applied here (`apply_setting`) and scored through the same loop as the
scorer (`score_sequences`), so notebook 09 measures rlwb's own scoring code, not a second scorer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlwb.core.checked_fields import DTYPES
from rlwb.core.scoring.trainer_choices import PADDING_SIDES, TrainerSetting

SCORE_BATCH = 64  # sequences per forward of the scorer (TrainerScorer.score's default)
Head = Callable[[torch.Tensor], torch.Tensor]  # hidden states -> logits: a model's lm_head, or an fp32 head over it


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Logits of the sampling distribution: z / T, then top-k, then top-p (masked with -inf). In fp32, as peers
    take their log-softmax, whatever the trainer's dtype; float64 stays float64, so a float64 reference is not
    rounded to fp32 in its last step (its floor would be fp32's, ~2^-19 at |logp| 12, not float64's).

    Mirrors vLLM's `apply_top_k_top_p` (sort ascending; top-k keeps values >= the k-th largest, so ties
    are kept; top-p drops the prefix whose cumulative probability is <= 1 - p, always keeping the top
    token). Temperature <= 0 means greedy, which both vLLM engines score with T = 1.
    """
    z = logits if logits.dtype == torch.float64 else logits.float()
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
    """Prompt+completion tokens, one sequence per row (right-padded unless made otherwise). Right padding keeps
    positions 0..n-1 for real tokens, so causal attention gives every real token exactly the context it had in
    the engine. `position_ids` is set where positions are not the column index: left padding, packed rows."""

    input_ids: torch.Tensor  # [B, S]
    attention_mask: torch.Tensor | None  # [B, S]; None for packed rows (positions separate the sequences)
    completion_mask: torch.Tensor  # [B, S] True where input_ids[b, s] is a completion token
    completion_lens: list[int]
    position_ids: torch.Tensor | None = None  # [B, S]

    def rows(self, sl: slice) -> Batch:
        """Rows `sl` at this batch's width: each row's padding, and so its forward's shapes, stay as they are."""
        cut = (lambda t: None if t is None else t[sl])
        return Batch(self.input_ids[sl], cut(self.attention_mask), self.completion_mask[sl],
                     self.completion_lens[sl], cut(self.position_ids))


def make_batch(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int = 0,
               padding: str = "right") -> Batch:
    """One row per sequence. `padding="left"`: the pads go first and positions come from the attention mask
    (verl's `compute_position_id_with_mask`: cumsum - 1, pads at 0), so real tokens keep positions 0..n-1."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if padding not in PADDING_SIDES:
        raise ValueError(f"padding must be one of {PADDING_SIDES}, got {padding!r}")
    seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)]
    width = max((len(s) for s in seqs), default=1)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    cmask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (p, s) in enumerate(zip(prompt_ids, seqs)):
        if len(p) == 0:
            raise ValueError(f"sequence {i} has an empty prompt: the first token has no context to be scored")
        at = 0 if padding == "right" else width - len(s)
        ids[i, at: at + len(s)] = torch.tensor(s, dtype=torch.long)
        attn[i, at: at + len(s)] = 1
        cmask[i, at + len(p): at + len(s)] = True
    pos = (attn.cumsum(-1) - 1).clamp(min=0) if padding == "left" else None
    return Batch(ids, attn, cmask, [len(c) for c in completion_ids], pos)


def pack_batch(prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> Batch:
    """All sequences back to back in one row, no padding and no attention mask: `position_ids` restart at 0 for
    each sequence, which transformers reads as packed sequences and masks block-causally
    (`masking_utils.find_packed_sequence_indices`), the layout TRL's `padding_free` and verl's remove-padding
    trainers use."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    ids, pos, cmask = [], [], []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if len(p) == 0:
            raise ValueError(f"sequence {i} has an empty prompt: the first token has no context to be scored")
        ids += list(p) + list(c)
        pos += range(len(p) + len(c))
        cmask += [False] * len(p) + [True] * len(c)
    row = (lambda x, dt: torch.tensor([x], dtype=dt))
    return Batch(row(ids, torch.long), None, row(cmask, torch.bool), [len(c) for c in completion_ids],
                 row(pos, torch.long))


def completion_logprobs(model, batch: Batch, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                        raw: bool = False, full: bool = False, entropy: bool = False,
                        chunk_tokens: int = 2048, head: Head | None = None) -> dict[str, torch.Tensor]:
    """Per completion token: logprob under the sampling distribution (`logp`, differentiable when grad is
    on), and optionally the T=1 logprob (`logp_raw`), the entropy of the sampling distribution
    (`entropy`) and the full processed log-distribution (`full`, [n_tokens, V]).

    Tensors are flat over the completion tokens of the batch in row-major order ([n_tokens]). `head`: what
    projects the hidden states to logits instead of the model's own lm_head (an fp32 head over 16-bit weights:
    it gets the hidden states in their own dtype and casts them itself).
    """
    device = next(model.parameters()).device
    put = (lambda t: None if t is None else t.to(device))
    ids = batch.input_ids.to(device)
    # no KV cache: with one (transformers' default in eval mode) packed rows are not detected and attend across
    # their sequences (measured: k3 4.4 against the unpacked forward on the default model, transformers 5.19)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=put(batch.attention_mask),
                                 position_ids=put(batch.position_ids), use_cache=False).last_hidden_state  # [B, S, H]
    # The token at position s is predicted from the hidden state at s - 1.
    pred_mask = batch.completion_mask[:, 1:].to(device)
    h = hidden[:, :-1][pred_mask]  # [n_tokens, H]
    targets = ids[:, 1:][pred_mask]  # [n_tokens]
    head = head if head is not None else model.get_output_embeddings()
    out: dict[str, list[torch.Tensor]] = {"logp": []}
    for k, on in (("logp_raw", raw), ("full", full), ("entropy", entropy)):
        if on:
            out[k] = []
    for s in range(0, h.shape[0], chunk_tokens):
        z = head(h[s: s + chunk_tokens])
        z = z if z.dtype == torch.float64 else z.float()  # fp32 log-softmax as peers take it; float64 kept
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
              entropy: bool = False, batch_size: int = SCORE_BATCH) -> dict[str, list[np.ndarray]]:
        """Per sequence arrays: `logp` (and `logp_raw`, `full` [L, V], `entropy` of the sampling distribution
        when asked)."""
        from rlwb import timing

        with timing.phase("scoring"):
            return self._score(prompt_ids, completion_ids, temperature, top_k, top_p, raw, full, entropy,
                               batch_size)

    def _score(self, prompt_ids, completion_ids, temperature, top_k, top_p, raw, full, entropy,
               batch_size) -> dict[str, list[np.ndarray]]:
        return score_sequences(self.model, prompt_ids, completion_ids, temperature, top_k, top_p, raw=raw, full=full,
                               entropy=entropy, batch_size=batch_size)


def score_sequences(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0, *, raw: bool = False, full: bool = False,
                    entropy: bool = False, batch_size: int = SCORE_BATCH, padding: str = "right", packed: bool = False,
                    head: Head | None = None, backward: bool = False) -> dict[str, list[np.ndarray]]:
    """Per sequence arrays of `completion_logprobs`, in batches cut by `score_batches`: the scorer's loop, with the
    batch layouts a trainer may choose (`padding`, `packed`: each batch as one packed row) and a `head` override.
    `backward`: after each batch's forward, backpropagate its summed logprobs (the update's micro-step: grad must
    be on); the logprobs returned are the forward's."""
    res: dict[str, list[np.ndarray]] = {"logp": []}
    for k, on in (("logp_raw", raw), ("full", full), ("entropy", entropy)):
        if on:
            res[k] = []
    heads = int(getattr(model.config, "num_attention_heads", 1))
    lens = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    # a packed row's attention covers its whole length: cut as if it were one sequence of the batch's tokens
    for s, e in score_batches(lens, batch_size, heads, packed=packed):
        b = (pack_batch(prompt_ids[s:e], completion_ids[s:e]) if packed
             else make_batch(prompt_ids[s:e], completion_ids[s:e], padding=padding))
        out = completion_logprobs(model, b, temperature, top_k, top_p, raw=raw, full=full, entropy=entropy, head=head)
        if backward:
            out["logp"].sum().backward()
        for k in res:
            res[k].extend(split_by_lengths(out[k].detach().cpu().numpy(), b.completion_lens))
    return res


def batch_logprobs(model, batch: Batch, temperature: float = 1.0, *, entropy: bool = False,
                   batch_size: int = SCORE_BATCH) -> dict[str, torch.Tensor]:
    """`completion_logprobs` of a whole batch in slices of its rows cut as the scorer cuts (at most `batch_size`
    rows, attention scores under `ATTENTION_BUDGET_BYTES`), the slices as even as that allows and each at the
    batch's own width: the largest forward is bounded (a GRPO step's 256 x 768-token no-grad pass is not one
    forward) while each row is computed as in the whole batch (bitwise on CPU: tested; a one-row forward takes
    other GEMM paths here, which even slices avoid once the batch has two rows per slice)."""
    n, width = batch.input_ids.shape
    heads = int(getattr(model.config, "num_attention_heads", 1))
    cuts = len(score_batches([width] * n, batch_size, heads))
    if cuts <= 1:
        return completion_logprobs(model, batch, temperature, entropy=entropy)
    bounds = np.linspace(0, n, cuts + 1).round().astype(int)
    parts = [completion_logprobs(model, batch.rows(slice(s, e)), temperature, entropy=entropy)
             for s, e in zip(bounds[:-1], bounds[1:])]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


@dataclass
class AppliedSetting:
    """A trainer setting (`rlwb.core.scoring.trainer_choices`) applied to a copy of the master weights: the model, its
    head override and the device autocast runs on."""

    setting: TrainerSetting
    model: torch.nn.Module
    head: FP32Head | None  # None: the model's own lm_head
    device: str

    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float, *,
              batch_size: int, setting: TrainerSetting | None = None) -> list:
        """Per-sequence logprobs (numpy, float64) of `setting` (default: the one applied; its `batch1()` or
        `old_pass()` share the model), through the scorer's loop."""
        s = setting or self.setting
        cast = (torch.autocast(self.device, dtype=getattr(torch, s.autocast)) if s.autocast
                else contextlib.nullcontext())
        with torch.set_grad_enabled(s.grad), cast:
            out = score_sequences(self.model, prompt_ids, completion_ids, temperature, batch_size=s.batch or batch_size,
                                  padding=s.padding, packed=s.packed, head=self.head, backward=s.grad)
        if s.grad:
            self.model.zero_grad(set_to_none=True)
        return [x.astype("float64") for x in out["logp"]]


class FP32Head:
    """The lm_head in fp32 from the fp32 master weights, whatever the body's dtype or autocast: hidden states are
    cast up and projected outside autocast (what an fp32-head trainer does; rlwb's engine hook does the same on
    the engine side)."""

    def __init__(self, master_head: torch.nn.Module):
        self.weight = master_head.weight.detach().float().clone()
        self.bias = None if getattr(master_head, "bias", None) is None else master_head.bias.detach().float().clone()

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        with torch.autocast(h.device.type, enabled=False):
            return torch.nn.functional.linear(h.float(), self.weight, self.bias)


def apply_setting(master: torch.nn.Module, setting: TrainerSetting) -> AppliedSetting:
    """A copy of `master` (the fp32 weights) computing as `setting` says. Raises the library's own error where a
    setting cannot run here (an attention implementation without its package, a dtype without kernels)."""
    import copy

    device = next(master.parameters()).device
    model = copy.deepcopy(master).to(dtype=getattr(torch, setting.dtype))
    model.set_attn_implementation(setting.attn)
    if setting.checkpointing:
        model.gradient_checkpointing_enable()
        model.train()  # transformers checkpoints only in training mode (these models have no dropout)
    else:
        model.eval()
    model.requires_grad_(setting.grad)
    if setting.compile:
        model.get_decoder().compile(dynamic=True)
    head = FP32Head(master.get_output_embeddings()) if setting.fp32_head else None
    return AppliedSetting(setting, model, head, device.type)


# fp32 attention scores + softmax one forward may hold: b x heads x S^2 x 8 bytes. Measured on an H100 with a
# Qwen2.5-0.5B shape: a batch without padding (or a single sequence) takes SDPA's math path, which
# materialises them (64 x 2,432 tokens: 53 GiB peak; one 32k-token sequence: a 53 GiB allocation).
ATTENTION_BUDGET_BYTES = 8 * 1024**3


def score_batches(seq_lens: list[int], batch_size: int, heads: int, budget: int = ATTENTION_BUDGET_BYTES,
                  packed: bool = False) -> list[tuple[int, int]]:
    """[start, end) ranges over the sequences, in order: at most `batch_size` each, and a new batch whenever
    the padded batch's attention scores would pass `budget` (a sequence over it alone is scored alone).
    `packed`: each batch becomes one row of all its tokens, whose scores grow with the square of their sum."""
    out, start, longest, total = [], 0, 0, 0
    for i, n in enumerate(seq_lens):
        wider = max(longest, n)
        scores = heads * (total + n) ** 2 * 8 if packed else (i - start + 1) * heads * wider**2 * 8
        if i > start and (i - start >= batch_size or scores > budget):
            out.append((start, i))
            start, wider, total = i, n, 0
        longest, total = wider, total + n
    if start < len(seq_lens):
        out.append((start, len(seq_lens)))
    return out


def greedy_rewards(model, codec, problems: list, max_new_tokens: int) -> np.ndarray:
    """The task reward of `model`'s greedy answer to each problem (prompts through `codec`, as the engines get them;
    left padding, one batch): how good a trained policy itself is, with no engine in between. Notebook 08 evaluates
    every trained policy so, because a run's training reward is measured on what its engine sampled, and an engine
    sampling with perturbed or stale weights is not the policy the run trained."""
    from rlwb.core.data import tasks

    prompts = [codec.encode_task(p) for p in problems]
    gen = model.generation_config
    eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    pad = next(x for x in (gen.pad_token_id, model.config.pad_token_id, eos[0]) if x is not None)
    dev = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev), do_sample=False, num_beams=1,
                             repetition_penalty=1.0, max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=eos)
    rewards = []
    for p, seq in zip(problems, out[:, width:].tolist()):
        end = next((i for i, t in enumerate(seq) if t in eos), len(seq))
        rewards.append(tasks.reward(p, codec.decode(seq[:end])))
    return np.asarray(rewards, dtype=np.float64)
