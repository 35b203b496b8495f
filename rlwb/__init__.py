"""rlwb: audit LLM inference engines used as RL rollout generators.

Layers (each only imports the ones above it):
- `rlwb.core`: what experiments are made of (task, tokenizer, models, trainer, losses, metrics, stats,
  rollouts, the GRPO loop, mismatch breaker, equivalence validator, GPU memory plan). `rlwb.engines`: engine
  workers, each in its own process and interpreter (the kernel never imports vLLM).
- `rlwb.experiments`: one module per notebook, all with `run(params, model_path, *, on_start, progress)
  -> Result`.
- infrastructure: `params` (schemas, validation, generated cells), `archive`, `runner`, `reports`, `plots`,
  `formatting`, `notebook` (what a notebook calls first), `cli`; `errors` holds every error type.
"""

__version__ = "0.1.0"
