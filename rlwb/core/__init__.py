"""What experiments are made of, by domain (each subpackage's docstring says what it holds; docs/architecture.md
says what each may import): `data` (the toy task and its tokenizer), `models` (the embedded models and their
builds), `prompts` (what engines are measured on), `scoring` (the trainer's side), `measure` (estimators and
intervals), `rl` (the GRPO loop, its corrections and doses); `checked_fields` declares every setting."""
