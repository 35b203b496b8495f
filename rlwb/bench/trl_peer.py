"""TRL's `GRPOTrainer` on rlwb's toy task: the peer a user would pick instead of rlwb.

Used in two places, so it lives here once:
- the loss cross-check (`tests/test_trl_peer.py`): TRL's own `_compute_loss` on a fixed batch against
  `rlwb.core.rl.losses.grpo_loss` + `rlwb.core.scoring.trainer.completion_logprobs` (value and gradient);
- `rlwb bench`: seconds per GRPO step with TRL (its built-in transformers generation on CPU) against
  rlwb's step with a vLLM worker, same model, prompts, group size and completion length.

Mapping: rlwb aggregates the clipped surrogate as a mean over all completion tokens of the batch, which is
TRL's `loss_type="bnpo"`; `beta=0` (no reference model), `epsilon` = rlwb's `clip_eps`, and TRL divides
the logits by `temperature` as rlwb's trainer does. TRL 1.16 tokenizes plain-text prompts with the tokenizer's
defaults, which put BOS first, so the dataset holds the bare task prompt and TRL's prompt ids equal rlwb's
(`tests/test_trl_peer.py` checks it through TRL's own `_tokenize_prompts`). An earlier version also wrote
`<bos>` into the text: TRL then sampled after a doubled BOS, and its rollouts scored ~0.2 instead of ~0.6.
https://huggingface.co/docs/trl/grpo_trainer
"""

from __future__ import annotations

from pathlib import Path

from rlwb.core.data import tasks


def _reward(prompts: list[str], completions: list[str], **_) -> list[float]:
    return [tasks.reward(tasks.parse_prompt(p), c) for p, c in zip(prompts, completions)]


def make_trainer(model, model_path: str | Path, out_dir: str | Path, *, steps: int = 1, prompts_per_step: int = 8,
                 group_size: int = 8, max_tokens: int = 32, lr: float = 1.5e-4, temperature: float = 0.7,
                 clip_eps: float = 0.2, seed: int = 0, max_digits: int = 3, **extra_args):
    """A CPU `GRPOTrainer` for `steps` steps of `prompts_per_step` x `group_size` rollouts on the toy task: step s
    trains on the problems rlwb's GRPO step s of a seed-`seed` run draws, in order (`step_problem_seed`, no
    shuffling), so the loops compared sample from the same prompts. `extra_args` go to `GRPOConfig` (the vLLM
    peer's `use_vllm=True, vllm_mode="colocate"`, ...)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlwb.core.rl.grpo_config import step_problem_seed

    tok = AutoTokenizer.from_pretrained(str(model_path))
    problems = [p for s in range(steps) for p in tasks.make_problems(prompts_per_step, seed=step_problem_seed(seed, s),
                                                                     max_digits=max_digits)]
    data = Dataset.from_list([{"prompt": p.prompt} for p in problems])
    args = GRPOConfig(output_dir=str(out_dir), per_device_train_batch_size=prompts_per_step * group_size,
                      num_generations=group_size, max_completion_length=max_tokens, learning_rate=lr,
                      temperature=temperature, epsilon=clip_eps, beta=0.0, loss_type="bnpo", max_steps=steps,
                      use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, seed=seed, bf16=False,
                      disable_tqdm=True, max_grad_norm=1.0, weight_decay=0.0, adam_beta2=0.99, shuffle_dataset=False,
                      **extra_args)
    trainer = GRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=data, processing_class=tok)
    trainer.remove_callback(PrinterCallback)  # its per-step dicts would fill `rlwb bench`'s terminal
    return trainer


def version() -> str:
    import trl

    return trl.__version__
