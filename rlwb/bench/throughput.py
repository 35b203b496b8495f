"""`rlwb bench`: throughput and overhead ratios measured in one run (never timed tests).

Writes `outputs/bench/<UTC start>/`: `bench.json` (every number), `bench.md` (a table: `experiments/wording/bench.py`),
`figures/throughput.*` and `figures/scaling.*` (`plots/bench.py`, drawn from bench.json alone), and `run.json`, the
provenance a notebook run has (`archive.start_record`: commit and whether the tree was clean, host, packages, each
engine's `info()`, the model build's card; `status: ok` only once everything is written, a failure archived as
failed), so a bench run can be published as a run of record (`rlwb publish outputs/bench/<run id>` ->
`docs/runs/bench/<run id>/`). Every number is measured here. Keys:
    tput/<preset>/bs<N>                       generated tokens/s (fixed length, EOS ignored, median of repeats)
    retention/vllm-v1-fixed_vs_vllm-v0/bs<N>  ratio of the two
    worker_overhead_ratio                     rlwb worker generate / llm.generate in one process, same engine spec
    grpo/step_s, grpo/minimal_step_s          rlwb's GRPO step; the same step by a loop without rlwb around it
    grpo/rlwb_vs_minimal                      their ratio (> 1: what rlwb's process split and bookkeeping cost)
    grpo/<phase>_s, grpo/minimal_<phase>_s, grpo/<phase>_vs_minimal   the same split by phase (rollout, update,
                                              sync: GRPO_PHASES), so the ratio's excess has an address; the
                                              phases of each loop add up to its step (`median_step`)
    grpo/reward_mean, grpo/minimal_reward_mean   per-step batch rewards of both loops (same rollouts: equal)
    memory/score_peak_mb, memory/naive_peak_mb   chunked scorer vs full log-softmax, large synthetic vocab
    trl/...                                   the same toy GRPO step with TRL generating with transformers
    trl_vllm/step_s, speedup_vs_trl_vllm      TRL's GRPOTrainer generating with vLLM (colocate) on the same vLLM
                                              release and engine settings, both loops with TRL's default IS
                                              correction (rlwb: `trl.sequence_mask`, decoupled); its step time /
                                              rlwb's (> 1: rlwb faster)
    trl_vllm/no_correction/..., speedup_vs_trl_vllm/no_correction   the same without the correction
    trl_vllm/stock, trl_vllm/patches          whether stock TRL runs here (and why not), what was changed to run it
    trl_vllm/torch_threads                    the threads TRL's updates ran with (measured in its loss)
    trl_vllm/vllm_threads/step_s, trl_vllm/thread_reset_cost   TRL with the thread count vLLM's CPU worker
                                              leaves it (1), and that step time over the restored one's
    trl_vllm/differences                      what stays different between the two loops, said in words
    scaling/<rlwb|trl_vllm>/n<C>/step_s|tok_s  step time and completion tokens/s at C completions per step
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from rlwb import archive
from rlwb.core.data import tasks
from rlwb.core.data.tokenizer import encode_prompt
from rlwb.engines.presets import resolve_preset
from rlwb.engines.worker import EngineWorker, Sampling
from rlwb.experiments.wording import bench as wording
from rlwb.plots import bench as bench_plots

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
    import json, os, sys, time
    sys.path.insert(0, sys.argv[2])  # rlwb/engines: the worker's own backend module
    from vllm_backend import VllmBackend
    cfg = json.loads(open(sys.argv[1]).read())
    engine = VllmBackend(cfg["spec"])  # the engine rlwb's worker builds from the same spec
    prompts, params = engine.requests_to_vllm(cfg["requests"], full=False)
    engine.llm.generate(prompts, params, use_tqdm=False)
    ts = []
    for _ in range(cfg["repeats"]):
        t = time.perf_counter()
        outs = engine.llm.generate(prompts, params, use_tqdm=False)
        ts.append(time.perf_counter() - t)
    print("RLWB_RESULT " + json.dumps({"s": sorted(ts)[len(ts) // 2],
                                       "token_ids": [list(o.outputs[0].token_ids) for o in outs]}))
""")


