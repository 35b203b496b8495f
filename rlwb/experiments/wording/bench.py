"""`rlwb bench`'s text: the one-line answer for the runs' index and bench.md's tables. `rlwb.bench.throughput`
measures and passes its result (bench.json's dict) and what it measured; nothing here computes a number.
"""

from __future__ import annotations

from rlwb.host import cpu_name


def answer(res: dict, presets: list[str]) -> str:
    """The bench's finding in one line, for the runs' index: its ratios, each saying what it compares (`presets`: those
    measured at every batch size, in order)."""
    bss = res["settings"]["batch_sizes"]
    at = " / ".join(map(str, bss))
    ratios = [res.get(f"retention/vllm-v1-fixed_vs_vllm-v0/bs{b}") for b in bss]
    parts = []
    if all(r is not None for r in ratios):
        parts.append(f"vllm-v1-fixed samples {' / '.join(f'{r:.2f}' for r in ratios)}× vllm-v0's tokens/s at "
                     f"batch {at}")
    else:
        for p in presets:
            rates = " / ".join(f"{res[f'tput/{p}/bs{b}']:.0f}" for b in bss)
            parts.append(f"{p} samples {rates} tokens/s at batch {at}")
    for key, said in (("worker_overhead_ratio", "rlwb's worker takes {:.2f}× llm.generate's time in one process"),
                      ("grpo/rlwb_vs_minimal", "rlwb's GRPO step {:.2f}× a minimal loop's"),
                      ("speedup_vs_trl_vllm", "TRL + vLLM's step {:.2f}× rlwb's (same algorithm)")):
        if isinstance(res.get(key), (int, float)):
            parts.append(said.format(res[key]))
    machine = res["machine"]
    return "; ".join(parts) + f" ({machine.get('gpu') or cpu_name(machine)}, {machine.get('cores')} cores)"


def markdown(res: dict, presets: list[str], phases: list[str]) -> str:
    """bench.md: a tokens/s table of the `presets` measured at every batch size, then every ratio and time measured
    (`phases`: the GRPO step's phases, each compared with the minimal loop's)."""
    bss = res["settings"]["batch_sizes"]
    lines = [f"Measured {res['started_at']} on {cpu_name(res['machine'])} ({res['machine']['cores']} cores), fp32, "
             f"{res['settings']['max_tokens']} tokens per request, median of {res['settings']['repeats']}.", "",
             "| preset | " + " | ".join(f"bs {b} tok/s" for b in bss) + " |", "|---|" + "---|" * len(bss)]
    for p in presets:
        lines.append(f"| `{p}` | " + " | ".join(f"{res[f'tput/{p}/bs{b}']:.0f}" for b in bss) + " |")
    table = ["", "| ratio | value |", "|---|---|"]
    lines += table
    for b in bss:
        if (ratio := res.get(f"retention/vllm-v1-fixed_vs_vllm-v0/bs{b}")) is not None:
            lines.append(f"| vllm-v1-fixed / vllm-v0 throughput, bs {b} | {ratio:.2f} |")
    for k in ("worker_overhead_ratio", "grpo/step_s", "grpo/minimal_step_s", "grpo/rlwb_vs_minimal",
              *(f"grpo/{ph}_vs_minimal" for ph in phases), "trl/step_s",
              "speedup_vs_trl", "trl_vllm/step_s", "speedup_vs_trl_vllm", "trl_vllm/no_correction/trl/step_s",
              "speedup_vs_trl_vllm/no_correction", "trl_vllm/vllm_threads/step_s", "trl_vllm/thread_reset_cost",
              "memory/score_peak_mb", "memory/naive_peak_mb"):
        if res.get(k) is not None:
            lines.append(f"| {k} | {res[k]:.3g} |")
    if res.get("trl/reason"):
        lines.append(f"| TRL | {res['trl/reason']} |")
    for k in ("trl_vllm/stock", "trl_vllm/stock_reason", "trl_vllm/reason"):
        if res.get(k):
            lines.append(f"| {k} | {res[k]} |")
    if res.get("trl_vllm/patches"):
        lines.append(f"| trl_vllm/patches | {'; '.join(res['trl_vllm/patches'])} |")
    for d in res.get("trl_vllm/differences") or []:
        lines.append(f"| TRL + vLLM vs rlwb, not made equal | {d} |")
    if lines[-len(table):] == table:  # no ratio measured (a partial bench): no empty table
        del lines[-len(table):]
    return "\n".join(lines) + "\n"
