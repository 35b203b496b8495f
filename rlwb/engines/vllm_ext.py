"""vLLM worker extension: methods that run *inside* vLLM's worker process(es), called by name through
`LLM.collective_rpc`. Naming a class (`worker_extension_cls`) instead of sending pickled callables keeps
`VLLM_ALLOW_INSECURE_SERIALIZATION` off. Works with vLLM 0.8.5 (V0) and current V1.
"""

from __future__ import annotations

import os


def _model(worker):
    return worker.model_runner.model


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
        if head is not None and hasattr(head, "rlwb_weight_fp32") and "lm_head.weight" in sd:
            head.rlwb_weight_fp32 = sd["lm_head.weight"].float().to(head.weight.device)
        return len(sd)

    def rlwb_fp32_lm_head(self, model_dir: str) -> bool:
        """Keep an fp32 copy of lm_head (from the fp32 checkpoint) and project hidden states with it."""
        import glob

        from safetensors.torch import load_file

        head = _model(self).lm_head
        w = None
        for f in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
            sd = load_file(f)
            if "lm_head.weight" in sd:
                w = sd["lm_head.weight"]
                break
        if w is None:  # tied embeddings: upcast what the engine holds
            w = head.weight.detach()
        head.rlwb_weight_fp32 = w.float().to(head.weight.device)
        head.quant_method = _Fp32HeadMethod(head.quant_method)
        return True

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
