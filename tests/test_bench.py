"""`rlwb bench`'s measurements, run end to end at small sizes with the real engines and peers.

No speed is asserted (speed claims are the bench's own output, measured side by side in one run), and no ratio
is recomputed here. What is checked is that each comparison compares like with like, by what the loops did: the
same rollouts from the same seeds, the thread counts measured inside each phase, the correction each side ran,
phase splits that add up. The baselines run under other interpreters (the engine's venv, TRL's venv), where an
import or API drift shows only when they run — the bench once shipped a broken import that nothing caught.
"""

import json
import statistics

import pytest
import torch

from rlwb.bench import throughput as bench
from rlwb.bench import trl_vllm_peer
from rlwb.engines.presets import resolve_preset
from rlwb.experiments.wording import bench as bench_wording
from rlwb.plots import bench as bench_plots


def test_median_step_adds_up_where_phase_medians_do_not():
    """Five steps whose slow phase moves from step to step: the medians taken phase by phase (3 + 2 + 0.5) are no
    step's split and fall 1 s short of the median step (6.5); the median step's own split adds up to it."""
    phases = {"rollout": [1.0, 2.0, 3.0, 4.0, 5.0], "update": [5.0, 1.0, 1.0, 2.0, 3.0], "sync": [0.5] * 5}
    totals = [sum(v[i] for v in phases.values()) for i in range(5)]  # 6.5, 3.5, 4.5, 6.5, 8.5
    split = bench.median_step(phases)
    assert split["step"] == statistics.median(totals) == 6.5
    assert (split["rollout"], split["update"], split["sync"]) == (1.0, 5.0, 0.5)  # step 0's own phases
    assert sum(statistics.median(v) for v in phases.values()) == 5.5  # what per-phase medians gave
    even = bench.median_step({k: v[:4] for k, v in phases.items()})  # the two middle steps (4.5, 6.5), averaged
    assert even["step"] == statistics.median(totals[:4]) == 5.5
    assert sum(even[k] for k in phases) == pytest.approx(even["step"])
    with pytest.raises(ValueError, match="one time per step"):
        bench.median_step({"rollout": [1.0], "update": []})


def test_rlwb_figures_redraws_the_bench_run_of_record_from_its_bench_json(tmp_path):
    """`rlwb figures` (`regenerate_figures`) on a copy of the shipped bench run of record redraws its figures from
    bench.json alone (`rlwb.plots.bench`): the same figures, each pixel-close to the shipped PNG (same size, mean
    |difference| below 1% of full scale) and naming the run."""
    import shutil

    import numpy as np
    from PIL import Image

    from rlwb.paths import REPO_ROOT
    from rlwb.plots import figure_source
    from rlwb.reports.figures import regenerate_figures

    (run,) = sorted((REPO_ROOT / "docs" / "runs" / "bench").iterdir())[-1:]
    copy = tmp_path / "bench" / run.name
    shutil.copytree(run, copy)
    for png in copy.glob("figures/*"):
        png.unlink()
    written = regenerate_figures(copy, formats=("png",))
    assert sorted(p.name for p in written) == sorted(p.name for p in (run / "figures").glob("*.png"))
    assert {p.stem for p in written} == set(bench_plots.FIGURES)  # the run of record measured both
    for png in written:
        shipped = np.asarray(Image.open(run / "figures" / png.name).convert("RGB"), dtype=float)
        redrawn = np.asarray(Image.open(png).convert("RGB"), dtype=float)
        assert shipped.shape == redrawn.shape, png.name
        assert np.abs(shipped - redrawn).mean() < 0.01 * 255, png.name
        assert figure_source(png) == f"bench/{run.name}"


def test_a_bench_without_a_measurement_draws_no_empty_figure():
    """Only the tokens/s of `hf` at two batch sizes: the throughput figure with one bar per batch size, no scaling
    figure; nothing measured: no figure at all."""
    res = {"settings": {"batch_sizes": [1, 2]}, "machine": {"cores": 2}, "tput/hf/bs1": 10.0, "tput/hf/bs2": 19.0,
           "tput/vllm-v0/bs1": 5.0}  # vllm-v0 at one batch size only: not a measured preset
    assert bench_plots.measured_presets(res) == ["hf"]
    figs = dict(bench_plots.draw(res))
    assert list(figs) == ["throughput"] and len(figs["throughput"].axes[0].patches) == 2
    assert list(bench_plots.draw({**{k: v for k, v in res.items() if not k.startswith("tput/")}})) == []


