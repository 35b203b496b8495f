"""A second trainer scorer behind rlwb's external-scorer contract: bf16 weights, eager attention, no batching.

What it is for: the example of the contract a team adapts to its own trainer (docs/results/10_audit.md;
the contract is `rlwb/core/scoring/external.py`), and a real second scorer whose numerics differ from rlwb's fp32
SDPA scorer, so `rlwb audit --trainer "python scripts/score_bf16_eager.py"` shows the gap a bf16 trainer has.

    python scripts/score_bf16_eager.py --model DIR --input IN.parquet --output OUT.parquet

It runs the whole forward pass over prompt + completion (no chunking, no padding: its own path, not rlwb's),
takes the logits of the completion positions, applies the row's temperature, top-k and top-p the way the engine
sampled (rlwb's `process_logits`, vLLM's order) and writes each sampled token's logprob.
"""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM

from rlwb.core.scoring.trainer import process_logits


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--attn", default="eager", help="transformers attn_implementation (eager, sdpa, ...)")
    a = ap.parse_args(argv)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype),
                                                 attn_implementation=a.attn).eval()
    rows = pq.read_table(a.input).to_pylist()
    out = []
    with torch.no_grad():
        for r in rows:
            prompt, completion = r["prompt_token_ids"], r["completion_token_ids"]
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()  # position s predicts token s + 1
            lp = process_logits(logits, r["temperature"], r["top_k"], r["top_p"]).log_softmax(-1)
            out.append(lp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).numpy().astype(np.float64)
                       .tolist())
    pq.write_table(pa.table({"logprobs": pa.array(out, pa.list_(pa.float64()))}), a.output)


if __name__ == "__main__":
    main()
