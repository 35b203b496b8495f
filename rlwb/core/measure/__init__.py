"""Pure numerics on per-token logprobs and rewards: `metrics` (mismatch estimators), `stats` (intervals and
tests), `framework_metrics` (the same mismatch under each RL framework's names and thresholds), `dose_response`
(notebook 08's trend and first benchmark dose), `benchmark_dose` (the benchmark dose by EPA's and EFSA's
conventions, checked against EPA's own engine run by `_bmds_worker` in `.venvs/bmds`)."""
