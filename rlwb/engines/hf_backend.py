"""The transformers backend of an engine worker (`server.py`): `generate` as the reference engine, behind the
worker's operations.

Runs under the kernel's interpreter as its own process, beside `server.py`: it imports only the standard library,
numpy, torch, transformers and safetensors, never rlwb.
"""

from __future__ import annotations

# the generation_config.json fields that change what is sampled (reported in info() when a checkpoint sets them)
CHECKPOINT_SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty",
                              "no_repeat_ngram_size", "presence_penalty", "frequency_penalty", "epsilon_cutoff",
                              "eta_cutoff", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
                              "sequence_bias", "min_new_tokens", "min_length", "max_new_tokens", "max_length")


class HfBackend:
    """transformers `generate`: the reference engine. Scores are the processed (warped) logits."""

    def __init__(self, spec: dict):
        import torch
        from transformers import AutoModelForCausalLM

        self.spec = spec
        self.dtype = spec.get("dtype", "float32")
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, self.dtype)).eval()
        self.device = "cuda" if torch.cuda.is_available() and spec.get("device", "auto") != "cpu" else "cpu"
        self.model.to(self.device)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(spec.get("tokenizer") or spec["model"])
        from transformers import GenerationConfig

        # The checkpoint's generation_config.json may set sampling defaults (a hub instruct model's
        # repetition_penalty, top_k, temperature, do_sample); `generate` fills every field a call leaves unset from
        # it. The reference samples only what rlwb's request says, so only the special tokens are kept from it.
        gc = self.model.generation_config
        self.checkpoint_sampling = {k: v for k, v in gc.to_diff_dict().items() if k in CHECKPOINT_SAMPLING_FIELDS}
        self.model.generation_config = GenerationConfig(bos_token_id=gc.bos_token_id, eos_token_id=gc.eos_token_id,
                                                        pad_token_id=gc.pad_token_id)
        self.eos, self.pad = gc.eos_token_id, (gc.pad_token_id if gc.pad_token_id is not None else 0)

    def info(self) -> dict:
        import transformers

        return {"backend": "hf", "engine": "hf", "vllm_version": None, "torch_version": self.torch.__version__,
                "transformers_version": transformers.__version__,
                "settings": {"dtype": self.dtype, "device": self.device, "logprobs_mode": "processed",
                             "enable_prefix_caching": False, "generation_config": "ignored (neutral)",
                             "checkpoint_sampling_defaults": self.checkpoint_sampling}}

    def generate(self, requests: list[dict], full: bool, text: bool = True) -> list[dict]:
        # One `generate` call per request: transformers has no per-request seed inside a batch, and
        # per-request calls make a request's sample independent of its batch (as vLLM's seeds do).
        import numpy as np

        torch = self.torch
        results = []
        for r in requests:
            s = r["sampling"]
            ids = torch.tensor([r["prompt_token_ids"]], device=self.device)
            T, n = float(s["temperature"]), int(s.get("n", 1))
            if s.get("seed") is not None:
                torch.manual_seed(int(s["seed"]))
            # every sampling field explicit and neutral (top_k 0 is "off" in every transformers version; None is
            # filled from the model's defaults by some): nothing of the checkpoint's defaults can reach the sample
            kw = dict(do_sample=T > 0, max_new_tokens=int(s["max_tokens"]), num_return_sequences=n,
                      output_scores=True, return_dict_in_generate=True, pad_token_id=self.pad,
                      eos_token_id=None if s.get("ignore_eos") else self.eos,  # ignore_eos: as vLLM, keep going
                      repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0)  # past EOS, EOS still
            if T > 0:  # in the distribution (min_new_tokens would mask EOS and change the logprobs)
                kw.update(temperature=T, top_p=float(s.get("top_p", 1.0)), top_k=int(s.get("top_k", 0)))
            with torch.no_grad():
                # as keyword arguments over the neutral model config set at load: a standalone GenerationConfig
                # passed to generate() stops after one token in transformers 5.19 (measured: max_new_tokens=8 -> 1)
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1)  # [n, steps, V]
            samples = []
            for j in range(n):
                seq = out.sequences[j, ids.shape[1]:].tolist()
                eos = self.eos if isinstance(self.eos, list) else [self.eos]
                L = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
                if s.get("ignore_eos"):
                    L = len(seq)
                seq = seq[:L]
                dist = scores[j, :L].cpu().numpy().astype(np.float32)
                sample = {"token_ids": seq, "logprobs": dist[np.arange(L), seq].astype(np.float32),
                          "text": self.tokenizer.decode(seq, skip_special_tokens=True) if text else "",
                          "finish_reason": "stop" if L and seq[-1] in eos and not s.get("ignore_eos") else "length"}
                if full:
                    sample["full"] = dist
                samples.append(sample)
            results.append({"prompt_token_ids": list(r["prompt_token_ids"]), "samples": samples})
        return results

    def update_weights(self, path: str, reset: bool | None = None) -> dict:
        from safetensors.torch import load_file

        sd = load_file(path)
        missing, unexpected = self.model.load_state_dict(sd, strict=False)
        if unexpected:
            raise ValueError(f"unexpected tensors in weight update: {unexpected[:5]}")
        return {"tensors": len(sd), "prefix_cache_reset": False}

    def reset_prefix_cache(self) -> bool:
        return True  # no cache across requests

    def weights_checksum(self) -> float:
        return float(sum(p.detach().double().sum().item() for p in self.model.parameters()))

    def weights_checksums(self) -> list[float]:
        return [self.weights_checksum()]

    def stats(self) -> dict:
        return {"preemptions": None}  # no paged KV cache: nothing is ever preempted
