"""`rlwb bench`: throughput and overhead ratios measured in one run (never timed tests).

Writes `outputs/bench/<UTC time>/bench.json`, `bench.md` (a table) and `throughput.png`. Every number is
measured here, with the machine's CPU, cores and versions recorded beside it. Keys:
    tput/<preset>/bs<N>                       generated tokens/s (fixed length, EOS ignored, median of repeats)
    retention/vllm-v1-fixed_vs_vllm-v0/bs<N>  ratio of the two
    worker_overhead_ratio                     rlwb worker generate / the same call on vllm.LLM in-process
    grpo/step_s, grpo/overhead_ratio          GRPO step wall time / the sum of its measured parts
    memory/score_peak_mb, memory/naive_peak_mb   chunked scorer vs full log-softmax, large synthetic vocab
    trl/...                                   the same toy GRPO step with TRL, or the reason it was not run
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from rlwb import archive
from rlwb.core import tasks
from rlwb.core.models import resolve_model
from rlwb.core.tokenizer import encode_prompt
from rlwb.engines.presets import resolve_preset
from rlwb.engines.worker import EngineWorker, Sampling

PRESETS = ["hf", "vllm-v0", "vllm-v1", "vllm-v1-fixed"]


def _prompts(n: int) -> list[list[int]]:
    return [encode_prompt(p.prompt) for p in tasks.make_problems(n, seed=4242)]


def throughput(w: EngineWorker, bs: int, max_tokens: int, repeats: int) -> float:
    prompts = _prompts(bs)
    s = Sampling(temperature=1.0, max_tokens=max_tokens, seed=0, ignore_eos=True)
    w.generate(prompts, s)  # warm-up
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = w.generate(prompts, s)
        rates.append(sum(len(c.token_ids) for c in out) / (time.perf_counter() - t))
    return statistics.median(rates)


_DIRECT = textwrap.dedent("""
    import json, sys, time
    from vllm import LLM, SamplingParams
    spec = json.loads(sys.argv[1])
    llm = LLM(model=spec["model"], **spec["kwargs"])
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    sp = [SamplingParams(temperature=1.0, max_tokens=spec["max_tokens"], seed=i, ignore_eos=True, logprobs=0)
          for i in range(len(prompts))]
    llm.generate(prompts, sp, use_tqdm=False)
    ts = []
    for _ in range(spec["repeats"]):
        t = time.perf_counter(); llm.generate(prompts, sp, use_tqdm=False); ts.append(time.perf_counter() - t)
    print("RLWB_RESULT " + json.dumps(sorted(ts)[len(ts) // 2]))
""")


def worker_overhead(model_path, preset: str, bs: int, max_tokens: int, repeats: int) -> dict:
    """Median generate time through rlwb's worker vs vllm.LLM called directly in the same environment."""
    p = resolve_preset(preset)
    prompts = _prompts(bs)
    kwargs = {**p.vllm_kwargs, "dtype": "float32", "seed": 0}
    import os

    env = {**os.environ, **p.env}
    out = subprocess.run([str(p.python), "-c", _DIRECT, json.dumps({"model": str(model_path), "kwargs": kwargs,
                          "prompts": prompts, "max_tokens": max_tokens, "repeats": repeats})],
                         capture_output=True, text=True, env=env, timeout=900)
    line = [x for x in out.stdout.splitlines() if x.startswith("RLWB_RESULT ")]
    if not line:
        return {"worker_overhead_error": out.stderr[-500:]}
    direct = json.loads(line[0].split(" ", 1)[1])
    with EngineWorker(p, model_path) as w:
        s = Sampling(temperature=1.0, max_tokens=max_tokens, seed=0, ignore_eos=True)
        w.generate(prompts, s)
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            w.generate(prompts, s)
            ts.append(time.perf_counter() - t)
    via = statistics.median(ts)
    return {"worker_overhead_ratio": via / direct, "worker_generate_s": via, "direct_generate_s": direct}


def grpo_cost(model_path, steps: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.core import grpo

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    with EngineWorker("vllm-v1-fixed", model_path) as w:
        # the notebook-03 step shape: 8 x 8, 32 tokens, T 0.7
        cfg = grpo.GRPOConfig(steps=steps + 1, prompts_per_step=8, group_size=8)
        df = grpo.train(model, w, cfg, progress=False).iloc[1:]  # first step warms up
    parts = df[["t_rollout", "t_score", "t_update", "t_sync"]].sum(axis=1)
    return {"grpo/step_s": float(df["t_step"].median()), "grpo/overhead_ratio": float((df["t_step"] / parts).median()),
            "grpo/rollout_s": float(df["t_rollout"].median()), "grpo/sync_s": float(df["t_sync"].median())}


_MEMORY = textwrap.dedent("""
    import resource, sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from rlwb.core.trainer import completion_logprobs, make_batch
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=131072, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    model = LlamaForCausalLM(cfg).eval()
    B, P, L = 8, 64, 448
    ids = torch.randint(0, cfg.vocab_size, (B, P + L))
    batch = make_batch(ids[:, :P].tolist(), ids[:, P:].tolist())
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.no_grad():
        if sys.argv[1] == "chunked":
            lp = completion_logprobs(model, batch, temperature=0.7)["logp"]
        else:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
            lp = (logits[:, :-1] / 0.7).log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
""")


def score_memory() -> dict:
    out = {}
    for kind in ("chunked", "naive"):
        r = subprocess.run([sys.executable, "-c", _MEMORY, kind], capture_output=True, text=True, timeout=900)
        out[f"memory/{'score' if kind == 'chunked' else 'naive'}_peak_mb"] = float(r.stdout.strip().splitlines()[-1]) \
            if r.returncode == 0 else None
    out["memory/setup"] = "vocab 131072, batch 8 x 512 tokens (448 completion), fp32, peak RSS growth while scoring"
    return out


def trl_step(model_path, steps: int, rlwb_step_s: float | None) -> dict:
    """The same toy GRPO step (default model, 8 prompts x 8 completions, 32 tokens, T 0.7, lr, clip) with TRL's
    GRPOTrainer on CPU (transformers generation: TRL's vLLM mode needs CUDA). Median of TRL's own per-step
    `step_time` after the first step."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.bench.throughput import trl_peer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        with tempfile.TemporaryDirectory() as d:
            trainer = trl_peer.make_trainer(model, model_path, d, steps=steps + 1)
            trainer.train()
        times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
    except Exception as e:  # a peer that cannot run here is reported, never silently skipped
        return {"trl/step_s": None, "speedup_vs_trl": None, "trl/reason": f"TRL failed: {type(e).__name__}: {e}"}
    step_s = statistics.median(times)
    return {"trl/step_s": step_s, "trl/version": trl_peer.version(),
            "speedup_vs_trl": step_s / rlwb_step_s if rlwb_step_s else None,
            "trl/setup": "GRPOTrainer, loss_type bnpo, beta 0, transformers generation on CPU, same model and "
                         "batch shape as grpo/step_s"}


def run(outputs: Path, quick: bool = False, progress: bool = True) -> Path:
    from rlwb.progress import progress_bar

    model_path = resolve_model("default", progress=False)
    batch_sizes = [1, 16] if quick else [1, 16, 64]
    repeats, max_tokens = (2, 32) if quick else (3, 64)
    res: dict = {"machine": archive.host_info(), "packages": archive.package_versions(),
                 "started_at": archive.utc_now(),
                 "settings": {"batch_sizes": batch_sizes, "repeats": repeats, "max_tokens": max_tokens,
                              "dtype": "float32", "quick": quick}}
    engines = {}
    for name in progress_bar(PRESETS, desc="throughput", disable=not progress):
        with EngineWorker(name, model_path) as w:
            engines[name] = {k: w.info().get(k) for k in ("engine", "vllm_version", "torch_version")}
            for bs in batch_sizes:
                res[f"tput/{name}/bs{bs}"] = throughput(w, bs, max_tokens, repeats)
    res["engines"] = engines
    for bs in batch_sizes:
        res[f"retention/vllm-v1-fixed_vs_vllm-v0/bs{bs}"] = (res[f"tput/vllm-v1-fixed/bs{bs}"]
                                                             / res[f"tput/vllm-v0/bs{bs}"])
    res.update(worker_overhead(model_path, "vllm-v1-fixed", batch_sizes[-1], max_tokens, repeats + 1))
    res.update(grpo_cost(model_path, 3 if quick else 8))
    res.update(score_memory())
    res.update(trl_step(model_path, 2 if quick else 5, res.get("grpo/step_s")))
    res["finished_at"] = archive.utc_now()
    out = outputs / "bench" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    archive.write_json(out / "bench.json", res)
    (out / "bench.md").write_text(markdown(res))
    _figure(res, out / "throughput")
    return out


def markdown(res: dict) -> str:
    bss = res["settings"]["batch_sizes"]
    lines = [f"Measured {res['started_at']} on {res['machine']['cpu']} ({res['machine']['cores']} cores), fp32, "
             f"{res['settings']['max_tokens']} tokens per request, median of {res['settings']['repeats']}.", "",
             "| preset | " + " | ".join(f"bs {b} tok/s" for b in bss) + " |", "|---|" + "---|" * len(bss)]
    for p in PRESETS:
        lines.append(f"| `{p}` | " + " | ".join(f"{res[f'tput/{p}/bs{b}']:.0f}" for b in bss) + " |")
    lines += ["", "| ratio | value |", "|---|---|"]
    for b in bss:
        ratio = res[f"retention/vllm-v1-fixed_vs_vllm-v0/bs{b}"]
        lines.append(f"| vllm-v1-fixed / vllm-v0 throughput, bs {b} | {ratio:.2f} |")
    for k in ("worker_overhead_ratio", "grpo/step_s", "grpo/overhead_ratio", "trl/step_s", "speedup_vs_trl",
              "memory/score_peak_mb", "memory/naive_peak_mb"):
        if res.get(k) is not None:
            lines.append(f"| {k} | {res[k]:.3g} |")
    if res.get("trl/reason"):
        lines.append(f"| TRL | {res['trl/reason']} |")
    return "\n".join(lines) + "\n"


def _figure(res: dict, stem: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    from rlwb import plots

    plots.set_style("notebook")
    bss = res["settings"]["batch_sizes"]
    fig, ax = plt.subplots(figsize=plots.figsize("notebook"))
    w = 0.8 / len(PRESETS)
    for i, p in enumerate(PRESETS):
        ax.bar(np.arange(len(bss)) + (i - 1.5) * w, [res[f"tput/{p}/bs{b}"] for b in bss], w, label=p,
               color=plots.engine_color(p))
    ax.set_xticks(range(len(bss)), [f"batch {b}" for b in bss])
    ax.set_yscale("log")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"Rollout throughput on {res['machine']['cores']} CPU cores (fp32, tiny model)")
    ax.grid(axis="x", visible=False)
    ax.legend(fontsize="small")
    fig.tight_layout()
    plots.save_figure(fig, stem)
    plt.close(fig)
