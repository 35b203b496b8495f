"""Notebook 09's parameters: the sampler and prompts, the trainer settings scored against float64, and the
fp32-head grid."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import DTYPES, param
from rlwb.core.data.tokenizer import CHAT_TEMPLATE_MODES
from rlwb.core.prompts.generated import PROMPT_SOURCES
from rlwb.core.scoring.trainer_choices import check_setting
from rlwb.params.schemas.base import Params, check_engine, check_model, check_preset_name

SETTINGS_DOC = ("trainer settings: entries of rlwb.core.scoring.trainer_choices.CATALOG joined by + (bf16+fp32-head), "
                "mb<N> for N sequences per forward; fp64 (the reference's control) and fp32 (rlwb's scorer) always run")


@dataclass
class TrainerSettingsParams(Params):
    """Notebook 09: the sampler and prompts, the trainer settings scored against float64, the fp32-head grid."""

    NOTEBOOK: typing.ClassVar[str] = "09_trainer_settings"
    HEADLINE: typing.ClassVar[list[str]] = ["bf16/k3_mean", "fp32/batch1_identical_frac",
                                             "mb4+grad/ppo_ratio_abs_log_max"]

    model: str = param("default", "embedded model (default, qwen2-chat, qwen2.5-0.5b-random), a model directory, or an "
                                  "HF id", check=check_model)
    sampler: str = param("hf", "engine preset that samples the sequences every setting scores (fp32; hf runs "
                               "wherever transformers does)", check=check_engine)
    dtype: str = param("float32", "engine dtype where the preset and knob do not set one (the sampler's; the grid's "
                                  "presets set bf16 themselves)", choices=DTYPES)
    chat_template: str = param("auto", "task prompts through the tokenizer's chat template: auto (when it has one), "
                                       "on (required), off", choices=list(CHAT_TEMPLATE_MODES))
    prompt_sources: list[str] = param(["task", "open_ended"], "prompt sources sampled, each with `prompts` prompts: "
                                                              "task (peaked) and open_ended (the policy's entropy)",
                                      choices=list(PROMPT_SOURCES), unique=True)
    prompts: int = param(32, "prompts per source", ge=1)
    max_tokens: int = param(32, "max completion tokens per request", ge=1)
    temperature: float = param(1.0, "sampling temperature (> 0); every setting scores under it", gt=0, le=10)
    settings: list[str] = param(["batch1", "left-pad", "packed", "eager", "flex", "flash2", "bf16", "bf16+fp32-head",
                                 "bf16-autocast", "fp16", "mb4+grad", "mb4+grad+checkpointing", "compile"],
                                SETTINGS_DOC, check=check_setting, allow_empty=True, unique=True)
    batch_size: int = param(64, "sequences per forward of the settings that keep the scorer's batches", ge=1)
    grid_engines: list[str] = param(["vllm-v1-fixed@bf16", "vllm-v1-fixed@bf16-head-native"],
                                    "bf16 engine presets of the fp32-head grid: without, then with an fp32 lm_head "
                                    "(one whose environment is missing is a row with the error)",
                                    check=check_preset_name, allow_empty=True, unique=True)
    grid_settings: list[str] = param(["fp32", "bf16", "bf16+fp32-head"], "trainer settings of the fp32-head grid "
                                                                         "(each scores every grid engine's samples; "
                                                                         "with fp32 among them each engine joins the "
                                                                         "ranking)", check=check_setting, unique=True)
    compare_run: str = param("latest", "notebook 06 run whose engine knobs are ranked beside the trainer settings: "
                                       "latest (of this run's archive), a run directory, or none")


    def trainer_forward(self, context: int, prompt_allowance: int) -> tuple[int, int]:
        """The largest forward (GPU memory plan): a scorer batch of the sequences."""
        return self.batch_size, self.max_tokens + prompt_allowance
