"""`rlwb bench`'s measurements, run end to end at small sizes with the real engines and peers.

No speed is asserted (speed claims are the bench's own output, measured side by side in one run). What is
checked is that each comparison runs and compares like with like: the baselines run under other interpreters
(the engine's venv, TRL's venv) where an import or API drift shows only when they run — the bench once shipped
a broken import that nothing caught.
"""

import pytest
import torch

from rlwb.bench import throughput as bench
from rlwb.bench import trl_vllm_peer
from rlwb.engines.presets import resolve_preset

pytestmark = pytest.mark.engines


def test_grpo_cost_profiles_rlwb_against_the_minimal_loop(default_model):
    res = bench.grpo_cost(default_model.path, steps=2)
    assert "grpo/minimal_error" not in res, res.get("grpo/minimal_error")
    assert res["grpo/rlwb_vs_minimal"] == pytest.approx(res["grpo/step_s"] / res["grpo/minimal_step_s"])
    # like for like: the minimal loop samples with the worker's threads and trains with the kernel's
    assert res["grpo/minimal_threads"] == {"engine_threads": 1, "trainer_threads": torch.get_num_threads()}
    for loop in ("grpo/", "grpo/minimal_"):  # the phases account for the whole step in both loops
        phases = [res[f"{loop}{ph}_s"] for ph in bench.GRPO_PHASES]
        assert all(p > 0 for p in phases)
        assert sum(phases) == pytest.approx(res[f"{loop}step_s"], rel=1e-6)
    for ph in bench.GRPO_PHASES:
        assert res[f"grpo/{ph}_vs_minimal"] == pytest.approx(res[f"grpo/{ph}_s"] / res[f"grpo/minimal_{ph}_s"])


def test_worker_overhead_baseline_runs_the_workers_engine_in_process(default_model):
    res = bench.worker_overhead(default_model.path, "vllm-v1-fixed", bs=4, max_tokens=8, repeats=2)
    assert "worker_overhead_error" not in res, res.get("worker_overhead_error")
    assert res["direct_generate_s"] > 0 and res["worker_generate_s"] > 0
    assert res["worker_overhead_ratio"] == pytest.approx(res["worker_generate_s"] / res["direct_generate_s"])


def test_trl_vllm_peer_records_the_stock_failure_and_runs_patched(default_model, tmp_path):
    """TRL's GRPOTrainer with vLLM colocate on the same vLLM build (`.venvs/trl-vllm`, part of `make setup`): the
    stock run's outcome is recorded with its reason, the patched run trains at notebook 03's step shape with the
    same engine settings in fp32 (its updates with the engine's threads: vLLM resets them at each generate), and the
    speedup pairs the two loops' steps."""
    res = bench.trl_vllm(default_model.path, steps=1, rlwb_step_s=None, sizes=[bench.GRPO_SHAPE["prompts_per_step"]])
    assert res.get("trl_vllm/reason") is None, res.get("trl_vllm/reason")
    if res["trl_vllm/stock"] != "runs":  # vLLM's CPU build: TRL's weight sync meets packed, loader-less params
        assert "weight_loader" in res["trl_vllm/stock"], res["trl_vllm/stock"]
        assert res["trl_vllm/stock_reason"] == trl_vllm_peer.STOCK_FAILURE
    assert res["trl_vllm/patches"] == trl_vllm_peer.PATCHES
    assert res["trl_vllm/engine_dtype"] == "float32" and res["trl_vllm/engine_kwargs"]["dtype"] == "float32"
    # colocated, TRL's updates run with the thread count vLLM's CPU worker sets at each generate (the preset's)
    assert res["trl_vllm/torch_threads"] == int(resolve_preset("vllm-v1-fixed").env["OMP_NUM_THREADS"])
    assert res["trl_vllm/torch_threads"] < torch.get_num_threads()
    n = bench.GRPO_SHAPE["prompts_per_step"] * bench.GRPO_SHAPE["group_size"]
    trl_s, rlwb_s = res[f"scaling/trl_vllm/n{n}/step_s"], res[f"scaling/rlwb/n{n}/step_s"]
    assert trl_s > 0 and rlwb_s > 0 and res["scaling/rlwb/n64/tok_s"] > 0
    assert res["speedup_vs_trl_vllm"] == pytest.approx(trl_s / rlwb_s)
    machine = {"cores": 2}
    assert bench._scaling_figure({**res, "machine": machine}, tmp_path / "scaling")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000
