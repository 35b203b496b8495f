"""vLLM worker extension: methods that run *inside* vLLM's worker process(es), called by name through
`LLM.collective_rpc`. Naming a class (`worker_extension_cls`) instead of sending pickled callables keeps
`VLLM_ALLOW_INSECURE_SERIALIZATION` off. Works with vLLM 0.8.5 (V0) and current V1.
"""

from __future__ import annotations

import os


def _model(worker):
    return worker.model_runner.model


def _fp32_head_shard(head, full):
    """This rank's rows of an fp32 lm_head weight, laid out like the engine's own (vocab-parallel) head.

    Why: with tensor parallelism each rank's `ParallelLMHead` holds only its slice of the vocabulary (padded
    to the partition size) and vLLM gathers the ranks' logits; a rank projecting with the whole matrix
    would hand back a full-vocab block where a slice is expected. The slice comes from the head's own
    `shard_indices`, as vLLM's `weight_loader` uses them (vLLM 0.8.5 and current)."""
    import torch

    out = torch.zeros(head.weight.shape, dtype=torch.float32, device=head.weight.device)
    si = getattr(head, "shard_indices", None)
    start, end = (si.org_vocab_start_index, si.org_vocab_end_index) if si is not None else (0, full.shape[0])
    out[: end - start] = full[start:end].float()
    return out


def _head_weight(sd: dict):
    """The lm_head matrix of a checkpoint: `lm_head.weight`, or the embedding when the two are tied."""
    if "lm_head.weight" in sd:
        return sd["lm_head.weight"]
    return sd.get("model.embed_tokens.weight")


class _Fp32HeadMethod:
    """lm_head projection in fp32 from fp32 master weights (PipelineRL's `bf16_last_layer_fp32`)."""

    def __init__(self, inner):
        self.inner = inner

    def apply(self, layer, x, bias=None):
        import torch.nn.functional as F

        return F.linear(x.float(), layer.rlwb_weight_fp32, None if bias is None else bias.float())

    def __getattr__(self, name):
        return getattr(self.inner, name)


class RlwbWorkerExtension:
    def rlwb_update_weights(self, path: str) -> int:
        """Load a safetensors file of HF-named tensors into the running model, in place."""
        from safetensors.torch import load_file

        sd = load_file(path)
        model = _model(self)
        runner = self.model_runner
        if hasattr(runner, "reload_weights"):
            # Current V1: layerwise in-place reload. It restores each layer's checkpoint layout, loads, and
            # re-runs weight post-processing - needed on CPU, where linear weights are repacked for oneDNN
            # and the original parameters are emptied after loading.
            runner.reload_weights(weights_iterator=iter(sd.items()), is_checkpoint_format=True)
        else:  # vLLM 0.8.5 (V0): parameters keep their checkpoint layout
            model.load_weights(weights=iter(sd.items()))
        head = getattr(model, "lm_head", None)
        if head is not None and hasattr(head, "rlwb_weight_fp32") and _head_weight(sd) is not None:
            head.rlwb_weight_fp32 = _fp32_head_shard(head, _head_weight(sd))
        return len(sd)

    def rlwb_fp32_lm_head(self, model_dir: str) -> bool:
        """Keep an fp32 copy of lm_head (from the fp32 checkpoint) and project hidden states with it."""
        import glob

        from safetensors.torch import load_file

        head = _model(self).lm_head
        w = None
        for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
            w = _head_weight(load_file(f))  # tied embeddings: the fp32 embedding matrix is the head
            if w is not None:
                break
        if w is None:
            raise ValueError(f"no lm_head.weight or model.embed_tokens.weight in {model_dir}/*.safetensors")
        head.rlwb_weight_fp32 = _fp32_head_shard(head, w)
        head.quant_method = _Fp32HeadMethod(head.quant_method)
        return True

    def rlwb_fp32_lm_head_rows(self) -> int:
        """Read back from the running model: vocabulary rows this rank's lm_head projects in fp32 (0: the
        hook is not active). With tensor parallelism each rank holds only its slice."""
        head = getattr(_model(self), "lm_head", None)
        w = getattr(head, "rlwb_weight_fp32", None)
        return int(w.shape[0]) if head is not None and isinstance(head.quant_method, _Fp32HeadMethod) and \
            w is not None else 0

    def rlwb_batch_invariant(self):
        """Read back from this rank: is vLLM's batch-invariant mode on (what `VLLM_BATCH_INVARIANT=1` asks for)?
        vLLM sets the module flag when `init_batch_invariance` enabled the mode in this process; None where this
        vLLM has no such mode (0.8.5)."""
        import importlib

        for module in ("vllm.model_executor.determinism.batch_invariant", "vllm.model_executor.layers.batch_invariant"):
            try:
                m = importlib.import_module(module)
            except ImportError:
                continue
            if hasattr(m, "_batch_invariant_MODE"):
                return bool(m._batch_invariant_MODE)
        return None

    def rlwb_record_routing(self, on: bool) -> int:
        """Record each MoE layer's router logits as the engine computes them (a forward hook on every
        `<layer>.mlp.gate`). Why a hook: vLLM's own `enable_return_routed_experts` needs Model Runner V2,
        which needs Triton - not there on CPU. The expert choice is top-k of these logits (vLLM's fused top-k
        softmax is monotone in them), so the logits carry the engine's routing decisions."""
        import re

        model = _model(self)
        for h in getattr(self, "_rlwb_route_hooks", []):
            h.remove()
        self._rlwb_route_hooks, self._rlwb_routes = [], {}
        if not on:
            return 0
        for name, mod in model.named_modules():
            m = re.search(r"layers\.(\d+)\.mlp\.gate$", name)
            if m is None:
                continue
            layer = int(m.group(1))
            self._rlwb_routes[layer] = []

            def hook(_mod, _inp, out, layer=layer):
                logits = out[0] if isinstance(out, tuple) else out
                self._rlwb_routes[layer].append(logits.detach().float().cpu())

            self._rlwb_route_hooks.append(mod.register_forward_hook(hook))
        return len(self._rlwb_route_hooks)

    def rlwb_take_routing(self) -> dict:
        import torch

        out = {layer: (torch.cat(chunks).numpy().tolist() if chunks else [])
               for layer, chunks in getattr(self, "_rlwb_routes", {}).items()}
        for chunks in getattr(self, "_rlwb_routes", {}).values():
            chunks.clear()
        return out

    def rlwb_weights_checksum(self) -> float:
        return float(sum(p.detach().double().sum().item() for p in _model(self).parameters()))

    def rlwb_idle_spin(self, seconds: float) -> int:
        """Shorten how long vLLM's shared-memory queue readers busy-wait after each message (vLLM: 1 s).

        On a GPU box that spin costs one idle CPU core; on a small CPU machine where the engine and the
        trainer share the cores it stalls the trainer for ~1 s after every generate call (measured on 2
        cores: a 50 ms scoring pass took 1.0 s right after a generate). 0 is worse: readers then sleep on a
        notification that is sometimes missed (5 s stalls seen); 0.1 s measured steady (0.15 s scoring).
        """
        import gc

        n = 0
        for o in gc.get_objects():
            if type(o).__name__ == "SpinCondition" and getattr(o, "is_reader", False):
                o.busy_loop_s = float(seconds)
                n += 1
        return n
