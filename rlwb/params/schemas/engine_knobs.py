"""Notebook 06's parameters: the baseline preset, the knobs and vLLM versions measured against it, and the MoE
router audit."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import DTYPES, param
from rlwb.core.data.tokenizer import CHAT_TEMPLATE_MODES
from rlwb.core.prompts.generated import PROMPT_SOURCES
from rlwb.engines.presets import available_knobs
from rlwb.params.schemas.base import Params, check_engine, check_model, check_preset_name

KNOBS_DOC = "knobs (params/engine_knobs.yaml) applied one at a time to the baseline"


@dataclass
class EngineKnobParams(Params):
    """Notebook 06: the baseline preset, the knobs and versions measured against it, the MoE router audit."""

    NOTEBOOK: typing.ClassVar[str] = "06_engine_knobs"
    HEADLINE: typing.ClassVar[list[str]] = ["bf16/k3_mean", "kv-fp8/k3_mean", "moe/bf16/topk_set_agree"]

    model: str = param("qwen2-chat", "embedded model (default, qwen2-chat), a model directory, or an HF id",
                       check=check_model)
    baseline: str = param("vllm-v1-fixed", "engine preset every knob changes (params/engines.yaml)",
                          check=check_engine)
    knobs: list[str] = param(["bf16", "fp16", "bf16-head-rlwb", "bf16-head-native", "kv-fp8", "kv-fp8-e4m3",
                              "kv-fp8-e5m2", "chunked-prefill", "prefix-caching", "async-scheduling",
                              "batch-invariant", "ngram-spec", "tp2", "tp2-ray"], KNOBS_DOC, choices=available_knobs,
                             allow_empty=True, unique=True)
    versions: list[str] = param(["vllm-v0", "vllm-v1-0.28", "vllm-v1-0.31"],
                                "other vLLM builds (presets with their own environment) run on the same prompts",
                                check=check_preset_name, allow_empty=True, unique=True)
    dtype: str = param("float32", "engine dtype where the preset and knob do not set one", choices=DTYPES)
    chat_template: str = param("auto", "task prompts through the tokenizer's chat template: auto (when it has one), "
                                       "on (required), off", choices=list(CHAT_TEMPLATE_MODES))
    prompt_source: str = param("open_ended", "prompts: open_ended (held-out text and chat questions: the policy's "
                                             "natural entropy) or task", choices=list(PROMPT_SOURCES))
    trainer_dtype: str = param("float32", "trainer (scorer) dtype", choices=DTYPES)
    prompts: int = param(64, "prompts sampled per knob", ge=1)
    max_tokens: int = param(48, "max completion tokens per request", ge=1)
    temperature: float = param(1.0, "sampling temperature (> 0)", gt=0, le=10)
    top_p: float = param(1.0, "nucleus sampling mass in (0, 1]; 1 means off", gt=0, le=1)
    top_k: int = param(0, "top-k sampling; 0 means off", ge=0)
    clip_eps: float = param(0.2, "PPO clip epsilon for clip_frac", gt=0, lt=1)
    throughput_repeats: int = param(3, "timed generate calls per knob (median tokens/s)", ge=1)
    moe: bool = param(True, "run the MoE router audit")
    moe_model: str = param("qwen2-moe-chat", "embedded MoE model of the router audit", check=check_model)
    moe_knobs: list[str] = param(["bf16"], "knobs of the router audit (beside the baseline)", choices=available_knobs,
                                 unique=True)
    moe_prompts: int = param(32, "prompts of the router audit (sampled one request at a time)", ge=1)

