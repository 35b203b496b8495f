"""The trainer's own choices when it computes logprobs, as small typed records validated before any compute.

Why: every engine-vs-trainer number holds the engine against one fixed trainer, rlwb's fp32 scorer. Real trainers
are not that scorer: they score the old logprobs in one micro-batch size and train in another, pad left or right
or pack sequences, run bf16 weights or autocast, pick an attention kernel, checkpoint activations, compile, and
cast the lm_head to fp32 (or not). Each of these can move the trainer's logprobs by itself; NeMo-RL's fp32-head
work reports that casting the head on one side only makes the mismatch worse, and verl and NeMo-RL users report
trainers that disagree with themselves across micro-batch sizes. Notebook 09 measures each against a float64
forward of the same weights.

A setting is a `TrainerSetting`: what differs from rlwb's scorer (fp32 weights, SDPA, the scorer's batches,
right padding, no grad). It is named by catalogue entries joined with `+` (`bf16+fp32-head`,
`mb4+grad+checkpointing`; `mb<N>` is a micro-batch of N sequences); `parse_setting` turns a name into a record and
refuses unknown entries, two entries that set one field differently and combinations that mean nothing (an fp32
head over fp32 weights, left padding of one sequence) before any compute. Applying a setting is the trainer's
business (`rlwb.core.scoring.trainer.apply_setting`, which scores through the scorer's own loop); this module imports no
torch, so parameter validation stays light.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace

from rlwb.core.checked_fields import DTYPES

REFERENCE_DTYPE = "float64"
AUTOCAST_DTYPES = ("bfloat16", "float16")
# transformers' attention implementations a trainer picks by name (`attn_implementation`); one that cannot run
# on a machine (flash attention without its package or a GPU) is measured as a row with the library's error
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
PADDING_SIDES = ("right", "left")  # what `rlwb.core.scoring.trainer.make_batch` accepts


@dataclass(frozen=True)
class TrainerSetting:
    """How a trainer computes logprobs; the defaults are rlwb's scorer (`TrainerScorer`)."""

    name: str = field(default="fp32", compare=False)  # how the setting was asked for: display only
    dtype: str = "float32"  # weights (and activations): float32, bfloat16, float16; float64 for the reference
    autocast: str = ""  # "" or bfloat16 / float16: torch.autocast over fp32 weights
    attn: str = "sdpa"  # transformers' attn_implementation
    batch: int = 0  # sequences per forward; 0: the scorer's batches (rlwb.core.scoring.trainer.SCORE_BATCH)
    padding: str = "right"  # right / left (positions from the attention mask, as verl)
    packed: bool = False  # each batch as one row, position_ids restarting per sequence, no padding
    grad: bool = False  # autograd on, forward then backward of the summed logprobs (the update's micro-step)
    checkpointing: bool = False  # gradient checkpointing (transformers' gradient_checkpointing_enable)
    compile: bool = False  # torch.compile of the decoder
    fp32_head: bool = False  # the lm_head projects in fp32 from fp32 master weights

    def __post_init__(self):
        problem = self._problem()
        if problem:
            raise ValueError(f"trainer setting {self.name!r}: {problem}")

    def _problem(self) -> str | None:
        if self.dtype not in (*DTYPES, REFERENCE_DTYPE):
            return f"dtype must be one of {[*DTYPES, REFERENCE_DTYPE]}, got {self.dtype!r}"
        if self.autocast not in ("", *AUTOCAST_DTYPES):
            return f"autocast must be one of {list(AUTOCAST_DTYPES)}, got {self.autocast!r}"
        if self.autocast and self.dtype != "float32":
            return f"autocast runs over fp32 weights, not {self.dtype} ones (use the dtype alone)"
        if self.attn not in ATTN_IMPLEMENTATIONS:
            return f"attention must be one of {list(ATTN_IMPLEMENTATIONS)}, got {self.attn!r}"
        if self.batch < 0:
            return f"batch must be >= 0 (0: the scorer's batches), got {self.batch}"
        if self.padding not in PADDING_SIDES:
            return f"padding must be one of {list(PADDING_SIDES)}, got {self.padding!r}"
        if self.packed and self.padding != "right":
            return "packed sequences have no padding (packed and left padding exclude each other)"
        if self.batch == 1 and (self.packed or self.padding != "right"):
            return "one sequence per forward has nothing to pack or pad: drop packed / left-pad, or use a larger batch"
        if self.checkpointing and not self.grad:
            return "gradient checkpointing acts only with grad on"
        if self.fp32_head and self.dtype in ("float32", REFERENCE_DTYPE) and not self.autocast:
            return f"an fp32 head over {self.dtype} weights without autocast changes nothing"
        return None

    def batch1(self) -> TrainerSetting:
        """The same computation with one sequence per forward: what the setting's batch invariance is held to."""
        return replace(self, name=f"{self.name} (batch 1)", batch=1, padding="right", packed=False)

    def old_pass(self) -> TrainerSetting:
        """For an update's setting (grad on): the no-grad pass over the scorer's batches that gave its old
        logprobs, in the same numerics (its PPO ratio at the first micro-step is update / old)."""
        return replace(self, name=f"{self.name} (old-logprob pass)", grad=False, checkpointing=False, batch=0,
                       padding="right", packed=False)

    def changes(self) -> str:
        """What differs from rlwb's scorer, in words ("rlwb's scorer as it is" when nothing)."""
        base, out = TrainerSetting(), []
        for f in fields(self):
            if f.compare and getattr(self, f.name) != getattr(base, f.name):
                out.append(f"{f.name}={getattr(self, f.name)}")
        return ", ".join(out) or "rlwb's scorer as it is"


