"""Is the float64 reference's batch dependence transformers' fp32 norm? (a check, not a test; docs/gpu.md)

Notebook 09's `fp64` row on an H100 put float64 in batches 2.0e-07 from float64 one sequence at a time. The suspect:
`Qwen2RMSNorm` computes in fp32 whatever the model's dtype, so a batched kernel's last-bit float64 difference can
flip one of its fp32 roundings. This scores the same sequences at Qwen2.5-0.5B's shapes (random weights, float64) in
one padded batch and one at a time, with transformers' norm and with the norm kept in float64, and prints the
largest logprob difference and the share of sequences bitwise equal for each. If the norm is the cause, the float64
norm's difference falls to float64's rounding (~1e-13 or below). It also prints how far the reference (one sequence
at a time, transformers' norm) lies from the same forward with the norm in float64: the reference's own accuracy.

    python scripts/f64_norm_check.py            # on a GPU (Qwen2.5-0.5B's config: ~4 GB of float64 weights)
    python scripts/f64_norm_check.py --tiny     # a 2-layer model, anywhere (checks the script, not the claim)
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2 import modeling_qwen2

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)
TINY = dict(QWEN25_05B, vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)


def float64_norm(self, h):
    """Qwen2RMSNorm's arithmetic with the input's dtype kept (transformers casts to fp32)."""
    return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def token_logprobs(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits.double()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


def compare(model, seqs: list[torch.Tensor], device) -> dict:
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):  # right padding, as rlwb's scorer pads
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    with torch.no_grad():
        batched = token_logprobs(model, ids, mask)
        diffs, equal, alones = [], 0, []
        for i, s in enumerate(seqs):
            alone = token_logprobs(model, s[None].to(device), torch.ones(1, len(s), dtype=torch.long, device=device))[0]
            d = (batched[i, :len(s) - 1] - alone).abs().max().item()
            diffs.append(d)
            equal += d == 0
            alones.append(alone)
    return {"max_abs_dlogp": max(diffs), "bitwise_equal_frac": equal / len(seqs)}, alones


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--sequences", type=int, default=32)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    cfg = Qwen2Config(**(TINY if args.tiny else QWEN25_05B), attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).to(device=device, dtype=torch.float64).eval()
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, cfg.vocab_size, (int(n),), generator=g)
            for n in torch.randint(60, 121, (args.sequences,), generator=g)]
    out = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "sequences": len(seqs)}
    out["transformers_norm_fp32"], reference = compare(model, seqs, device)
    modeling_qwen2.Qwen2RMSNorm.forward = float64_norm
    out["norm_in_float64"], exact = compare(model, seqs, device)
    out["reference_vs_norm_in_float64_max_abs_dlogp"] = max((a - b).abs().max().item()
                                                            for a, b in zip(reference, exact))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