def test_a_bench_names_its_cpu_with_the_instruction_set():
    """One model name covers AVX-512 and AVX2-only CPUs (their kernels and engines differ): the one-line answer and
    bench.md name the CPU as the run record has it, "AMD EPYC, AVX2"; a record from before the isa was kept names
    the model alone."""
    res = {"settings": {"batch_sizes": [1], "max_tokens": 8, "repeats": 1}, "started_at": "2026-11-29T11:00",
           "machine": {"cpu": "AMD EPYC", "isa": "avx2", "cores": 2, "gpu": None}, "tput/hf/bs1": 10.0}
    assert bench_wording.answer(res, ["hf"]).endswith("(AMD EPYC, AVX2, 2 cores)")
    assert "on AMD EPYC, AVX2 (2 cores)" in bench_wording.markdown(res, ["hf"], [])
    old = {**res, "machine": {"cpu": "AMD EPYC", "cores": 2}}
    assert bench_wording.answer(old, ["hf"]).endswith("(AMD EPYC, 2 cores)")
    assert "on AMD EPYC (2 cores)" in bench_wording.markdown(old, ["hf"], [])


@pytest.mark.engines
def test_grpo_cost_profiles_rlwb_against_the_minimal_loop(default_model):
    """Five timed steps (plus the warm-up), so a median is not a mean. Like for like: both loops sample the same
    rollouts and make the same updates (same engine spec, problems, seeds, starting weights and arithmetic: the
    same batch rewards at every step), the minimal loop measured one thread while sampling and the kernel's
    while updating (what rlwb's layout gives its engine and its trainer), and each loop's phases add up to its
    step."""
    res = bench.grpo_cost(default_model.path, steps=5)
    assert "grpo/minimal_error" not in res, res.get("grpo/minimal_error")
    ours, theirs = res["grpo/reward_mean"], res["grpo/minimal_reward_mean"]
    assert len(ours) == 6 and ours == theirs
    assert res["grpo/minimal_threads"]["measured_threads"] == {"rollout": [1], "update": [torch.get_num_threads()]}
    for loop in ("grpo/", "grpo/minimal_"):
        phases = [res[f"{loop}{ph}_s"] for ph in bench.GRPO_PHASES]
        assert all(p > 0 for p in phases)
        assert sum(phases) == pytest.approx(res[f"{loop}step_s"], rel=1e-9)


@pytest.mark.engines
def test_worker_overhead_baseline_runs_the_workers_engine_in_process(default_model):
    """The in-process baseline and the worker sampled the same tokens from the same seeded requests: the same
    engine on the same work, so their time ratio is the protocol's cost."""
    res = bench.worker_overhead(default_model.path, "vllm-v1-fixed", bs=4, max_tokens=8, repeats=2)
    assert "worker_overhead_error" not in res, res.get("worker_overhead_error")
    assert res["worker_overhead/same_tokens"] is True
    assert res["direct_generate_s"] > 0 and res["worker_generate_s"] > 0