# name -> (the fields it sets, what it means). `mb<N>` (a micro-batch of N sequences) is an entry too.
CATALOG: dict[str, tuple[dict, str]] = {
    "fp32": ({}, "rlwb's scorer: fp32 weights, SDPA, the scorer's batches (up to 64 sequences), right padding"),
    "fp64": ({"dtype": REFERENCE_DTYPE}, "float64 weights in the scorer's batches (the reference's own control)"),
    "bf16": ({"dtype": "bfloat16"}, "bf16 weights and activations, lm_head included"),
    "fp16": ({"dtype": "float16"}, "fp16 weights and activations, lm_head included"),
    "bf16-autocast": ({"autocast": "bfloat16"}, "torch.autocast to bf16 over fp32 weights (mixed precision)"),
    "fp16-autocast": ({"autocast": "float16"}, "torch.autocast to fp16 over fp32 weights"),
    "fp32-head": ({"fp32_head": True}, "lm_head in fp32 from fp32 master weights"),
    "sdpa": ({"attn": "sdpa"}, "torch's scaled_dot_product_attention (transformers' default)"),
    "eager": ({"attn": "eager"}, "transformers' eager attention (matmul + softmax)"),
    "flex": ({"attn": "flex_attention"}, "torch's flex_attention (compiled)"),
    "flash2": ({"attn": "flash_attention_2"}, "FlashAttention 2 (CUDA, its own package)"),
    "flash3": ({"attn": "flash_attention_3"}, "FlashAttention 3 (Hopper GPUs, its own package)"),
    "batch1": ({"batch": 1}, "one sequence per forward, no padding"),
    "left-pad": ({"padding": "left"}, "left padding, positions from the attention mask (verl)"),
    "packed": ({"packed": True}, "each batch packed into one row, position_ids restarting (TRL padding_free)"),
    "grad": ({"grad": True}, "autograd on: forward and backward of the update's micro-step"),
    "checkpointing": ({"checkpointing": True, "grad": True}, "gradient checkpointing (grad on)"),
    "compile": ({"compile": True}, "torch.compile of the decoder"),
}
MICRO_BATCH = re.compile(r"^mb([1-9]\d*)$")


def _entry(token: str) -> tuple[dict, str]:
    if token in CATALOG:
        return CATALOG[token]
    m = MICRO_BATCH.match(token)
    if m:
        return {"batch": int(m.group(1))}, f"{m.group(1)} sequences per forward"
    raise ValueError(f"unknown trainer setting entry {token!r}; known: {', '.join(CATALOG)}, mb<N> "
                     f"(N sequences per forward)")


def parse_setting(name: str) -> TrainerSetting:
    """`bf16+fp32-head` -> the record: entries applied left to right; an entry twice, or two entries that set one
    field to different values, is an error (a ValueError naming them), as is a combination `TrainerSetting`
    refuses."""
    tokens = [t.strip() for t in str(name).split("+")]
    if not all(tokens):
        raise ValueError(f"trainer setting {name!r}: an empty entry (entries are joined by single '+')")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"trainer setting {name!r} lists an entry twice")
    values: dict = {}
    set_by: dict[str, str] = {}
    for t in tokens:
        for k, v in _entry(t)[0].items():
            if k in values and values[k] != v:
                raise ValueError(f"trainer setting {name!r}: {set_by[k]!r} and {t!r} both set {k} "
                                 f"({values[k]!r} vs {v!r})")
            values[k], set_by[k] = v, t
    return TrainerSetting(name=name, **values)


def describe(name: str) -> str:
    """What a setting name's entries mean, for the report's table."""
    return "; ".join(_entry(t.strip())[1] for t in name.split("+"))


def check_setting(name: str) -> str | None:
    """The schemas' check: None for a valid setting name, else the reason (one line)."""
    try:
        parse_setting(name)
    except ValueError as e:
        return str(e)
    return None


REFERENCE = TrainerSetting(name="float64 reference", dtype=REFERENCE_DTYPE, batch=1)
