"""Check rlwb's GPU memory plan against what the trainer really allocates on a CUDA GPU.

Runs the trainer side of notebooks 01 and 03 on randomly initialised Qwen2.5-0.5B / 1.5B shapes (no
download: the published configs, built in place on the GPU) and prints, per role, the peak memory torch
allocated next to `rlwb.memory_plan.trainer_bytes` (which must not be below it: the plan is meant to be on
the safe side), plus the micro-batched vs whole-batch gradient on CUDA. For notebook 03 both passes of a
micro-batched step are measured: the no-grad old-logprob pass over the whole step's batch (03's gpu.yaml: 32 x 8
sequences, in the scorer's slices: `trainer.batch_logprobs`) and the update's accumulation; and, for contrast,
that pass as one forward (what the slicing saves; an out-of-memory error is recorded as such). Then each notebook's
memory plan on this GPU (`plans_on`).

    python scripts/gpu_memory_check.py            # needs a CUDA GPU; ~2 min on an H100
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rlwb import memory_plan as mp
from rlwb.core.rl import grpo  # noqa: E402
from rlwb.core.scoring.trainer import TrainerScorer, batch_logprobs, completion_logprobs, make_batch  # noqa: E402
from rlwb.registry import NOTEBOOKS

QWEN = {  # config.json of each published checkpoint (the fields the plan and the model need)
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True),
    "Qwen2.5-1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True),
}
PROMPT, COMPLETION, MICRO = 256, 512, 4  # notebook 03's gpu.yaml: 512-token completions, micro_batch 4
STEP = 32 * 8  # notebook 03's gpu.yaml: prompts_per_step x group_size sequences in a step's old-logprob pass
LONG = 16384 + 64  # notebook 05's gpu.yaml: its longest context


def batch(n: int, g: torch.Generator, vocab: int):
    prompts = torch.randint(0, vocab, (n, PROMPT), generator=g).tolist()
    comps = torch.randint(0, vocab, (n, COMPLETION), generator=g).tolist()
    mask = torch.ones(n, COMPLETION, dtype=torch.bool, device="cuda")
    behaviour = -torch.rand(n, COMPLETION, generator=g).cuda() * 3
    adv = torch.randn(n, generator=g).cuda()
    return prompts, comps, mask, behaviour, adv


def peak(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def plans_on(shape: mp.ModelShape, total: int) -> dict:
    """The memory plan of every notebook with a GPU configuration (`params/<stem>/gpu.yaml`) on a GPU of `total`
    bytes: its engines at the dtype that file sets (else its schema's default), its trainer's largest forward the
    roles measured above (a GRPO micro-batch, else 64 scored sequences); a plan that cannot fit is its error."""
    from rlwb.params import read_yaml

    plans = {}
    for nb, record in NOTEBOOKS.items():
        gpu = record.params_dir / "gpu.yaml"
        if not gpu.is_file():
            continue
        dtype = read_yaml(gpu).get("dtype") or record.schema().dtype
        seqs = MICRO if record.needs.role == "train" else 64
        try:
            p = mp.plan(nb, record.needs, shape, total, dtype, seqs=seqs, seq_len=PROMPT + COMPLETION)
            plans[nb] = {"gpu_memory_utilization": p.gpu_memory_utilization, "trainer_gib": p.trainer_gib,
                         "engine_gib": p.engine_gib}
        except mp.MemoryPlanError as e:
            plans[nb] = str(e)
    return plans


def main() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    assert torch.cuda.is_available(), "needs a CUDA GPU"
    total = torch.cuda.get_device_properties(0).total_memory
    out = {"gpu": torch.cuda.get_device_name(0), "gpu_gib": round(total / mp.GiB, 1), "torch": torch.__version__,
           "models": {}}
    g = torch.Generator().manual_seed(0)
    for name, cfg_d in QWEN.items():
        shape = mp.ModelShape.from_config(cfg_d)
        cfg = Qwen2Config(**cfg_d, rope_theta=1e6)
        t0 = time.time()
        with torch.device("cuda"):
            model = Qwen2ForCausalLM(cfg).float()
        res = {"params": sum(p.numel() for p in model.parameters()), "params_plan": shape.params()}
        # notebook 01 role: an fp32 scorer, no grad, 64 sequences of 768 tokens
        scorer = TrainerScorer(model, "float32")
        prompts, comps, *_ = batch(64, g, cfg.vocab_size)
        res["score_peak_gib"] = peak(lambda: scorer.score(prompts, comps, temperature=0.7)) / mp.GiB
        res["score_plan_gib"] = (mp.trainer_bytes(shape, "score", 64, PROMPT + COMPLETION)
                                 - mp.PROCESS_OVERHEAD) / mp.GiB
        # notebook 05 role: one long context at a time (gpu.yaml: 16,384 + 64 tokens)
        long_p = torch.randint(0, cfg.vocab_size, (1, LONG - 64), generator=g).tolist()
        long_c = torch.randint(0, cfg.vocab_size, (1, 64), generator=g).tolist()
        res["long_score_peak_gib"] = peak(lambda: scorer.score(long_p, long_c, batch_size=1)) / mp.GiB
        res["long_score_plan_gib"] = (mp.trainer_bytes(shape, "score", 1, LONG) - mp.PROCESS_OVERHEAD) / mp.GiB
        # notebook 03 role: AdamW on the fp32 policy, a copy of the initial weights, 32 sequences in micro-batches
        model.train()
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        prompts, comps, mask, behaviour, adv = batch(32, g, cfg.vocab_size)
        gcfg = grpo.GRPOConfig(micro_batch=MICRO, temperature=0.7)

        def step():
            opt.zero_grad(set_to_none=True)
            grpo.accumulate_policy_gradient(model, prompts, comps, gcfg, behaviour, adv, mask)
            opt.step()

        step()  # the first step creates AdamW's moments; the second is the steady state
        res["train_peak_gib"] = peak(step) / mp.GiB
        res["train_plan_gib"] = (mp.trainer_bytes(shape, "train", MICRO, PROMPT + COMPLETION)
                                 - mp.PROCESS_OVERHEAD) / mp.GiB
        # the step's no-grad old-logprob pass over all its sequences, AdamW's state alive (grpo_step with
        # micro_batch > 0): in the scorer's slices, as grpo_step runs it, then as one forward, for contrast
        step_batch = make_batch(*batch(STEP, g, cfg.vocab_size)[:2])
        with torch.no_grad():
            res["old_pass_peak_gib"] = peak(lambda: batch_logprobs(model, step_batch, 0.7, entropy=True)) / mp.GiB
            try:
                res["old_pass_whole_peak_gib"] = peak(
                    lambda: completion_logprobs(model, step_batch, 0.7, entropy=True)) / mp.GiB
            except torch.cuda.OutOfMemoryError as e:
                res["old_pass_whole_peak_gib"] = f"out of memory: {str(e).splitlines()[0][:160]}"
        torch.cuda.empty_cache()
        # the micro-batched gradient equals the whole batch's on CUDA too (8 sequences, slices of 3)
        p8, c8, m8, b8, a8 = prompts[:8], comps[:8], mask[:8], behaviour[:8], adv[:8]
        grads = {}
        for micro in (0, 3):
            opt.zero_grad(set_to_none=True)
            grpo.accumulate_policy_gradient(model, p8, c8, grpo.GRPOConfig(micro_batch=micro), b8, a8, m8)
            grads[micro] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        res["micro_grad_rel_err"] = float((grads[3] - grads[0]).norm() / grads[0].norm())
        res["seconds"] = round(time.time() - t0, 1)
        del model, scorer, opt, initial, grads
        torch.cuda.empty_cache()
        res["plans_on_this_gpu"] = plans_on(shape, total)
        out["models"][name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}
        print(json.dumps({name: out["models"][name]}), flush=True)
    ok = all(m["train_peak_gib"] <= m["train_plan_gib"] and m["old_pass_peak_gib"] <= m["train_plan_gib"]
             and m["score_peak_gib"] <= m["score_plan_gib"]
             and m["long_score_peak_gib"] <= m["long_score_plan_gib"] and m["micro_grad_rel_err"] < 1e-4
             for m in out["models"].values())
    print(json.dumps(out, indent=2))
    print("plan covers measured peaks:", ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