@pytest.mark.engines
def test_trl_vllm_peer_runs_the_same_algorithm_as_rlwb(default_model, tmp_path):
    """TRL's GRPOTrainer with vLLM colocate on the same vLLM build (`.venvs/trl-vllm`, part of `make setup`): the
    stock run's outcome is recorded with its reason; the patched runs train at notebook 03's step shape with the
    same engine settings in fp32. With TRL's default correction its `sequence_mask` ratio was computed (logged)
    and rlwb weighed its tokens by `trl.sequence_mask` (weights off 1 at the float floor); without it neither did.
    TRL's updates ran with the trainer's threads (patch 3), and once with the one vLLM's CPU worker leaves."""
    n = bench.GRPO_SHAPE["prompts_per_step"] * bench.GRPO_SHAPE["group_size"]
    res = bench.trl_vllm(default_model.path, steps=1, sizes=[bench.GRPO_SHAPE["prompts_per_step"]])
    assert res.get("trl_vllm/reason") is None, res.get("trl_vllm/reason")
    if res["trl_vllm/stock"] != "runs":  # vLLM's CPU build: TRL's weight sync meets packed, loader-less params
        assert "weight_loader" in res["trl_vllm/stock"], res["trl_vllm/stock"]
        assert res["trl_vllm/stock_reason"] == trl_vllm_peer.STOCK_FAILURE
    assert res["trl_vllm/patches"] == [*trl_vllm_peer.PATCHES, trl_vllm_peer.THREADS_PATCH]
    assert res["trl_vllm/engine_dtype"] == "float32" and res["trl_vllm/engine_kwargs"]["dtype"] == "float32"
    # the correction arm: TRL's default mode, the one the rlwb arm's catalogue entry reproduces
    assert res[f"scaling/trl_vllm/n{n}/correction_mode"] == "sequence_mask"
    assert bench.TRL_ARMS["correction"]["correction"] == "trl.sequence_mask"
    assert res[f"scaling/trl_vllm/n{n}/is_ratio_logged"] is True
    assert 0 < abs(res[f"scaling/rlwb/n{n}/is_weight_mean"] - 1) < 1e-3
    # the arm without: no ratio on either side
    assert res["trl_vllm/no_correction/trl/correction_mode"] is None
    assert res["trl_vllm/no_correction/trl/is_ratio_logged"] is False
    assert res["trl_vllm/no_correction/rlwb/is_weight_mean"] == 1.0
    # threads measured inside TRL's loss: the trainer's with patch 3, the engine preset's without it
    assert res["trl_vllm/torch_threads"] == [torch.get_num_threads()]
    assert res["trl_vllm/vllm_threads/torch_threads"] == [int(resolve_preset("vllm-v1-fixed").env["OMP_NUM_THREADS"])]
    for key in (f"scaling/trl_vllm/n{n}", f"scaling/rlwb/n{n}", "trl_vllm/no_correction/trl",
                "trl_vllm/no_correction/rlwb"):
        assert res[f"{key}/step_s"] > 0 and res[f"{key}/tok_s"] > 0, key
    fig = bench_plots.scaling({**res, "machine": {"cores": 2}})
    assert fig is not None
    fig.savefig(tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


@pytest.mark.engines
def test_a_bench_run_records_a_notebook_runs_provenance(bench_run, default_model):
    """A bench run (`run()` around a real, small measurement: tests/conftest.py `bench_run`) is archived as a notebook
    run is: under `bench/<UTC start>`, with the same run.json fields (`archive.start_record`), the engine it measured
    with, the model build's card with its published-checksum verdict, `ok` once finished; its numbers in bench.json
    as measured, its table and its figure (naming the run). `rlwb runs` lists it; `rlwb times` (the notebooks'
    wall time) does not."""
    from rlwb import archive
    from rlwb.plots import figure_source
    from rlwb.reports.times import time_table
    from tests.conftest import BENCH_SIZES

    run_dir, measured = bench_run
    assert run_dir.parent.name == archive.BENCH and not list(run_dir.parent.glob(".tmp*"))
    info = json.loads((run_dir / "run.json").read_text())
    assert set(archive.start_record("x", "y")) <= set(info)  # every field a notebook run has
    assert info["status"] == "ok" and info["error"] is None
    assert info["notebook"] == archive.BENCH and info["run_id"] == run_dir.name
    assert info["started_at"] <= info["finished_at"] and info["duration_s"] > 0
    here = archive.git_info()
    assert info["git_commit"] == here["git_commit"] and isinstance(info["git_dirty"], bool)
    assert info["host"] == archive.host_info() and info["packages"]["torch"] == torch.__version__
    assert set(info["engines"]) == {"hf"} and info["engines"]["hf"]["transformers_version"]
    card = info["model"]["card"]
    assert info["model"]["weights_sha256_16"] == card["weights_sha256_16"] == default_model.card["weights_sha256_16"]
    assert card["weights_match_published"] is True  # what `rlwb publish` checks
    res = json.loads((run_dir / "bench.json").read_text())
    assert {k: res[k] for k in measured} == measured and all(v > 0 for v in measured.values())
    assert res["settings"] == {**bench.settings(quick=True), **BENCH_SIZES}
    assert res["model"]["weights_sha256_16"] == card["weights_sha256_16"] and res["machine"] == info["host"]
    table = (run_dir / "bench.md").read_text()
    assert f"| `hf` | {measured['tput/hf/bs1']:.0f} | {measured['tput/hf/bs2']:.0f} |" in table
    assert "hf samples" in info["answer"] and info["question"] == bench.QUESTION
    assert figure_source(run_dir / "figures" / "throughput.png") == f"bench/{run_dir.name}"
    assert not (run_dir / "figures" / "scaling.png").exists()  # no scaling measured: no empty figure
    runs = archive.list_runs(run_dir.parent.parent)
    assert [(r["notebook"], r["run_id"]) for r in runs] == [("bench", run_dir.name)]
    assert time_table(runs) == []


def test_a_bench_that_fails_is_archived_as_failed(tmp_path, default_model):
    """A measurement that raises: the run is still archived, with `status: failed`, the error and its traceback, and
    no bench.json (nothing to quote); `RunFailed` names it, and `rlwb publish` refuses it even from a clean tree."""
    from rlwb import archive, publish
    from rlwb.errors import RunFailed

    def broken(model_path, cfg, run, progress):
        raise RuntimeError("the engine died")

    with pytest.raises(RunFailed, match="RuntimeError: the engine died") as e:
        bench.run(tmp_path, progress=False, measure=broken)
    run_dir = e.value.run_dir
    assert run_dir.parent == tmp_path / archive.BENCH and run_dir.is_dir()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["error"] == "RuntimeError: the engine died" and info["finished_at"]
    assert info["model"]["card"]["weights_sha256_16"]  # recorded before the measurement
    assert not (run_dir / "bench.json").exists() and "the engine died" in (run_dir / "logs/traceback.txt").read_text()
    info["git_dirty"] = False  # refused for having failed, whatever the tree
    (run_dir / "run.json").write_text(json.dumps(info))
    with pytest.raises(publish.PublishRefused, match=r"did not finish \(status 'failed': RuntimeError: the engine"):
        publish.publish(run_dir, tmp_path / "runs")
