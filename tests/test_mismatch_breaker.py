"""MismatchBreaker: the circuit breaker on engine/trainer mismatch, on hand-made rows and in the real GRPO loop."""

import numpy as np
import pandas as pd
import pytest

from rlwb.core.rl.mismatch_breaker import MismatchBreaker, MismatchBreakerTripped


def rows(values):
    return [{"step": i, "mismatch_k3": v, "abs_dlogp_mean": v} for i, v in enumerate(values)]


def test_quiet_below_threshold_and_a_single_spike_does_not_trip():
    m = MismatchBreaker(threshold=1e-3, window=3, patience=2)
    for r in rows([1e-6] * 5 + [5e-3] + [1e-6] * 6):  # one spike: one window (steps 3-5) above, then below
        assert m.update(r) is False
    assert not m.tripped


def test_sustained_mismatch_trips_after_patience_windows_and_saves_the_batch(tmp_path):
    m = MismatchBreaker(threshold=1e-3, window=2, patience=2, save_dir=tmp_path, name="vllm-v1+none")
    batch = {"token_ids": [[5, 6], [7]], "logp_engine": [np.array([-0.1, -0.2]), np.array([-0.3])],
             "logp_trainer": [np.array([-0.1, -0.25]), np.array([-0.3])], "reward": np.array([1.0, 0.0])}
    seq = rows([1e-6, 1e-6, 2e-3, 2e-3, 2e-3, 2e-3])
    for r in seq[:5]:  # windows (0, 1) below, (2, 3) above once; step 4 opens the next window
        assert m.update(r, batch) is False
    with pytest.raises(MismatchBreakerTripped) as e:
        m.update(seq[5], batch)  # window (4, 5): the 2nd in a row above -> trip
    assert m.tripped and m.trip_step == 5 and e.value.step == 5
    saved = pd.read_parquet(e.value.saved)
    assert len(saved) == 2 and list(saved["token_ids"][0]) == [5, 6] and saved["reward"].tolist() == [1.0, 0.0]


def test_signal_mode_and_bad_input():
    m = MismatchBreaker(threshold=1e-3, window=1, patience=1, raise_on_trip=False)
    assert m.update(rows([5e-3])[0]) is True and m.tripped
    for kw in ({"threshold": 0}, {"threshold": float("nan")}, {"threshold": 1, "window": 0},
               {"threshold": 1, "metric": "reward"}):
        with pytest.raises(ValueError):
            MismatchBreaker(**kw)
    with pytest.raises(ValueError, match="broken measurement"):
        MismatchBreaker(threshold=1).update({"step": 0, "mismatch_k3": float("nan")})


def test_watches_a_correction_health_column_ess_trips_when_it_falls():
    ess = [{"step": i, "ess": v} for i, v in enumerate([0.9, 0.8, 0.2, 0.25, 0.1, 0.2])]
    m = MismatchBreaker(threshold=0.3, window=2, patience=2, metric="ess", raise_on_trip=False)
    assert [m.update(r) for r in ess] == [False, False, False, False, False, True] and m.trip_step == 5
    masked = MismatchBreaker(threshold=0.3, window=1, patience=1, metric="masked_frac", raise_on_trip=False)
    assert masked.update({"step": 0, "masked_frac": 0.1}) is False
    assert masked.update({"step": 1, "masked_frac": 0.5}) is True


@pytest.mark.engines
def test_trips_on_vllm_v1_at_t07_and_stays_quiet_on_vllm_v1_fixed(engine, default_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.core.rl import grpo

    model = AutoModelForCausalLM.from_pretrained(str(default_model.path), dtype=torch.float32)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = grpo.GRPOConfig(steps=5, prompts_per_step=4, group_size=4, temperature=0.7)
    quiet = MismatchBreaker(threshold=1e-5, window=2, patience=2)
    df = grpo.train(model, engine("vllm-v1-fixed"), cfg, initial, monitor=quiet, progress=False)
    assert len(df) == 5 and not quiet.tripped
    loud = MismatchBreaker(threshold=1e-5, window=2, patience=2, save_dir=tmp_path)
    with pytest.raises(MismatchBreakerTripped) as e:
        grpo.train(model, engine("vllm-v1"), cfg, initial, monitor=loud, progress=False)
    assert e.value.step == 3 and e.value.value > 1e-5  # windows (0, 1) and (2, 3) both above
    assert len(pd.read_parquet(e.value.saved)) == 16