def _engine_script(preset, code: list[str], cfg: dict, timeout: float = 1800, python=None,
                   every: bool = False) -> dict | str | tuple[list[dict], str]:
    """Run `code` under the preset's own interpreter (or `python`) and environment with `cfg` as a JSON file;
    the parsed `RLWB_RESULT` line, or the end of its stderr when there is none. `every`: all `RLWB_RESULT` lines
    parsed, in order, and the end of its stderr."""
    import os
    import tempfile

    from rlwb.engines.worker import SERVER
    from rlwb.paths import REPO_ROOT

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    env = {**os.environ, **preset.env, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{SERVER.parent}",
           "TOKENIZERS_PARALLELISM": "false"}
    try:
        out = subprocess.run([str(python or preset.python), *code, f.name, str(SERVER.parent)], capture_output=True,
                             text=True, env=env, timeout=timeout, cwd=REPO_ROOT)
    finally:
        os.unlink(f.name)
    line = [x for x in out.stdout.splitlines() if x.startswith("RLWB_RESULT ")]
    if every:
        return [json.loads(x.split(" ", 1)[1]) for x in line], out.stderr[-800:]
    return json.loads(line[0].split(" ", 1)[1]) if line else out.stderr[-800:]


def worker_overhead(model_path, preset: str, bs: int, max_tokens: int, repeats: int) -> dict:
    """Median `generate` time through rlwb's worker (pipes, shared memory, outputs converted to arrays) vs
    `llm.generate` on the same requests in one process, on an engine built from the same spec (same vLLM
    kwargs, dtype, idle spin, max_logprobs): the ratio is what the worker protocol adds, nothing else.
    `worker_overhead/same_tokens`: both paths sampled the same tokens from the same seeded requests (the
    evidence that they ran the same engine on the same work)."""
    from rlwb.engines.worker import generate_requests, worker_spec

    p = resolve_preset(preset)
    prompts = _prompts(bs)
    s = Sampling(temperature=1.0, max_tokens=max_tokens, seed=0, ignore_eos=True)
    direct = _engine_script(p, ["-c", _DIRECT], {"spec": worker_spec(p, model_path), "repeats": repeats,
                                                 "requests": generate_requests(prompts, s)})
    if isinstance(direct, str):
        return {"worker_overhead_error": direct}
    with EngineWorker(p, model_path) as w:
        w.generate(prompts, s)
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = w.generate(prompts, s)
            ts.append(time.perf_counter() - t)
    via = statistics.median(ts)
    return {"worker_overhead_ratio": via / direct["s"], "worker_generate_s": via, "direct_generate_s": direct["s"],
            "worker_overhead/same_tokens": [list(c.token_ids) for c in out] == direct["token_ids"]}


# a GRPO step's phases as rlwb's curves time them -> the minimal loop's timer of the same work: sampling with
# rewards and advantages; the trainer's forward (old logprobs, shared with the update's when it is unsplit),
# mismatch metrics, corrections, backward and optimizer step; the in-flight weight update of the engine
GRPO_PHASES = {"rollout": ["t_rollout"], "update": ["t_score", "t_update"], "sync": ["t_sync"]}
GRPO_SHAPE = {"prompts_per_step": 8, "group_size": 8, "max_tokens": 32, "temperature": 0.7, "lr": 1.5e-4,
              "clip_eps": 0.2, "max_digits": 3}  # notebook 03's step


