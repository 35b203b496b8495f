"""The GRPO step with nothing of rlwb's around it: `rlwb bench`'s baseline for `grpo/rlwb_vs_minimal`.

Run by `rlwb bench` under an engine's own interpreter (`python -m rlwb.bench.minimal_loop SPEC_JSON`), so one
process holds both the engine and the fp32 trainer, the way a hand-written loop (or TRL's colocate mode)
would. The engine is built from the same spec as rlwb's worker (`worker_spec`: same vLLM kwargs, dtype,
idle spin, fp32 head) and receives weights the same way (a safetensors file loaded by vLLM's layerwise
reload); the step is the same arithmetic (`tasks.reward`, `group_advantages`, `completion_logprobs`,
`grpo_loss`, AdamW, grad clip). What it leaves out is what rlwb adds: the kernel/worker process split and its
pipes, shared-memory transfers, and the per-step bookkeeping of `rlwb.core.rl.grpo.grpo_step` (mismatch metrics,
entropy, correction health, the batch record). Prints `RLWB_RESULT <json>` with its per-step seconds, rewards and
the thread counts it measured while sampling and while updating.

Threads: vLLM's CPU worker, once built in this process, replaces `torch.set_num_threads` with a function that
only logs a warning (`vllm/v1/worker/cpu_worker.py`, `CPUWorker.init_device`: "CPU backend doesn't allow to use
`torch.set_num_threads` after the thread binding, skip it"). An earlier version of this loop called it to give
its update the kernel's threads, got none of them, and trained on the engine's one thread: its update was 27%
slower than rlwb's for that reason alone (`grpo/update_vs_minimal` 0.73). The loop keeps torch's own function
from before the engine is built and switches threads with it, and reports the count it measured in each phase.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time


def main(spec_path: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from rlwb.core.data import tasks
    from rlwb.core.data.tokenizer import encode_prompt
    from rlwb.core.rl import losses
    from rlwb.core.rl.grpo_config import step_problem_seed
    from rlwb.core.scoring.trainer import completion_logprobs, make_batch
    from rlwb.engines.worker import Sampling, generate_requests, without_aliases

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engines"))
    from vllm_backend import VllmBackend  # rlwb/engines/vllm_backend.py: the class the worker process runs

    with open(spec_path) as f:
        cfg = json.load(f)
    torch.manual_seed(0)
    set_threads = torch.set_num_threads  # torch's own: vLLM's CPU worker replaces the module attribute (above)
    engine = VllmBackend(cfg["spec"])
    # Like for like with rlwb's layout: the engine generates with the threads its worker process has (the
    # preset's OMP_NUM_THREADS, as vLLM left them), the trainer trains with the kernel's thread count.
    engine_threads, trainer_threads = torch.get_num_threads(), int(cfg["trainer_threads"])
    measured = {"rollout": [], "update": []}  # torch's thread count inside each phase, every step
    model = AutoModelForCausalLM.from_pretrained(cfg["spec"]["model"], dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.99), weight_decay=0.0)
    G, T = cfg["group_size"], cfg["temperature"]
    weights = os.path.join(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None), "w.safetensors")
    times, phases, rewards_per_step = [], {"rollout": [], "update": [], "sync": []}, []
    for step in range(cfg["steps"]):
        t0 = time.perf_counter()
        problems = tasks.make_problems(cfg["prompts_per_step"], seed=step_problem_seed(0, step),
                                       max_digits=cfg["max_digits"])
        prompts = [encode_prompt(p.prompt) for p in problems for _ in range(G)]
        set_threads(engine_threads)
        measured["rollout"].append(torch.get_num_threads())
        reqs = generate_requests(prompts, Sampling(temperature=T, max_tokens=cfg["max_tokens"], seed=step * 1000))
        outs = engine.llm.generate(*engine.requests_to_vllm(reqs, full=False), use_tqdm=False)
        comps = [o.outputs[0] for o in outs]
        ids = [list(c.token_ids) for c in comps]
        behaviour = [[step_lp[t].logprob for step_lp, t in zip(c.logprobs, i)] for c, i in zip(comps, ids)]
        rewards = torch.tensor([tasks.reward(problems[k // G], c.text) for k, c in enumerate(comps)])
        adv = losses.group_advantages(rewards, G)
        t1 = time.perf_counter()
        set_threads(trainer_threads)
        measured["update"].append(torch.get_num_threads())
        width = max(map(len, ids))
        mask = torch.zeros(len(ids), width, dtype=torch.bool)
        old = torch.zeros(len(ids), width)
        for k, lp in enumerate(behaviour):
            mask[k, : len(lp)] = True
            old[k, : len(lp)] = torch.tensor(lp)
        flat = completion_logprobs(model, make_batch(prompts, ids), T)["logp"]
        cur = torch.zeros(len(ids), width).masked_scatter(mask, flat)  # keeps the graph through `flat`
        loss, _ = losses.grpo_loss(cur, old, adv, mask, cfg["clip_eps"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t2 = time.perf_counter()
        save_file(without_aliases(model.state_dict()), weights)
        engine.update_weights(weights)
        t3 = time.perf_counter()
        times.append(t3 - t0)
        rewards_per_step.append(float(rewards.mean()))
        for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2)):
            phases[k].append(v)
    print("RLWB_RESULT " + json.dumps({"step_s": times, **{f"{k}_s": v for k, v in phases.items()},
                                       "reward_mean": rewards_per_step, "engine_threads": engine_threads,
                                       "trainer_threads": trainer_threads,
                                       "measured_threads": {k: sorted(set(v)) for k, v in measured.items()}}),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
