"""The toy GRPO loop on a real engine (`grpo`, its settings `grpo_config`), its loss (`losses`), the off-policy
corrections (`corrections`, named per peer in `correction_catalog`), the circuit breaker that stops a run
when mismatch appears (`mismatch_breaker`) and mismatch injected at known doses (`mismatch_doses`)."""