def median_step(phases: dict[str, Sequence[float]]) -> dict[str, float]:
    """A typical step and its split by phase, in numbers that add up: each step's total is the sum of its phases,
    the step time is the median of those totals, and the split is the median step's own (the mean of the two
    middle steps, phase by phase, for an even count). Medians taken phase by phase do not add up to the median
    step: the median of a sum is not the sum of the medians."""
    n = len(next(iter(phases.values())))
    if n == 0 or any(len(v) != n for v in phases.values()):
        raise ValueError(f"every phase needs one time per step: {({k: len(v) for k, v in phases.items()})}")
    totals = [sum(v[i] for v in phases.values()) for i in range(n)]
    order = sorted(range(n), key=totals.__getitem__)
    middle = order[(n - 1) // 2: n // 2 + 1]
    return {"step": statistics.fmean(totals[i] for i in middle),
            **{k: statistics.fmean(v[i] for i in middle) for k, v in phases.items()}}


def grpo_cost(model_path, steps: int, preset: str = "vllm-v1-fixed") -> dict:
    """rlwb's GRPO step (`grpo.train`: worker process, pipes, per-step metrics) against the same step done by
    a minimal loop with engine and trainer in one process and no bookkeeping (`rlwb.bench.minimal_loop`),
    same engine spec, step shape, problems and sampling seeds, so both sample the same rollouts from the same
    weights. The first step is a warm-up; the rest are summarised by `median_step`."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.core.rl import grpo
    from rlwb.engines.worker import worker_spec

    p = resolve_preset(preset)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    with EngineWorker(p, model_path) as w:
        cfg = grpo.GRPOConfig(steps=steps + 1, **GRPO_SHAPE)
        df = grpo.train(model, w, cfg, progress=False)
    timed = df.iloc[1:]
    ours = median_step({phase: list(timed[cols].sum(axis=1)) for phase, cols in GRPO_PHASES.items()})
    out = {"grpo/step_s": ours["step"], **{f"grpo/{ph}_s": ours[ph] for ph in GRPO_PHASES},
           "grpo/reward_mean": [float(r) for r in df["reward_mean"]]}
    minimal = _engine_script(p, ["-m", "rlwb.bench.minimal_loop"],
                             {"spec": worker_spec(p, model_path), "steps": steps + 1,
                              "trainer_threads": torch.get_num_threads(), **GRPO_SHAPE})
    if isinstance(minimal, str):
        return {**out, "grpo/minimal_error": minimal}
    theirs = median_step({ph: minimal[f"{ph}_s"][1:] for ph in GRPO_PHASES})
    out.update({"grpo/minimal_step_s": theirs["step"], "grpo/rlwb_vs_minimal": ours["step"] / theirs["step"],
                "grpo/minimal_reward_mean": minimal["reward_mean"],
                "grpo/minimal_threads": {k: minimal[k] for k in ("engine_threads", "trainer_threads",
                                                                 "measured_threads")}})
    for ph in GRPO_PHASES:
        out[f"grpo/minimal_{ph}_s"], out[f"grpo/{ph}_vs_minimal"] = theirs[ph], ours[ph] / theirs[ph]
    return out


SCALING_PROMPTS = [2, 4, 8, 16]  # x group 8 = 16 ... 128 completions per step

# The algorithm both loops run, with TRL's vLLM importance-sampling correction (its default) and without it.
# With it, TRL recomputes the old logprobs and weighs every token by its `sequence_mask` ratio (clip 3): rlwb runs
# the same as `trl.sequence_mask` in decoupled mode (behaviour logprobs from the trainer; the catalogue's entry is
# held to TRL's own lines by tests/test_corrections.py). Without it TRL's ratio is the current policy over itself
# (one update per batch), which is rlwb's decoupled `none`.
TRL_ARMS = {"correction": {"correction": "trl.sequence_mask", "old_logprobs": "trainer"},
            "no_correction": {"correction": "none", "old_logprobs": "trainer"}}
# What stays different between the two loops when they run the same algorithm on the same engine settings
TRL_DIFFERENCES = [
    "with the correction, TRL computes the old logprobs in a no-grad forward before the update; rlwb reads them off "
    "the update's own forward (one update per batch: the same weights, bitwise the same values), one forward fewer",
    "TRL samples with its own seeds: the same prompts per step, other completions (compare tokens/s as well)",
    "TRL runs engine and trainer in one process (colocate); rlwb's engine is a worker process behind pipes",
    "TRL's Trainer machinery (accelerate, data loader, its per-step metrics) against rlwb's per-step metrics "
    "(mismatch, entropy, correction health, batch record)",
]


def trl_vllm(model_path, steps: int, sizes=SCALING_PROMPTS) -> dict:
    """TRL's GRPOTrainer with vLLM generation (colocate) against rlwb's `grpo.train`, on the same vLLM release and
    engine settings (`vllm-v1-fixed`), model, step shape and problems, running the same algorithm
    (`rlwb.bench.trl_vllm_peer`, `TRL_ARMS`). First stock TRL, to record whether and why it fails here. Then, at
    each scaling size, both loops with TRL's default correction; at notebook 03's shape also both without it, and
    TRL once more with the thread count vLLM leaves it (`trl_vllm/vllm_threads/*`: what that reset costs a stock
    TRL user). TRL's updates otherwise run with the trainer's threads, as rlwb's do (patch 3). TRL's runs share one
    process (one import) and, at one size, one engine: each run's first step syncs its fresh weights into it.
    Medians after the first step; speedups are TRL's step time over rlwb's (> 1: rlwb faster)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.bench import trl_vllm_peer
    from rlwb.core.rl import grpo
    from rlwb.engines.worker import worker_spec
    from rlwb.paths import envs_dir

    python = envs_dir() / "trl-vllm" / "bin" / "python"
    if not (envs_dir() / "trl-vllm" / ".rlwb-stamp").exists():
        return {"trl_vllm/step_s": None, "speedup_vs_trl_vllm": None,
                "trl_vllm/reason": f"{python.parent.parent} is not set up: run `make trl-vllm`"}
    preset = resolve_preset("vllm-v1-fixed")
    kwargs = {**worker_spec(preset, model_path)["vllm_kwargs"], "dtype": "float32"}
    threads = torch.get_num_threads()
    base = {"model": str(model_path), "engine_kwargs": kwargs, "trainer_threads": threads, **GRPO_SHAPE}
    at = GRPO_SHAPE["prompts_per_step"]
    res: dict = {"trl_vllm/engine_kwargs": kwargs, "trl_vllm/arms": TRL_ARMS, "trl_vllm/differences": TRL_DIFFERENCES}
    runs = [("correction", n) for n in sizes] + ([("no_correction", at)] if at in sizes else [])

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with EngineWorker(preset, model_path) as w:
        for arm, n in runs:
            cfg = grpo.GRPOConfig(steps=steps + 1, **{**GRPO_SHAPE, "prompts_per_step": n, **TRL_ARMS[arm]})
            df = grpo.train(model, w, cfg, initial_state=initial, progress=False).iloc[1:]
            c = n * GRPO_SHAPE["group_size"]
            key = f"scaling/rlwb/n{c}" if arm == "correction" else "trl_vllm/no_correction/rlwb"
            res[f"{key}/step_s"] = float(df["t_step"].median())
            res[f"{key}/tok_s"] = float((df["completion_tokens"] * c / df["t_step"]).median())
            res[f"{key}/is_weight_mean"] = float(df["is_weight_mean"].mean())

    # TRL's runs, in one process (`trl_vllm_peer.main`: one import; the patched arms at one size share one engine):
    # stock TRL first, then each run with the correction or without, then at notebook 03's shape with the threads
    # as vLLM leaves them (what a stock TRL user gets)
    trl_runs = [{"arm": arm, "n": n, "restore": True} for arm, n in runs]
    if at in sizes:
        trl_runs.append({"arm": "correction", "n": at, "restore": False})
    arms = [{"patch": False, "steps": 1}] + [
        {"steps": steps + 1, "prompts_per_step": r["n"], "correction": r["arm"] == "correction",
         "restore_threads": r["restore"]} for r in trl_runs]
    outs, tail = _engine_script(preset, ["-m", "rlwb.bench.trl_vllm_peer"], {**base, "arms": arms}, python=python,
                                every=True)
    outs = [o.get("error", o) if isinstance(o, dict) else o for o in outs] + [tail] * (len(arms) - len(outs))
    stock = outs[0]
    res["trl_vllm/stock"] = "runs" if isinstance(stock, dict) else (
        [ln for ln in stock.splitlines() if "Error" in ln][-1:] or [stock[-300:]])[0].strip()
    res["trl_vllm/stock_reason"] = None if isinstance(stock, dict) else trl_vllm_peer.STOCK_FAILURE

    def trl(run: dict, r: dict | str) -> dict | None:
        if isinstance(r, str):
            res["trl_vllm/reason"] = f"patched TRL failed ({run['arm']}, {run['n']} prompts): {r[-400:]}"
            return None
        c = run["n"] * GRPO_SHAPE["group_size"]
        return {"step_s": statistics.median(r["step_s"][1:]), "torch_threads": r["torch_threads"],
                "tok_s": statistics.median([t * c / s for t, s in zip(r["completion_tokens"][1:], r["step_s"][1:])]),
                "correction_mode": r["correction_mode"], "patches": r["patches"], "engine_dtype": r["engine_dtype"],
                "is_ratio_logged": any(x is not None for x in r["is_ratio_mean"])}

    c = at * GRPO_SHAPE["group_size"]
    for run, out in zip(trl_runs, outs[1:]):
        r = trl(run, out)
        if r is None:
            break
        if not run["restore"]:  # threads as vLLM leaves them
            res.update({"trl_vllm/vllm_threads/step_s": r["step_s"], "trl_vllm/vllm_threads/torch_threads":
                        r["torch_threads"], "trl_vllm/vllm_threads/patches": r["patches"]})
            res["trl_vllm/thread_reset_cost"] = r["step_s"] / res[f"scaling/trl_vllm/n{c}/step_s"]
            continue
        n = run["n"] * GRPO_SHAPE["group_size"]
        key = f"scaling/trl_vllm/n{n}" if run["arm"] == "correction" else "trl_vllm/no_correction/trl"
        res.update({f"{key}/{k}": r[k] for k in ("step_s", "tok_s", "torch_threads", "correction_mode",
                                                 "is_ratio_logged")})
        res["trl_vllm/patches"], res["trl_vllm/engine_dtype"] = r["patches"], r["engine_dtype"]
    # the ratios pair the two loops' measurements at notebook 03's shape from this section, taken back to back
    # with the same number of steps (grpo/step_s, measured minutes earlier, differed from its scaling twin by
    # up to 25% on 2 shared cores)
    trl_s, rlwb_s = res.get(f"scaling/trl_vllm/n{c}/step_s"), res.get(f"scaling/rlwb/n{c}/step_s")
    res["trl_vllm/step_s"], res["trl_vllm/rlwb_step_s"] = trl_s, rlwb_s
    res["trl_vllm/torch_threads"] = res.get(f"scaling/trl_vllm/n{c}/torch_threads")
    res["speedup_vs_trl_vllm"] = trl_s / rlwb_s if trl_s and rlwb_s else None
    nt, nr = res.get("trl_vllm/no_correction/trl/step_s"), res.get("trl_vllm/no_correction/rlwb/step_s")
    res["speedup_vs_trl_vllm/no_correction"] = nt / nr if nt and nr else None
    return res


_MEMORY = textwrap.dedent("""
    import resource, sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from rlwb.core.scoring.trainer import completion_logprobs, make_batch
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

    from rlwb.bench import trl_peer

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


QUESTION = "How fast do the engines sample here, and what do rlwb's worker and GRPO step cost against the baselines?"


def settings(quick: bool = False) -> dict:
    """The bench's sizes (`--quick`: fewer batch sizes and repeats, shorter requests), recorded in bench.json."""
    batch_sizes = [1, 16] if quick else [1, 16, 64]
    repeats, max_tokens = (2, 32) if quick else (3, 64)
    return {"batch_sizes": batch_sizes, "repeats": repeats, "max_tokens": max_tokens, "dtype": "float32",
            "quick": quick}


def measure(model_path, cfg: dict, run: archive.Run, progress: bool = True) -> dict:
    """Every measurement of the bench at sizes `cfg` (`settings`), each engine's `info()` recorded in `run`'s
    run.json as it starts (`Run.record_engine`, as a notebook run records its engines)."""
    from rlwb.progress import progress_bar

    quick, batch_sizes = cfg["quick"], cfg["batch_sizes"]
    repeats, max_tokens = cfg["repeats"], cfg["max_tokens"]
    res: dict = {}
    engines = {}
    for name in progress_bar(PRESETS, desc="throughput", disable=not progress):
        with EngineWorker(name, model_path) as w:
            info = w.info()
            run.record_engine(info)
            engines[name] = {k: info.get(k) for k in ("engine", "vllm_version", "torch_version")}
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
    res.update(trl_vllm(model_path, 2 if quick else 4, sizes=SCALING_PROMPTS[1:3] if quick else SCALING_PROMPTS))
    return res


def run(outputs: Path, quick: bool = False, progress: bool = True, measure=measure, cfg: dict | None = None) -> Path:
    """Measure (`measure(model_path, cfg, run, progress)` at the sizes `cfg`, by default `settings(quick)`) and
    archive: `outputs/bench/<UTC start>/`, written under a temporary name and renamed when done, like a notebook run.
    Its run.json is started and finished as a notebook run's is (`archive.start_record` / `finish_record`), the model
    recorded as a notebook records it (`rlwb.notebook.use_model`: the build's card, so `rlwb publish` checks its
    published checksum), the engines as they start. `ok` only when every measurement, bench.json, bench.md and the
    figures were written; otherwise the run is archived as failed, with the error (its traceback in logs/), and
    `RunFailed` is raised."""
    import traceback

    from rlwb.errors import RunFailed
    from rlwb.notebook import use_model

    outputs = Path(outputs)
    archive.check_writable(outputs)
    tmp, final = archive.new_run_dir(outputs, archive.BENCH)
    started = time.time()
    record = {**archive.start_record(archive.BENCH, final.name), "question": QUESTION}
    archive.write_record(tmp, record)
    handle = archive.Run(tmp)
    cfg, error = cfg or settings(quick), None
    try:
        model_path = use_model(handle, "default")
        model = archive.read_record(tmp, {})["model"]
        res = {"machine": record["host"], "packages": record["packages"],
               "model": {k: model[k] for k in ("path", "recipe_hash", "weights_sha256_16")},
               "started_at": record["started_at"], "settings": cfg, **measure(model_path, cfg, handle, progress)}
        res["finished_at"] = archive.utc_now()
        archive.write_json(tmp / "bench.json", res)
        presets = bench_plots.measured_presets(res)
        (tmp / "bench.md").write_text(wording.markdown(res, presets, list(GRPO_PHASES)))
        save_figures(res, tmp / "figures", f"{archive.BENCH}/{final.name}")
        handle.record_provenance(answer=wording.answer(res, presets))
    except KeyboardInterrupt:
        error = "interrupted"
    except Exception as e:  # archived as failed, with what failed
        error = f"{type(e).__name__}: {e}"
        (tmp / "logs").mkdir(exist_ok=True)
        (tmp / "logs" / "traceback.txt").write_text(traceback.format_exc())
    archive.write_record(tmp, archive.finish_record(archive.read_record(tmp, record), started,
                                                               error))
    if not any((tmp / "data").iterdir()):  # `archive.Run` made it; a bench's numbers are in bench.json
        (tmp / "data").rmdir()
    tmp.rename(final)
    if error:
        raise RunFailed(final, error)
    return final


def save_figures(res: dict, figures: Path, source: str | None = None, style: str = "notebook") -> list[Path]:
    """The bench's figures (`rlwb.plots.bench`, drawn from `res` alone as `rlwb figures` redraws them) as
    `figures/<name>.{png,pdf,svg}`, each naming the run that made it (`source`: `bench/<run id>`); returns the PNGs."""
    import matplotlib.pyplot as plt

    from rlwb import plots

    written = []
    for name, fig in bench_plots.draw(res, style):
        written.append(plots.save_figure(fig, Path(figures) / name, source))
        plt.close(fig)
    return written
