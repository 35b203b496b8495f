"""The vLLM backend of an engine worker (`server.py`): vLLM's offline `LLM`, V0 (vLLM <= 0.10 with VLLM_USE_V1=0)
or V1, behind the worker's operations (generate, weight updates, checksums, routing, scheduler counters, `info()`).

Runs under the engine's interpreter (a vLLM 0.8.5 venv or a vLLM V1 venv), beside `server.py`: it imports only the
standard library, numpy, torch, transformers, vLLM and its sibling engine-side modules (`protocol`, and `vllm_ext` by
name as vLLM's worker extension), never rlwb.
"""

from __future__ import annotations

import json
import os
import sys

import protocol  # the sibling module: `server.py` puts rlwb/engines on sys.path


def _vocab_size(model_path: str) -> int | None:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            return int(json.load(f)["vocab_size"])
    except Exception:
        return None


def _inspect_models_in_process() -> bool:
    """vLLM 0.8.5 inspects a model's class in a child process that imports vLLM again (`registry._run_in_subprocess`,
    "to avoid initializing CUDA"): 5.7 s of every V0 engine start on a 2-core CPU (measured), for a
    class the engine then imports in its own process anyway. On vLLM's CPU platform there is no CUDA to protect, so
    the same function runs here instead. Current vLLM keeps the helper but caches its answer on disk (`modelinfos/`),
    so there it matters only on a cache miss. On any other platform nothing changes, and the platform is asked the
    way vLLM asks it (never `torch.cuda.is_available()`, which on a CUDA build would make vLLM's later forks fail).
    Returns whether it patched."""
    try:
        from vllm.model_executor.models import registry
        from vllm.platforms import current_platform
    except ImportError:
        return False
    if not current_platform.is_cpu() or not callable(getattr(registry, "_run_in_subprocess", None)):
        return False
    registry._run_in_subprocess = lambda fn: fn()
    return True


