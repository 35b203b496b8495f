"""Notebooks 03 and 07 resume as 08 does: their grid (`grpo_grid.train_grid`) keeps each run in the run's job store
(`archive.Run.jobs()`) the moment it finishes, and a run that resumes an interrupted one takes its finished runs
over instead of training them, starting no engine whose runs are all taken. Real engines at smoke size: the run
interrupted, then resumed, gives the uninterrupted run's curves and metrics bar wall time."""

import json
from pathlib import Path

import pandas as pd
import pytest

from rlwb import archive
from rlwb import params as params_mod
from rlwb.experiments import grpo_grid, toy_grpo, which_correction
from rlwb.formatting import KL_FLOOR

# metrics of wall time, which no two runs share (two runs of one commit differ there too)
TIMING = ("/step_s_mean", "/step_s_median", "/correction_ms_mean")


def run_dir(root, name: str, card: dict, **rec):
    d = root / name
    (d / "data").mkdir(parents=True)
    archive.write_record(d, {"status": "failed", "run_id": name, "model": {"weights_sha256_16":
                                                                          card.get("weights_sha256_16")}, **rec})
    return d


def interrupted_then_resumed(tmp_path, monkeypatch, default_model, experiment, p, cut_after: int):
    """The run whole, the run interrupted as its run number `cut_after` + 1 starts training (as a Ctrl-C would),
    and a run resuming that one: (whole, resumed, runs trained by the resume, engines the resume recorded)."""
    card = json.loads((Path(default_model.path) / "model.json").read_text())
    dirs = {n: run_dir(tmp_path, n, card) for n in ("whole", "cut", "resumed")}
    real, trained = grpo_grid.train, []

    def counting(*a, **k):
        trained.append(a[2])
        return real(*a, **k)

    monkeypatch.setattr(grpo_grid, "train", counting)
    whole = experiment.run(p, default_model.path, progress=False, store=archive.Run(dirs["whole"]).jobs())
    n = len(trained)

    def cut(*a, **k):
        if len(trained) == n + cut_after:
            raise KeyboardInterrupt
        return counting(*a, **k)

    monkeypatch.setattr(grpo_grid, "train", cut)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(p, default_model.path, progress=False, store=archive.Run(dirs["cut"]).jobs())
    assert archive.kept_jobs(dirs["cut"]) == cut_after
    archive.update_record(dirs["cut"], engines={e: {"preset": e, "vllm_version": "x"} for e in p.engines})
    monkeypatch.setattr(grpo_grid, "train", counting)
    del trained[:]
    archive.update_record(dirs["resumed"], resume={"from": str(dirs["cut"])})
    run = archive.Run(dirs["resumed"])
    started = []
    resumed = experiment.run(p, default_model.path, progress=False, store=run.jobs(), on_start=started.append)
    assert len(trained) == n - cut_after
    info = run.record["resume"]
    assert info["reused_jobs"] == cut_after and info["jobs"] == n
    assert {k: v["jobs"] for k, v in info["parts"].items()} == {"cut": cut_after, "resumed": n - cut_after}
    return whole, resumed, started


def same_result(whole, resumed) -> None:
    wall = [c for c in whole.curves if c.startswith("t_")]
    assert wall
    pd.testing.assert_frame_equal(resumed.curves.drop(columns=wall), whole.curves.drop(columns=wall))
    keep = [k for k in whole.metrics if not k.endswith(TIMING)]
    assert keep and resumed.metrics.keys() == whole.metrics.keys()
    assert all(resumed.metrics[k] == whole.metrics[k] or (pd.isna(whole.metrics[k]) and pd.isna(resumed.metrics[k]))
               for k in keep)


@pytest.mark.slow
@pytest.mark.engines  # `pytest -m engines` runs the check of skip_at_floor below (tests/README.md)
def test_notebook_03_resumes_run_by_run(default_model, tmp_path, monkeypatch):
    """03 with `skip_at_floor`: the fp32 engine's `none` run (at the float floor: nothing else runs there) and V1's
    `none` run finish, V1's correction is interrupted; the resume trains only that run, on V1 alone (the fp32
    engine's one run is taken over, so it does not start: its record comes from the run resumed), and decides the
    skip from the taken curves as the whole run did from its own. Catches a resume that retrains a kept run, starts
    an engine it does not need, loses the skip decision, or reorders the curves. The whole run is also the check of
    `skip_at_floor` itself: the fp32 engine's `none` runs measured k3 at the float floor on every step, so it runs
    `none` alone and the conclusion says so with the measured k3; V1's raw logprobs at T = 0.7 measured a mismatch,
    so it races the corrections (the decision made from the runs, before the corrections)."""
    p = params_mod.load("03_toy_grpo", ["params/03_toy_grpo/smoke.yaml"],
                        {"engines": ["vllm-v1-fixed", "vllm-v1"], "num_seeds": 1, "steps": 2,
                         "corrections": ["none", "verl.geo_rs"], "skip_at_floor": True, "drift_threshold": 0.0,
                         "concurrent_runs": 1})
    whole, resumed, started = interrupted_then_resumed(tmp_path, monkeypatch, default_model, toy_grpo, p, 2)
    ran = whole.curves.groupby("engine")["correction"].unique().map(set).to_dict()
    assert ran == {"vllm-v1-fixed": {"none"}, "vllm-v1": {"none", "verl.geo_rs"}}
    assert whole.metrics["vllm-v1-fixed/skipped_at_floor"] == 1.0 and whole.metrics["vllm-v1/skipped_at_floor"] == 0.0
    k3 = {e: whole.metrics[f"{e}+none/mismatch_k3_max"] for e in ("vllm-v1-fixed", "vllm-v1")}
    assert k3["vllm-v1-fixed"] <= KL_FLOOR < k3["vllm-v1"]
    text = whole.conclusion()
    assert "Not run on `vllm-v1-fixed` (largest per-step k3" in text and "`vllm-v1` (" not in text.split("Not run")[1]
    assert [(i["preset"], i.get("from_run")) for i in started] == [("vllm-v1-fixed", "cut"), ("vllm-v1", None)]
    assert list(zip(whole.curves["engine"], whole.curves["correction"])) == [
        ("vllm-v1-fixed", "none")] * 2 + [("vllm-v1", "none")] * 2 + [("vllm-v1", "verl.geo_rs")] * 2
    same_result(whole, resumed)


@pytest.mark.slow
def test_notebook_07_resumes_run_by_run(default_model, tmp_path, monkeypatch):
    """07: the baseline level's `none` runs and the bf16 level's `none` runs finish, its correction is interrupted;
    the resume trains only that correction's runs and gives the whole race's ranking and metrics."""
    p = params_mod.load("07_which_correction", ["params/07_which_correction/smoke.yaml"],
                        {"steps": 2, "corrections": ["none", "verl.geo_rs"], "concurrent_runs": 1})
    whole, resumed, started = interrupted_then_resumed(tmp_path, monkeypatch, default_model, which_correction, p, 4)
    assert [(i["preset"], i.get("from_run")) for i in started] == [("vllm-v1-fixed", "cut"), ("vllm-v1-bf16", None)]
    same_result(whole, resumed)
    timing = [c for c in whole.ranking if c in ("step_s", "correction_ms")]  # wall time, as the metrics' TIMING
    pd.testing.assert_frame_equal(resumed.ranking.drop(columns=timing), whole.ranking.drop(columns=timing))
