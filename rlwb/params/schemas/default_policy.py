"""Notebook 00's parameters: the embedded model it evaluates and how much of it the report shows."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import param
from rlwb.core.models.store import EMBEDDED_NAMES
from rlwb.params.schemas.base import Params


@dataclass
class DefaultPolicyParams(Params):
    NOTEBOOK: typing.ClassVar[str] = "00_default_policy"
    HEADLINE: typing.ClassVar[list[str]] = ["policy/greedy_accuracy", "policy/mean_completion_tokens"]

    model: str = param("default", "embedded model to evaluate: default (char-level Llama) or qwen2-chat (BPE, chat)",
                       choices=list(EMBEDDED_NAMES))
    eval_prompts: int = param(200, "held-out problems for greedy accuracy", ge=1)
    sample_rows: int = param(12, "completions shown in the samples table", ge=0)
    rebuild: bool = param(False, "rebuild the model even if a cached build exists")