class VllmBackend:
    """vLLM's offline `LLM`, either V0 (vLLM <= 0.10 with VLLM_USE_V1=0) or V1."""

    def __init__(self, spec: dict):
        from vllm import LLM

        self.model_inspection = "in process" if _inspect_models_in_process() else "vLLM's own"
        self.spec = spec
        kwargs = dict(spec.get("vllm_kwargs") or {})
        kwargs.setdefault("dtype", spec.get("dtype", "float32"))
        kwargs.setdefault("seed", 0)
        self.vocab = _vocab_size(spec["model"])
        limit = int(spec.get("full_vocab_limit", 4096))
        if self.vocab and self.vocab <= limit:
            kwargs.setdefault("max_logprobs", self.vocab)  # full-vocab logprobs at every step
        kwargs["worker_extension_cls"] = "vllm_ext.RlwbWorkerExtension"
        self.fp32_head = self._fp32_head_impl(spec.get("fp32_lm_head", False), str(kwargs["dtype"]))
        if self.fp32_head == "vllm head_dtype":
            kwargs["hf_overrides"] = {**(kwargs.get("hf_overrides") or {}), "head_dtype": "float32"}
        self.kwargs = kwargs
        self.llm = LLM(model=spec["model"], tokenizer=spec.get("tokenizer") or spec["model"], **kwargs)
        self._check_rope_theta(spec["model"])
        mod = type(self.llm.llm_engine).__module__
        self.engine = "v1" if mod.startswith("vllm.v1") else "v0"
        self.warnings: list[str] = []
        self.idle_spin_patched = None
        # V1 with its engine core and worker inside this process: no queues between processes to spin on
        self.in_process = (self.engine == "v1" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
                           and kwargs.get("distributed_executor_backend") == "uni")
        if self.engine == "v1" and spec.get("idle_spin_s") is not None:
            counts = self.llm.collective_rpc("rlwb_idle_spin", args=(float(spec["idle_spin_s"]),))
            self.idle_spin_patched = int(sum(counts)) if isinstance(counts, list) else int(counts)
            if self.idle_spin_patched == 0 and not self.in_process:  # vLLM renamed its queue internals
                self.warnings.append(f"idle_spin_s={spec['idle_spin_s']} patched no SpinCondition reader in this "
                                     f"vLLM ({self._version()}): its queues keep vLLM's own busy-wait")
        if self.fp32_head == "rlwb hook":
            self.llm.collective_rpc("rlwb_fp32_lm_head", args=(spec["model"],))
        for w in self.warnings:
            print(f"rlwb warning: {w}", file=sys.stderr, flush=True)

    @staticmethod
    def _fp32_head_impl(mode, dtype: str) -> str | None:
        """Which fp32 lm_head a preset's `fp32_lm_head` gets here: vLLM's own `head_dtype` (an `hf_overrides`
        key read by `ModelConfig.head_dtype`) where this vLLM has it and the preset does not insist on rlwb's
        hook; rlwb's hook (`vllm_ext`) otherwise. None when there is nothing to do (off, or an fp32 engine)."""
        if not mode or dtype in ("float32", "torch.float32"):
            return None
        from vllm.config import ModelConfig

        native = isinstance(getattr(ModelConfig, "head_dtype", None), property)
        if mode == "native" and not native:
            raise ValueError(f"fp32_lm_head: native needs vLLM's ModelConfig.head_dtype, which vLLM "
                             f"{VllmBackend._version()} does not have; use fp32_lm_head: rlwb")
        return "vllm head_dtype" if native and mode != "rlwb" else "rlwb hook"

    def _check_rope_theta(self, model: str) -> None:
        """Refuse to run a checkpoint whose RoPE base the engine read differently from what the checkpoint says.

        transformers >= 5 saves `rope_theta` only inside `rope_parameters`; transformers 4.51 (vLLM 0.8.5's
        environment) reads the top-level key and silently falls back to the architecture's default (1e4 for
        Qwen2): a Qwen2 with rope_theta 1e6 then runs in V0 with other positions and sits ~1e-2 from the
        trainer at every token (measured). Hub checkpoints carry the top-level key; one saved by transformers 5
        needs it added."""
        cfg_path = os.path.join(model, "config.json")
        if not os.path.isfile(cfg_path):
            return  # a hub id: its config.json comes from the hub with the top-level key
        with open(cfg_path) as f:
            cfg = json.load(f)
        wanted = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta"))
        mc = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "model_config", None)
        hf = getattr(mc, "hf_config", None)
        got = getattr(hf, "rope_theta", None)
        if got is None:
            got = (getattr(hf, "rope_parameters", None) or {}).get("rope_theta")
        if wanted is not None and got is not None and float(wanted) != float(got):
            raise ValueError(f"{cfg_path} says rope_theta={wanted} but this engine (vLLM {self._version()}) read "
                             f"{got}: the file has rope_theta only inside rope_parameters (as transformers >= 5 "
                             f"writes it), which transformers < 5 does not read. Add \"rope_theta\": {wanted} at "
                             f"the top level of config.json.")

    @staticmethod
    def _backend_name(backend) -> str | None:
        """vLLM's executor backend as a name: it holds a string, or the executor class when one was passed."""
        return backend if backend is None or isinstance(backend, str) else getattr(backend, "__name__", str(backend))

    @staticmethod
    def _version() -> str:
        import vllm

        return vllm.__version__

    def info(self) -> dict:
        import torch
        import transformers
        import vllm

        cfg = getattr(self.llm.llm_engine, "vllm_config", None)
        settings = {"vllm_kwargs": {k: v for k, v in self.kwargs.items() if k != "worker_extension_cls"}}
        if cfg is not None:  # the effective settings, read from the running engine's config
            mc, cc, sc, pc = cfg.model_config, cfg.cache_config, cfg.scheduler_config, cfg.parallel_config
            settings.update(
                tensor_parallel_size=pc.tensor_parallel_size,
                enable_chunked_prefill=bool(getattr(sc, "chunked_prefill_enabled",
                                                    getattr(sc, "enable_chunked_prefill", False))),
                kv_cache_dtype=str(cc.cache_dtype),
                dtype=str(mc.dtype).replace("torch.", ""),
                max_model_len=mc.max_model_len,
                enforce_eager=mc.enforce_eager,
                enable_prefix_caching=bool(cc.enable_prefix_caching),
                logprobs_mode=str(getattr(mc, "logprobs_mode", "processed (V0 semantics)")),
                async_scheduling=bool(getattr(sc, "async_scheduling", False)),
                max_logprobs=mc.max_logprobs,
                block_size=cc.block_size,
                head_dtype=str(getattr(mc, "head_dtype", "")).replace("torch.", "") or None,
                speculative=(None if getattr(cfg, "speculative_config", None) is None
                             else str(getattr(cfg.speculative_config, "method", "on"))),
                max_num_batched_tokens=getattr(sc, "max_num_batched_tokens", None),
                distributed_executor_backend=self._backend_name(getattr(pc, "distributed_executor_backend", None)),
                generation_config=str(getattr(mc, "generation_config", "auto")),
                default_sampling_params=mc.get_diff_sampling_param(),  # {} when generation_config is "vllm"
            )
            modes = self.llm.collective_rpc("rlwb_batch_invariant")  # every rank's own flag
            modes = modes if isinstance(modes, list) else [modes]
            settings["batch_invariant"] = None if any(m is None for m in modes) else all(modes)
        settings["in_process"] = self.in_process
        settings["idle_spin_s"] = self.spec.get("idle_spin_s")
        settings["idle_spin_patched"] = self.idle_spin_patched
        settings["model_inspection"] = self.model_inspection
        # read back from every rank's model, not from the preset: the hook is either there or it is not
        rows = self.llm.collective_rpc("rlwb_fp32_lm_head_rows")
        rows = rows if isinstance(rows, list) else [rows]
        hook = bool(rows) and all(r > 0 for r in rows)
        native = self.fp32_head == "vllm head_dtype" and settings.get("head_dtype") == "float32"
        settings["fp32_lm_head"] = hook or native
        settings["fp32_lm_head_impl"] = "rlwb hook" if hook else "vllm head_dtype" if native else None
        settings["fp32_lm_head_rows"] = [int(r) for r in rows]  # per rank: the vocab slice rlwb's hook projects
        return {"backend": "vllm", "engine": self.engine, "vllm_version": vllm.__version__,
                "torch_version": torch.__version__, "transformers_version": transformers.__version__,
                "settings": settings, "warnings": list(self.warnings)}

    def requests_to_vllm(self, requests: list[dict], full: bool, text: bool = True) -> tuple[list[dict], list]:
        """rlwb's requests as vLLM's prompts and SamplingParams (`rlwb bench` times `llm.generate` on these);
        `text=False`: no detokenizing (no output text, no decoded logprob tokens; tokens and logprobs the same)."""
        from vllm import SamplingParams

        prompts, params = [], []
        for r in requests:
            s = r["sampling"]
            top_k = int(s.get("top_k", 0))
            params.append(SamplingParams(
                n=int(s.get("n", 1)), temperature=float(s["temperature"]), top_p=float(s.get("top_p", 1.0)),
                top_k=top_k if top_k > 0 else -1, max_tokens=int(s["max_tokens"]), seed=s.get("seed"),
                ignore_eos=bool(s.get("ignore_eos", False)),
                logprobs=(self.vocab if full else 0),
                # explicit and neutral: nothing of a checkpoint's generation_config.json reaches the sampler (the
                # presets also set generation_config: vllm, so vLLM never reads it as defaults)
                repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_p=0.0, min_tokens=0,
                detokenize=text,
            ))
            prompts.append({"prompt_token_ids": list(r["prompt_token_ids"])})
        return prompts, params

    def generate(self, requests: list[dict], full: bool, text: bool = True) -> list[dict]:
        prompts, params = self.requests_to_vllm(requests, full, text)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for out in outs:
            samples = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lp = [step[t].logprob for step, t in zip(c.logprobs, ids)]
                sample = {"token_ids": ids, "logprobs": protocol.f32(lp), "text": c.text or "",
                          "finish_reason": c.finish_reason}
                if full:
                    import numpy as np

                    dist = np.full((len(ids), self.vocab), -np.inf, dtype=np.float32)
                    for i, step in enumerate(c.logprobs):
                        for tok, entry in step.items():
                            dist[i, tok] = entry.logprob
                    sample["full"] = dist
                samples.append(sample)
            results.append({"prompt_token_ids": list(out.prompt_token_ids), "samples": samples})
        return results

    def update_weights(self, path: str, reset: bool | None = None) -> dict:
        n = self.llm.collective_rpc("rlwb_update_weights", args=(path,))
        per_rank = n if isinstance(n, list) else [n]
        if len(set(per_rank)) != 1:  # every rank must have loaded the whole update
            raise RuntimeError(f"weight update loaded different tensor counts per rank: {per_rank}")
        reset = bool(self.spec.get("reset_prefix_cache_on_update")) if reset is None else bool(reset)
        cache_reset = self.reset_prefix_cache() if reset else False
        return {"tensors": per_rank[0], "ranks": len(per_rank), "prefix_cache_reset": reset,
                "prefix_cache_reset_ok": cache_reset}

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())

    def record_routing(self, on: bool) -> int:
        """Start (or stop) recording every MoE layer's router logits inside the engine; returns the number of
        router layers hooked (0: not an MoE model)."""
        n = self.llm.collective_rpc("rlwb_record_routing", args=(on,))
        return int(n[0] if isinstance(n, list) else n)

    def take_routing(self) -> dict:
        """The router logits recorded since the last take, per MoE layer: {layer: [tokens, experts] float32},
        rows in the order the engine ran them. Rank 0's: routers are replicated across tensor-parallel ranks."""
        r = self.llm.collective_rpc("rlwb_take_routing")
        r = r[0] if isinstance(r, list) else r
        return {str(k): protocol.f32(v) for k, v in r.items()}

    def weights_checksums(self) -> list[float]:
        """One checksum per tensor-parallel rank (each rank holds its own shards)."""
        r = self.llm.collective_rpc("rlwb_weights_checksum")
        return [float(x) for x in (r if isinstance(r, list) else [r])]

    def weights_checksum(self) -> float:
        return float(sum(self.weights_checksums()))

    def stats(self) -> dict:
        """Scheduler counters since start. Preemptions: V0 keeps them on its scheduler objects; V1 only in
        its Prometheus metrics, which exist when the engine was started with `disable_log_stats=False`."""
        preemptions = None
        if self.engine == "v0":
            preemptions = int(sum(s.num_cumulative_preemption for s in self.llm.llm_engine.scheduler))
        else:
            try:
                vals = [m.value for m in self.llm.get_metrics() if m.name == "vllm:num_preemptions"]
                preemptions = int(sum(vals)) if vals else None
            except Exception:  # stats logging off: no counters to read
                preemptions = None
        return {"preemptions": preemptions}
