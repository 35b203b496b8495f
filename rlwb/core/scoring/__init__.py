"""The trainer's side: `trainer` recomputes each sampled token's logprob as the sampler defined it,
`trainer_choices` are the trainer's own settings (dtype, padding, batching, ...), `rollouts` samples with an
engine and scores with the trainer, `external` scores with a team's own trainer command, `equivalence` checks an
engine against the trainer on random cases."""
