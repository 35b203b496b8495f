"""Notebook 10's parameters: your prompts, your engines (presets or served URLs), your trainer, or an archived
run to re-score."""

from __future__ import annotations

import typing
from dataclasses import dataclass

from rlwb.core.checked_fields import DTYPES, param
from rlwb.errors import ParamError
from rlwb.params.schemas.base import Params, check_engine, check_model


def check_prompts_file(value: str) -> str | None:
    """A prompts file whose every row has the right shape (`rlwb.core.prompts.from_file.check_rows`: a bad row is named
    before a kernel starts); "" when the audit re-scores an archived run instead."""
    if value == "":
        return None
    from rlwb.core.prompts.from_file import check_rows
    from rlwb.errors import PromptFileError
    from rlwb.paths import repo_path

    try:
        check_rows(repo_path(value))
    except PromptFileError as e:
        return str(e)
    return None


def check_audit_engine(name: str) -> str | None:
    """A preset whose environment exists (`check_engine`), or the URL of a running OpenAI-compatible server."""
    from rlwb.engines.presets import check_url, is_url

    return check_url(name) if is_url(name) else check_engine(name)


def check_archived_run(value: str) -> str | None:
    """"" or an archived run directory with a self-contained rollouts table (`rlwb rescore`)."""
    if value == "":
        return None
    from rlwb.paths import repo_path
    from rlwb.run_record import RECORD, has_record

    d = repo_path(value)
    if not has_record(d):
        return f"{value!r} is not an archived run (no {RECORD})"
    if not (d / "data" / "rollouts.parquet").is_file():
        return f"{value!r} has no data/rollouts.parquet: nothing to re-score"
    return None


@dataclass
class AuditParams(Params):
    """Notebook 10: your prompts, your engine (a preset or a served URL), your trainer (rlwb's scorer or a command)."""

    NOTEBOOK: typing.ClassVar[str] = "10_audit"
    HEADLINE: typing.ClassVar[list[str]] = ["audit/k3_mean_worst", "audit/abs_dlogp_max_worst"]

    model: str = param("default", "the policy: embedded model (default, qwen2-chat, ...), a model directory, or an "
                                  "HF id; engines and trainer load it, a served engine must serve it",
                       check=check_model)
    prompts_file: str = param("params/10_audit/prompts.jsonl", "JSONL or Parquet, one prompt per row: prompt (text), "
                                                               "messages (chat) or prompt_token_ids; relative paths "
                                                               "from the repository root", check=check_prompts_file)
    engines: list[str] = param(["vllm-v1-processed"], "engine presets (params/engines.yaml) or server URLs "
                                                      "(http://host:port/v1, OpenAI-compatible)",
                               check=check_audit_engine, allow_empty=True, unique=True)
    served_model: str = param("", "the model name at the server URLs (empty: the one model the server serves)")
    trainer: str = param("hf", "the scorer: hf (rlwb's transformers scorer) or a command behind the external-scorer "
                               "contract (README), run from the repository root")
    trainer_dtype: str = param("float32", "dtype of rlwb's scorer (trainer hf)", choices=DTYPES)
    trainer_attn: str = param("sdpa", "attention kernel of rlwb's scorer (trainer hf)", choices=["sdpa", "eager"])
    dtype: str = param("float32", "engine dtype (presets; a served engine runs as it was started)", choices=DTYPES)
    temperature: float = param(1.0, "sampling temperature (0 is greedy)", ge=0, le=10)
    top_p: float = param(1.0, "nucleus sampling mass in (0, 1]; 1 means off", gt=0, le=1)
    top_k: int = param(0, "top-k sampling; 0 means off", ge=0)
    max_tokens: int = param(64, "max completion tokens per request", ge=1)
    samples_per_prompt: int = param(1, "completions per prompt (n)", ge=1)
    clip_eps: float = param(0.2, "PPO clip epsilon for clip_frac", gt=0, lt=1)
    full_vocab: bool = param(False, "also compare full-vocabulary distributions (exact KL): the engines must return "
                                    "every logprob (small vocabularies only)")
    worst_tokens: int = param(20, "rows of the worst-tokens table", ge=1)
    rollouts_from: str = param("", "an archived run to re-score instead of sampling (its data/rollouts.parquet; "
                                   "what rlwb rescore sets): prompts_file and engines must then be empty",
                               check=check_archived_run)

    def __post_init__(self):
        if self.rollouts_from and (self.prompts_file or self.engines):
            raise ParamError("parameter 'rollouts_from' re-scores an archived run's rollouts: set prompts_file to '' "
                             "and engines to [] (its engines are the archive's)")
        if not self.rollouts_from and not (self.prompts_file and self.engines):
            raise ParamError("parameters 'prompts_file' and 'engines' are needed to sample (or rollouts_from to "
                             "re-score an archived run)")
