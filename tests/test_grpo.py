"""The GRPO loop against a real engine: weights really change inside the engine, in flight."""

import numpy as np
import pytest
import torch

from rlwb import grpo, losses
from rlwb.trainer import completion_logprobs, make_batch

pytestmark = pytest.mark.engines


def test_grpo_steps_update_the_running_engine(engine, default_model):
    from transformers import AutoModelForCausalLM

    w = engine("vllm-v1-fixed")
    pid = w.pid
    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    before = w.weights_checksum()
    cfg = grpo.GRPOConfig(steps=2, prompts_per_step=4, group_size=4, lr=1e-3, max_tokens=16)
    try:
        curves = grpo.train(model, w, cfg, initial, progress=False)
        assert list(curves["step"]) == [0, 1]
        assert w.pid == pid, "no restart"
        assert w.weights_checksum() != pytest.approx(before, rel=1e-12)
        # the engine now samples from the trainer's new weights: processed logprobs match them
        res = grpo.grpo_step(2, model, torch.optim.SGD(model.parameters(), lr=0.0), w, cfg)
        assert res.row["abs_dlogp_mean"] < 1e-5
    finally:
        w.update_weights(initial)


def test_one_step_moves_logprobs_along_the_advantages(engine, default_model):
    from transformers import AutoModelForCausalLM

    w = engine("vllm-v1-fixed")
    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = grpo.GRPOConfig(prompts_per_step=8, group_size=8, lr=1e-4, seed=1)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        res = grpo.grpo_step(0, model, opt, w, cfg)
        b = res.batch
        lens = [len(t) for t in b["token_ids"]]
        with torch.no_grad():
            new = completion_logprobs(model, make_batch(b["prompt_token_ids"], b["token_ids"]), cfg.temperature)["logp"]
        d_seq = np.array([x.sum().item() for x in new.split(lens)]) - np.array([x.sum() for x in b["logp_trainer"]])
        adv = losses.group_advantages(torch.tensor(b["reward"]), cfg.group_size).numpy()
        assert (adv != 0).any(), "this seed's batch must carry a learning signal"
        assert float((adv * d_seq).sum()) > 0
    finally:
        w.update_weights(initial)
