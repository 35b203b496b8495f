"""TRL's `GRPOTrainer` generating with vLLM (`use_vllm=True`, colocate mode): `rlwb bench`'s peer on the same engine.

Run by `rlwb bench` under `.venvs/trl-vllm` (TRL on the very vLLM build of `.venvs/vllm-v1`, layered by a .pth;
`scripts/setup.sh trl-vllm`): `python -m rlwb.bench.trl_vllm_peer CONFIG_JSON`. Runs the config's arms (stock TRL,
then the patched runs) in order in one process and prints `RLWB_RESULT <json>` for each (`main`).

Stock TRL 1.16 does not get past its first weight sync on vLLM's CPU build, and this module says exactly why
before it changes anything (`STOCK_FAILURE`): vLLM 0.32 on CPU packs each linear layer's weight for oneDNN
after loading and replaces the parameter with an empty one that has no `weight_loader`
(`vllm/model_executor/layers/utils.py`, `dispatch_cpu_unquantized_gemm(..., remove_weight=True)`, called from
`UnquantizedLinearMethod.process_weights_after_loading`); TRL's colocate sync calls
`model.load_weights([(name, param)])` on the live model (`trl/generation/vllm_generation.py`,
`VLLMGeneration.sync_weights`), which ends in `param.weight_loader(...)`: AttributeError. Nothing there needs
CUDA. On a GPU the parameters keep their loaders and stock TRL runs.

What is changed, and only that (`PATCHES`, recorded with the result):
1. the colocate weight sync goes through vLLM's layerwise reload (`model_runner.reload_weights(...,
   is_checkpoint_format=True)`), which restores each layer's checkpoint layout first — what rlwb's worker does;
2. TRL's `LLM(...)` gets the engine settings of rlwb's `vllm-v1-fixed` preset on this machine (dtype fp32,
   eager mode, no prefix caching, no async scheduling, whole-prompt prefill, processed logprobs, the same RAM
   share), so both loops drive one engine configuration. Stock TRL passes no dtype (vLLM then casts an fp32
   checkpoint to bf16) and leaves the rest at vLLM's defaults.
3. (`restore_threads`, `THREADS_PATCH`) each generate runs with the engine's threads and the update after it
   with the trainer's, as in rlwb's layout.
   vLLM's CPU worker, built in TRL's process, replaces `torch.set_num_threads` with a no-op that logs a warning
   (`vllm/v1/worker/cpu_worker.py`, `CPUWorker.init_device`) and leaves torch at its own thread count (1 here),
   so stock TRL's updates run on one thread where rlwb's trainer, whose engine lives in another process, has
   the kernel's. The patch calls torch's own function, kept from before the engine was built. `rlwb bench` runs
   TRL both ways and reports what the reset costs.

`correction` switches TRL's `vllm_importance_sampling_correction` (its default: on, mode `sequence_mask`, which
rlwb's catalogue holds as `trl.sequence_mask`). With it, TRL recomputes the old logprobs in a no-grad forward
before the update; without it (one update per batch), its PPO ratio is the current policy over itself, detached.
`torch_threads` is measured inside TRL's loss computation, i.e. what the update ran with.
"""

from __future__ import annotations

import json
import sys
import tempfile

STOCK_FAILURE = ("AttributeError: 'Parameter' object has no attribute 'weight_loader' — TRL's colocate weight "
                 "sync (trl/generation/vllm_generation.py, VLLMGeneration.sync_weights: model.load_weights) "
                 "meets the empty parameters vLLM's CPU build leaves after packing linear weights for oneDNN "
                 "(vllm/model_executor/layers/utils.py, dispatch_cpu_unquantized_gemm, remove_weight=True); "
                 "no CUDA involved")
PATCHES = ["colocate weight sync via vLLM's model_runner.reload_weights (layerwise reload), not load_weights",
           "TRL's LLM(...) given the vllm-v1-fixed preset's engine kwargs and dtype"]
THREADS_PATCH = "vLLM generates with the engine's threads, TRL's update runs with the trainer's"


def restore_threads_after_generate(threads: int, set_threads=None, engine_threads: int | None = None) -> dict:
    """Patch 3: each of TRL's vLLM generates runs with the thread count the process started with (the engine
    preset's OMP_NUM_THREADS, what rlwb's worker generates with) and the update after it with `threads`, set by
    torch's own `set_num_threads` (kept now, before vLLM replaces the module attribute, or given: `set_threads` and
    `engine_threads` as the process had them before its first engine, a stock arm's). Returns the switch:
    `on` (False: TRL's generate as shipped) and `reset()`, which puts torch back at the engine's thread count, where
    a fresh process has it when the engine is built (an arm without the patch after one with it starts there)."""
    import torch
    from trl.generation import vllm_generation as vg

    set_threads, stock_generate = set_threads or torch.set_num_threads, vg.VLLMGeneration.generate
    engine_threads = torch.get_num_threads() if engine_threads is None else engine_threads
    switch = {"on": True, "reset": lambda: set_threads(engine_threads)}

    def generate(self, *args, **kwargs):
        if not switch["on"]:
            return stock_generate(self, *args, **kwargs)
        set_threads(engine_threads)
        out = stock_generate(self, *args, **kwargs)
        set_threads(threads)
        return out

    vg.VLLMGeneration.generate = generate
    return switch


