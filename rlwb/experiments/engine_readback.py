"""What a running engine confirms it runs, and why one failed to start: shared by the notebooks that audit engine
settings (06's knobs, 09's fp32-head grid).

NeMo-RL's rollout tuning guide: prove a setting took effect from the engine, not from the YAML. `not_applied`
compares what a preset asks for with the settings the running engine reports (`EngineWorker.info()`);
`error_line` turns an engine that refused a setting into the engine's own one-line reason, for a report row.
"""

from __future__ import annotations

import re

GENERIC = ("EngineCrashed", "EngineError", "EngineDeadError", "Engine core initialization failed",
           "Worker failed with error")
LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?((ERROR|WARNING|INFO|DEBUG)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?")


def error_line(err: BaseException) -> str:
    """The engine's own one-line reason: the last `SomethingError: ...` line of its message and stderr tail
    that is not a wrapper ("EngineCore encountered an issue"), with a pydantic error's detail line; else the
    message's first line. vLLM raises inside its engine core, so the kernel sees the worker's log."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err) + "\n" + getattr(err, "stderr_tail", ""))  # ANSI colours
    lines = [LOG_PREFIX.sub("", ln.strip()) for ln in text.splitlines()]
    pick = None
    for i, ln in enumerate(lines):
        if not re.match(r"^(\w+\.)*\w*(Error|Exception)\b:", ln) or any(g in ln for g in GENERIC):
            continue
        pick = ln
        if "validation error" in ln and i + 1 < len(lines):  # pydantic: the reason is on a later line
            detail = next((x for x in lines[i + 1: i + 4] if x.startswith(("Value error", "Assertion"))), "")
            pick = f"{ln}: {detail}" if detail else ln
    line = re.sub(r"\s+", " ", pick or str(err).splitlines()[0])
    line = re.sub(r" \[type=\w+, input_value=.*$", "", line)
    return line if len(line) <= 240 else line[:237] + "..."


EFFECTIVE = ("dtype", "kv_cache_dtype", "enable_prefix_caching", "enable_chunked_prefill", "async_scheduling",
             "tensor_parallel_size", "max_num_batched_tokens", "distributed_executor_backend")
# a setting given by environment -> (the read-back setting that shows the engine applied it, how vLLM parses it)
ENV_READBACK = {"VLLM_BATCH_INVARIANT": ("batch_invariant", lambda v: bool(int(v)))}


def not_applied(vllm_kwargs: dict, settings: dict, fp32_lm_head: bool | str = False,
                env: dict | None = None) -> list[str]:
    """Settings the preset asks for that the running engine does not report (read from its config): a knob
    that did not take effect is not measured as if it had (NeMo-RL's rollout tuning guide: prove the setting
    took effect from the engine, not from the YAML)."""
    out = []
    for k in EFFECTIVE:
        if k in vllm_kwargs and k in settings and str(vllm_kwargs[k]).replace("torch.", "") != str(settings[k]):
            out.append(f"asked {k}={vllm_kwargs[k]}, the running engine reports {settings[k]}")
    for name, (key, parse) in ENV_READBACK.items():
        if name in (env or {}) and settings.get(key) is not None and parse(env[name]) != settings[key]:
            out.append(f"asked {name}={env[name]}, the running engine reports {key}={settings[key]}")
    head = (vllm_kwargs.get("hf_overrides") or {}).get("head_dtype")
    if head is not None and settings.get("head_dtype") not in (None, head):
        out.append(f"asked head_dtype={head}, the running engine reports {settings.get('head_dtype')}")
    if fp32_lm_head and settings.get("dtype") not in (None, "float32") and "fp32_lm_head" in settings:
        want = {"native": "vllm head_dtype", "rlwb": "rlwb hook"}.get(fp32_lm_head)
        if not settings["fp32_lm_head"] or (want and settings.get("fp32_lm_head_impl") != want):
            out.append(f"asked fp32_lm_head={fp32_lm_head}, the running engine reports "
                       f"{settings.get('fp32_lm_head_impl') or 'no fp32 head'}")
    spec = (vllm_kwargs.get("speculative_config") or {}).get("method")
    if spec is not None and "speculative" in settings and settings["speculative"] is None:
        out.append(f"asked speculative decoding ({spec}), the running engine has none")
    return out
