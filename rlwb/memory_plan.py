"""GPU memory plan of a notebook run: how much of one GPU the trainer and each engine may use.

Why: vLLM reserves `gpu_memory_utilization` of the *whole* GPU (0.9 by default) when it starts. On one GPU,
notebook 03 trains the fp32 policy with AdamW beside a running engine and notebook 05 starts a second engine
(memory pressure) while the first runs: with vLLM's default the trainer runs out of memory and the second
engine refuses to start, minutes or hours into a run. The plan splits the GPU up front from the model's
shape, the notebook's needs and the GPU's size, fails before any compute when the pieces cannot fit, and
is written into `run.json` so a run states what it assumed.

The estimates are deliberately simple and on the safe side (bytes per parameter, a KV cache for one
full-length sequence, a fixed CUDA/allocator overhead); they decide whether a configuration can work and
what each engine may reserve, not how fast it runs. Sources: AdamW in fp32 keeps weights + grads + two
moments = 16 bytes/parameter (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1); activation memory of a
transformer layer ~34·s·b·h bytes in 16-bit without recomputation (Korthikanti et al. 2022, sec. 4.1),
doubled here for fp32; vLLM's KV cache holds 2·layers·kv_heads·head_dim values per token.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from rlwb.engines.presets import GPU_SHARE_ENV
from rlwb.errors import MemoryPlanError

GiB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# What every process on a GPU costs before holding anything: CUDA context, cuBLAS workspace, allocator slack.
PROCESS_OVERHEAD = 1.0 * GiB
# An engine's working memory beyond weights and KV cache: CUDA graphs, activations of the largest batch,
# the sampler's logits. vLLM's own profiling measures it at start; this is its planning allowance.
ENGINE_WORKSPACE = 2.0 * GiB
TRAINER_ROLES = ("none", "score", "score2", "settings", "train")


@dataclass(frozen=True)
class Needs:
    """What a notebook run holds on the GPU besides its engines' shares (each notebook's record in
    `rlwb.registry` declares its own). `role`: "score" an fp32 scorer, no grad; "score2" two of them side by side;
    "settings" an fp32 master, its float64 copy (two fp32 copies' worth) and one variant of it at a time
    (notebook 09), whose forwards may run in float64; "train" the fp32 policy with AdamW and a copy of its initial
    weights (every run restarts from them); "none" no trainer on the GPU."""

    engines_at_once: int  # engine processes alive at once in one run
    role: str

    def __post_init__(self):
        if self.role not in TRAINER_ROLES or self.engines_at_once < 0:
            raise ValueError(f"memory needs: role must be one of {TRAINER_ROLES} and engines_at_once >= 0, got "
                             f"{self.role!r}, {self.engines_at_once}")





@dataclass(frozen=True)
class ModelShape:
    """The parts of a transformers config the plan needs."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    head_dim: int | None = None

    @classmethod
    def from_config(cls, cfg) -> ModelShape:
        get = (lambda k, d=None: cfg.get(k, d)) if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        return cls(hidden_size=get("hidden_size"), num_hidden_layers=get("num_hidden_layers"),
                   num_attention_heads=get("num_attention_heads"),
                   num_key_value_heads=get("num_key_value_heads") or get("num_attention_heads"),
                   intermediate_size=get("intermediate_size"), vocab_size=get("vocab_size"),
                   max_position_embeddings=get("max_position_embeddings"),
                   tie_word_embeddings=bool(get("tie_word_embeddings", False)), head_dim=get("head_dim"))

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * (self.head_dim or self.hidden_size // self.num_attention_heads)

    def params(self) -> int:
        """Parameters of a Llama/Qwen2-style decoder (q/k/v biases counted; they are tiny either way)."""
        h, kv, i = self.hidden_size, self.kv_dim, self.intermediate_size
        attn = h * h + 2 * h * kv + h * h + h + 2 * kv
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h
        return embed * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * per_layer + h

    def kv_bytes_per_token(self, dtype: str) -> int:
        return 2 * self.num_hidden_layers * self.kv_dim * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class MemoryPlan:
    notebook: str
    gpu_gib: float
    model_params: int
    engine_dtype: str
    engines_at_once: int
    trainer_gib: float
    engine_min_gib: float  # weights + one full-length sequence's KV cache + workspace
    engine_gib: float  # what each engine may reserve (>= engine_min_gib when the plan fits)
    kv_cache_gib: float  # of which KV cache
    gpu_memory_utilization: float  # vLLM's argument: engine_gib / gpu_gib

    def as_dict(self) -> dict:
        return {"device": "cuda", **asdict(self)}


MARGIN = 1.10  # on top of every trainer estimate: allocator rounding, temporaries the formulas leave out


def trainer_bytes(shape: ModelShape, role: str, seqs: int, seq_len: int) -> int:
    """The trainer process's peak on the GPU for a notebook role (see `Needs`): `seqs` sequences of
    `seq_len` tokens in one forward (the scorer's batch, or the policy update's micro-batch)."""
    n = shape.params()
    h, L, V, a = shape.hidden_size, shape.num_hidden_layers, shape.vocab_size, shape.num_attention_heads
    tokens = seqs * seq_len
    attn_scores = seqs * a * seq_len**2 * 4 * 2  # fp32 scores and softmax of every sequence (SDPA's math path)
    if role == "none":
        return 0
    if role in ("score", "score2", "settings"):
        copies = {"score": 1, "score2": 2, "settings": 4}[role]
        # "settings": its float64 forwards hold twice the bytes of an fp32 one
        transient = scoring_transient(shape, seqs, seq_len) * (2 if role == "settings" else 1)
        return int(MARGIN * (copies * 4 * n + transient)) + PROCESS_OVERHEAD
    if role == "train":
        # saved for backward, every layer: ~68·h bytes per token in fp32 (twice the 16-bit 34·s·b·h of
        # Korthikanti et al.) plus the attention scores; every logits chunk's fp32 logits, log-softmax and grad
        activations = tokens * L * 68 * h + L * attn_scores
        logits = tokens * V * 4 * 3
        # before a micro-batched update, GRPO scores the old logprobs of the whole step's batch with no grad, in the
        # scorer's slices (`trainer.batch_logprobs`: up to SCORE_BATCH sequences each); nothing of the update is
        # alive then, so the peak is the larger of the two passes
        from rlwb.core.scoring.trainer import SCORE_BATCH

        old_pass = scoring_transient(shape, SCORE_BATCH, seq_len)
        return int(MARGIN * (16 * n + 4 * n + max(activations + logits, old_pass))) + PROCESS_OVERHEAD
    raise ValueError(f"unknown trainer role {role!r}")


def scoring_transient(shape: ModelShape, seqs: int, seq_len: int) -> int:
    """Bytes one no-grad fp32 scoring forward of `seqs` x `seq_len` tokens holds beyond the weights: one layer's
    transients at a time (the MLP's three I-wide tensors dominate), the attention scores of the sequences the
    scorer puts in one forward (it cuts its batches at ATTENTION_BUDGET_BYTES; a longer sequence goes alone) and
    a logits chunk (`completion_logprobs` projects 2,048 tokens at a time)."""
    from rlwb.core.scoring.trainer import ATTENTION_BUDGET_BYTES

    one = shape.num_attention_heads * seq_len**2 * 4 * 2  # fp32 scores and softmax of one sequence's layer
    attn = one if one > ATTENTION_BUDGET_BYTES else min(seqs * one, ATTENTION_BUDGET_BYTES // one * one)
    return (seqs * seq_len * (3 * shape.intermediate_size + 4 * shape.hidden_size) * 4 + attn
            + 2048 * shape.vocab_size * 4 * 3)


def plan(notebook: str, needs: Needs, shape: ModelShape, gpu_bytes: int, engine_dtype: str, *,
         max_model_len: int | None = None, seqs: int = 8, seq_len: int = 1024, engines_at_once: int | None = None,
         runs: int = 1) -> MemoryPlan:
    """Split one GPU between the notebook's trainer and its engines; raise MemoryPlanError if it cannot fit.

    `notebook` names the run in messages; `needs` is what it holds (its record in `rlwb.registry`).
    `seqs` x `seq_len`: the trainer's largest forward (the scorer's batch, or GRPO's micro-batch). Each
    engine gets an equal share of what the trainer leaves (minus a 5% margin for fragmentation); its share
    must hold its weights, the KV cache of one `max_model_len` sequence (vLLM refuses to start with less)
    and its workspace. `runs`: GRPO runs trained at once (`concurrent_runs`), each with its own trainer copy
    (in the one trainer process) and its own engines."""
    if engine_dtype not in DTYPE_BYTES:
        raise ValueError(f"engine dtype must be one of {sorted(DTYPE_BYTES)}, got {engine_dtype!r}")
    at_once, role = needs.engines_at_once, needs.role
    at_once = (at_once if engines_at_once is None else engines_at_once) * runs
    n = shape.params()
    ctx = max_model_len or shape.max_position_embeddings
    one = trainer_bytes(shape, role, seqs, seq_len)
    trainer = one + (runs - 1) * max(0, one - PROCESS_OVERHEAD)
    engine_min = n * DTYPE_BYTES[engine_dtype] + ctx * shape.kv_bytes_per_token(engine_dtype) + ENGINE_WORKSPACE
    usable = 0.95 * gpu_bytes
    left = usable - trainer
    per_engine = left / at_once if at_once else 0.0
    need = trainer + at_once * engine_min
    if need > usable:
        parts = [f"trainer ({role}, {seqs} x {seq_len} tokens per forward) {trainer / GiB:.1f} GiB"]
        if at_once:
            parts.append(f"{at_once} engine(s) x {engine_min / GiB:.1f} GiB ({engine_dtype} weights, KV cache of one "
                         f"{ctx}-token sequence, workspace)")
        hint = ("use a smaller micro_batch, concurrent_runs=1, a smaller model, or a larger GPU" if role == "train"
                else "use a smaller model, a 16-bit engine dtype, a shorter max_model_len, or a larger GPU")
        raise MemoryPlanError(f"{notebook} needs ~{need / GiB:.1f} GiB on the GPU ({' + '.join(parts)}) but "
                              f"{usable / GiB:.1f} GiB of this {gpu_bytes / GiB:.0f} GiB GPU are usable: {hint}")
    weights = n * DTYPE_BYTES[engine_dtype]
    return MemoryPlan(notebook=notebook, gpu_gib=round(gpu_bytes / GiB, 2), model_params=n, engine_dtype=engine_dtype,
                      engines_at_once=at_once, trainer_gib=round(trainer / GiB, 2),
                      engine_min_gib=round(engine_min / GiB, 2), engine_gib=round(per_engine / GiB, 2),
                      kv_cache_gib=round(max(0.0, per_engine - weights - ENGINE_WORKSPACE) / GiB, 2),
                      gpu_memory_utilization=round(per_engine / gpu_bytes, 3) if at_once else 0.0)


def plan_for_run(notebook: str, needs: Needs, params) -> dict:
    """The plan of a notebook run on this machine, for run.json: `{"device": "cpu"}` without CUDA, else the
    CUDA plan (raising MemoryPlanError before any compute when it cannot fit). Exports the engines' share
    through `RLWB_GPU_MEMORY_UTILIZATION` for the engine presets (`rlwb.engines.presets.engine_kwargs`)."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "note": "no CUDA: engines size their KV cache from VLLM_CPU_KVCACHE_SPACE"}
    from transformers import AutoConfig

    from rlwb.core.models.store import resolve_model

    model = getattr(params, "model", "default")
    cfg = AutoConfig.from_pretrained(str(resolve_model(model, progress=False)))
    seqs, seq_len = forward_size(params, int(cfg.max_position_embeddings))
    p = plan(notebook, needs, ModelShape.from_config(cfg), torch.cuda.get_device_properties(0).total_memory,
             getattr(params, "dtype", "bfloat16"), seqs=seqs, seq_len=seq_len,
             runs=int(getattr(params, "concurrent_runs", 1)))
    os.environ[GPU_SHARE_ENV] = str(p.gpu_memory_utilization)
    return p.as_dict()


PROMPT_ALLOWANCE = 256  # tokens of prompt the plan allows for on top of max_tokens


def forward_size(params, context: int) -> tuple[int, int]:
    """(sequences, tokens each) of the trainer's largest forward pass in a run with `params`, for a model of
    `context` positions: the params' own `trainer_forward(context, prompt_allowance)` where a notebook's
    trainer does something else than the scorer's batches (GRPO's update, notebook 05's long contexts)."""
    own = getattr(params, "trainer_forward", None)
    if own is not None:
        return own(context, PROMPT_ALLOWANCE)
    seq_len = int(getattr(params, "max_tokens", 256)) + PROMPT_ALLOWANCE + int(getattr(params, "prefix_tokens", 0))
    return 64, seq_len  # TrainerScorer.score's batch_size