def measure_update_threads(trainer_cls) -> list[int]:
    """Record torch's thread count each time `trainer_cls` computes its loss (the update's forward and backward
    follow with the same count); returns the list it fills."""
    import torch

    seen: list[int] = []
    stock = trainer_cls.compute_loss

    def compute_loss(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return stock(self, *args, **kwargs)

    trainer_cls.compute_loss = compute_loss
    return seen


def patch(engine_kwargs: dict) -> None:
    """Patches 1 and 2. The engine is built once per set of `LLM(...)` arguments and kept for the process's next
    trainer that asks for the same (the arms of one run share it; each trainer's first step syncs its own weights
    into it before generating, TRL's `_last_loaded_step` starting at -1), so arms cost no engine start each."""
    import gc

    from trl.generation import vllm_generation as vg

    stock_sync, stock_llm = vg.VLLMGeneration.sync_weights, vg.LLM
    kept: dict = {}

    def sync_weights(self):
        if self.mode != "colocate":
            return stock_sync(self)
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
        self.llm.reset_prefix_cache()

    def llm(*args, **kwargs):
        key = repr((args, sorted({**kwargs, **engine_kwargs}.items())))
        if kept.get("key") != key:
            kept.clear()
            gc.collect()
            kept.update(key=key, llm=stock_llm(*args, **{**kwargs, **engine_kwargs}))
        return kept["llm"]

    vg.VLLMGeneration.sync_weights = sync_weights
    vg.LLM = llm


def run_arm(cfg: dict, arm: dict, update_threads: list[int], patches: list[str]) -> dict:
    """One TRL training run: `arm`'s steps, prompts per step and correction on `cfg`'s model and step shape."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.bench.trl_peer import make_trainer

    update_threads.clear()
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    shape = {k: {**cfg, **arm}[k] for k in ("steps", "prompts_per_step", "group_size", "max_tokens", "lr",
                                            "temperature", "clip_eps", "max_digits")}
    trainer = make_trainer(model, cfg["model"], tempfile.mkdtemp(), **shape, use_vllm=True, vllm_mode="colocate",
                           vllm_gpu_memory_utilization=cfg["engine_kwargs"].get("gpu_memory_utilization", 0.3),
                           vllm_importance_sampling_correction=bool(arm.get("correction", True)))
    try:
        trainer.train()
        logs = [h for h in trainer.state.log_history if "step_time" in h]
        mc = trainer.vllm_generation.llm.llm_engine.vllm_config.model_config
        return {
            "step_s": [float(h["step_time"]) for h in logs], "reward": [float(h["reward"]) for h in logs],
            "completion_tokens": [float(h["completions/mean_length"]) for h in logs],
            "is_ratio_mean": [h.get("sampling/importance_sampling_ratio/mean") for h in logs],
            "engine_dtype": str(mc.dtype).replace("torch.", ""), "patches": list(patches),
            "correction": trainer.vllm_importance_sampling_correction,
            "correction_mode": trainer.vllm_importance_sampling_mode if trainer.vllm_importance_sampling_correction
            else None, "torch_threads": sorted(set(update_threads))}
    finally:
        del trainer, model


def main(config_path: str) -> None:
    """Run `cfg["arms"]` in order in this one process (one TRL and vLLM import; patched arms share one engine per
    set of engine arguments), printing `RLWB_RESULT <json>` per arm as it ends: its result, or `{"error":
    traceback}` if it raised. Arms with `"patch": false` (stock TRL) must come first: the patches, once made, stay.
    After a patched arm fails, the rest are not run. A config without `arms` is one arm (its own keys)."""
    import gc
    import traceback

    import torch
    from trl import GRPOTrainer

    set_threads, engine_threads = torch.set_num_threads, torch.get_num_threads()  # before any engine replaces it

    with open(config_path) as f:
        cfg = json.load(f)
    arms = cfg.get("arms") or [{k: cfg[k] for k in ("patch", "correction", "restore_threads") if k in cfg}]
    update_threads = measure_update_threads(GRPOTrainer)
    patches: list[str] = []
    threads = None
    for arm in arms:
        if arm.get("patch", True) and not patches:
            patch(cfg["engine_kwargs"])
            patches += PATCHES
        elif not arm.get("patch", True) and patches:
            raise ValueError("an arm without the patches after one with them: put stock arms first")
        restore = bool(arm.get("restore_threads", False))
        if restore and threads is None:
            threads = restore_threads_after_generate(int(cfg["trainer_threads"]), set_threads, engine_threads)
        if threads is not None:
            threads["on"] = restore
            if not restore:
                threads["reset"]()
        try:
            out = run_arm(cfg, arm, update_threads, patches + ([THREADS_PATCH] if restore else []))
        except Exception:
            out = {"error": traceback.format_exc()}
        gc.collect()
        print("RLWB_RESULT " + json.dumps(out), flush=True)
        if "error" in out and patches:
            break


if __name__ == "__main__":
    main(sys.argv[1])
