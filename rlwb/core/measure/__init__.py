"""Pure numerics on per-token logprobs and rewards: `metrics` (mismatch estimators), `stats` (intervals and
tests), `framework_metrics` (the same mismatch under each RL framework's names and thresholds)."""
