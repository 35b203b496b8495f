"""Every notebook end to end with its smoke params through `rlwb run` (real papermill, real engines), its
report as a reader sees it (headless Chromium), and notebook hygiene. One parametrized smoke test: it runs the
notebook with its smoke params (00's and 10's are the session's shared runs); what each notebook must show is in
`CHECKS`."""

import json
import os
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from rlwb.reports.export import reader_noise
from tests.conftest import XDIST_GROUPS, check_figures_fit, chromium, finished_run, notebook_args, rlwb

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_committed_without_outputs(nb):
    book = nbformat.read(nb, as_version=4)
    for c in book.cells:
        if c.cell_type == "code":
            assert not c.outputs and c.execution_count is None, f"{nb.name} has outputs"
    assert book.metadata["kernelspec"]["name"] == "rlwb"
    assert book.cells[0].cell_type == "markdown" and book.cells[0].source.startswith("# ")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_stay_thin_and_answer_first(nb):
    """Logic lives in rlwb: a notebook calls its experiment's `run`, saves the result, then shows the answer
    (conclusion + key table) before any figure."""
    from rlwb.registry import notebook

    book = nbformat.read(nb, as_version=4)
    code = [c.source for c in book.cells if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]
    assert all(len(src.splitlines()) <= 8 for src in code), "a notebook cell grew past 8 lines: move it into rlwb"
    assert not any(re.search(r"^\s*(def|class|for|while) ", src, re.M) for src in code)
    src = "\n".join(code)
    assert f"{notebook(nb.stem).name}.run(params, model_path, on_start=run.record_engine" in src
    assert "run.save_result(result)" in src
    answer = next(i for i, c in enumerate(book.cells) if c.cell_type == "markdown" and c.source.startswith("## Answer"))
    first_figure = next(i for i, c in enumerate(book.cells) if "save_figure" in c.source)
    assert "result.conclusion()" in book.cells[answer + 1].source and answer < first_figure


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_help_notebook_lists_every_parameter(nb):
    """`papermill --help-notebook NB` as a user types it, through papermill's own command (its click entry point,
    the `papermill` script's), in this process: the same parsing and output without a Python start per notebook."""
    from dataclasses import fields

    from click.testing import CliRunner
    from papermill.__main__ import papermill as papermill_command

    from rlwb.params import schema_for

    out = CliRunner().invoke(papermill_command, ["--help-notebook", str(nb)], catch_exceptions=False)
    assert out.exit_code == 0
    for f in fields(schema_for(nb.stem)):
        assert f"  {f.name}: " in out.stdout, f.name
    assert "unknown" not in out.output.lower()  # stdout and stderr (click < 8.2 mixes them: no .stderr there)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_gpu_params_validate(nb):
    from rlwb import params

    gpu = REPO / "params" / nb.stem / "gpu.yaml"
    if nb.stem == "00_default_policy":
        assert not gpu.exists()  # notebook 00 is about the embedded model only
        return
    p = params.load(nb.stem, [gpu])
    # notebook 05's validator checks semantics at the float floor, notebook 06's and 07's baselines must have
    # no mismatch: fp32 engines there, bf16 elsewhere
    # notebook 09 measures the trainer at a real checkpoint's shapes with weights built here (its published config,
    # seeded random weights): it needs no download, and its fp32 sampler is the reference its settings start from
    assert p.model == ("qwen2.5-0.5b-random" if nb.stem == "09_trainer_settings" else "Qwen/Qwen2.5-0.5B-Instruct")
    assert p.dtype == ("float32" if nb.stem in ("05_equivalence_and_stress", "06_engine_knobs", "07_which_correction",
                                                "08_mismatch_cost", "09_trainer_settings") else "bfloat16")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_realistic_params_validate(nb):
    """Every engine notebook has a `realistic.yaml` on the realistic embedded model (issue #18)."""
    from rlwb import params

    if nb.stem == "00_default_policy":
        return  # its `model` param selects the model directly
    for f in sorted((REPO / "params" / nb.stem).glob("realistic*.yaml")):
        assert params.load(nb.stem, [f]).model == "qwen2-chat", f.name
    assert (REPO / "params" / nb.stem / "realistic.yaml").exists()


# -- what each notebook's smoke run must show ---------------------------------------------------------
def check_default_policy(d: Path, m: dict) -> None:
    assert 0 <= m["policy/greedy_accuracy"] <= 1 and m["policy/mean_completion_tokens"] >= 8
    assert 0 <= m["policy/reversed_answer_frac"] <= 1
    assert (d / "data" / "samples.parquet").stat().st_size > 0
    assert "Conclusion" in (d / "report.html").read_text()


def check_logprob_mismatch(d: Path, m: dict) -> None:
    from rlwb.core.measure.metrics import METRICS

    engines = ["vllm-v0", "vllm-v1", "vllm-v1-fixed"]  # the ladder (hf, vllm-v1-processed: tests/test_engines.py)
    for e in engines:
        for k in METRICS:
            assert f"{e}/{k}" in m
    # the index's answer opens with the ladder's verdict, not the first engine's numbers
    assert json.loads((d / "run.json").read_text())["answer"].startswith("At the float floor")
    # fp32, T=0.7: processed-logprob engines at the float floor; V1 defaults show the raw-logprob gap
    for e in ("vllm-v0", "vllm-v1-fixed"):
        assert m[f"{e}/abs_dlogp_max"] <= 1e-4, e
    # the raw-logprob gap: k3 eight orders above the float floor's ~1e-13 (7.8e-05 on this smoke sample of the
    # current default build; its peaked distributions keep the gap small on most tokens)
    assert m["vllm-v1/abs_dlogp_max"] > 1e-2 and m["vllm-v1/k3_mean"] > 1e-5
    df = pd.read_parquet(d / "data" / "rollouts.parquet")
    assert {"engine", "request_id", "position", "token_id", "logp_engine", "logp_trainer", "logp_trainer_raw",
            "prompt_len"} <= set(df.columns)
    assert set(df["engine"]) == set(engines)
    # V1's reported logprobs are the trainer's raw (T=1) ones
    v1 = df[df["engine"] == "vllm-v1"]
    assert (v1["logp_engine"] - v1["logp_trainer_raw"]).abs().max() <= 1e-4
    info = json.loads((d / "run.json").read_text())
    assert set(info["engines"]) == set(engines)
    v0 = info["engines"]["vllm-v0"]
    assert v0["vllm_version"].startswith("0.8.5") and v0["engine"] == "v0"
    figs = {f.stem for f in (d / "figures").glob("*.png")}
    assert figs == {"ablation_ladder", "prob_scatter", "log_ratio_hist", "mismatch_vs_position", "mismatch_vs_prob",
                    "reward_distributions"}
    # 95% sequence-bootstrap intervals around the headline metrics
    for e in engines:
        for k in ("abs_dlogp_mean", "k3_mean", "clip_frac"):
            assert m[f"{e}/{k}_ci_low"] <= m[f"{e}/{k}"] + 1e-15 <= m[f"{e}/{k}_ci_high"] + 2e-15, (e, k)
    assert m["vllm-v1/k3_mean_ci_low"] > m["vllm-v1-fixed/k3_mean_ci_high"]  # the gap is not noise
    # reward equivalence: every engine and every pair, with valid p-values
    rewards = pd.read_parquet(d / "data" / "rewards.parquet")
    assert rewards.groupby("engine").size().to_dict() == dict.fromkeys(engines, 64)
    for e in engines:
        assert m[f"{e}/reward_mean_ci_low"] <= m[f"{e}/reward_mean"] <= m[f"{e}/reward_mean_ci_high"]
        assert m[f"{e}/reward_mean"] == pytest.approx(rewards[rewards["engine"] == e]["reward"].mean())
    pairs = [k for k in m if k.endswith("/reward_pvalue")]
    assert len(pairs) == len(engines) * (len(engines) - 1) // 2
    assert all(0 < m[k] <= 1 for k in pairs)
    html = (d / "report.html").read_text()
    assert "At the float floor" in html and "Reward equivalence" in html


def check_kl_vs_temperature(d: Path, m: dict) -> None:
    # V1 default: ~0 at T=1, grows with |T-1|; the processed engines stay at the float floor everywhere
    assert m["vllm-v1/T=1/abs_dlogp_max"] <= 1e-4
    assert m["vllm-v1/T=0.5/k3_mean"] > 1e-4 and m["vllm-v1/T=1.5/k3_mean"] > 1e-4
    assert m["vllm-v1/T=0.5/k3_mean_ci_low"] <= m["vllm-v1/T=0.5/k3_mean"] <= m["vllm-v1/T=0.5/k3_mean_ci_high"]
    # the raw-logprob gap is far outside the processed engines' intervals (a smoke sample is small, so the
    # interval itself is wide: a few sequences carry most of the gap)
    assert m["vllm-v1/T=0.5/k3_mean_ci_low"] > 1e3 * m["vllm-v0/T=0.5/k3_mean_ci_high"]
    for e in ("hf", "vllm-v0", "vllm-v1-processed"):
        for t in ("0.5", "1", "1.5"):
            assert m[f"{e}/T={t}/abs_dlogp_max"] <= 1e-4, (e, t)
            assert m[f"{e}/T={t},top_p=0.9/abs_dlogp_max"] <= 1e-4, (e, t)
    # the analytical expectation of V1's raw-logprob gap holds to float precision
    for t in ("0.5", "1", "1.5"):
        assert m[f"vllm-v1/T={t}/analytic_abs_err_max"] <= 1e-4
    # a trainer that does not renormalise over the top-p set is off for the processed engines
    no_renorm = m["vllm-v0+trainer_no_renorm/T=0.5,top_p=0.9/abs_dlogp_mean"]
    assert no_renorm > 10 * m["vllm-v0/T=0.5,top_p=0.9/abs_dlogp_mean"]
    sweep = pd.read_parquet(d / "data" / "sweep.parquet")
    assert {"engine", "temperature", "top_p", "top_k", "trainer", "metric", "value"} <= set(sweep.columns)


def check_toy_grpo(d: Path, m: dict) -> None:
    curves = pd.read_parquet(d / "data" / "curves.parquet")
    from rlwb.core.rl.grpo import CURVE_COLUMNS

    assert set(CURVE_COLUMNS) <= set(curves.columns)
    assert len(curves) == 3 * 2 * 2  # steps x corrections x seeds
    assert (curves["t_sync"] > 0).all() and (curves["grad_norm"] > 0).any()
    for c in ("none", "verl.geo_rs"):
        for k in ("reward_first", "reward_last", "clip_frac_mean", "mismatch_k3_mean", "step_s_mean"):
            assert f"vllm-v1-fixed+{c}/{k}" in m
        L = f"vllm-v1-fixed+{c}"  # Student-t interval over the 2 seeds
        assert m[f"{L}/drift_trip_frac"] == 0  # the drift monitor stays quiet on the fixed engine
        assert m[f"{L}/reward_last_ci_low"] <= m[f"{L}/reward_last"] <= m[f"{L}/reward_last_ci_high"]
    # the premise of `skip_at_floor`: on the mismatch-free engine a correction trains the same rewards as `none`,
    # so its paired gap to the reference is exactly 0 on both seeds
    fixed = curves[curves["engine"] == "vllm-v1-fixed"].sort_values(["seed", "step"])
    none, geo = (fixed[fixed["correction"] == c]["reward_mean"].to_numpy() for c in ("none", "verl.geo_rs"))
    assert len(none) == 6 and (none == geo).all()
    assert m["vllm-v1-fixed+verl.geo_rs/gap"] == m["vllm-v1-fixed+verl.geo_rs/gap_ci_low"] == 0.0
    # the index's answer opens with the paired reward gaps, not with which arms were skipped
    assert json.loads((d / "run.json").read_text())["answer"].startswith("Paired gaps to")


def check_determinism_and_staleness(d: Path, m: dict) -> None:
    assert m["vllm-v1/prefix_caching"] == 1.0
    assert m["vllm-v1/stale_cache_abs_dlogp_max"] > 1e-3  # stale KV from the old weights
    assert m["vllm-v1/after_reset_abs_dlogp_max"] <= 1e-4  # gone after reset_prefix_cache()
    assert m["vllm-v1-fixed/stale_cache_abs_dlogp_max"] <= 1e-4  # caching off: nothing to go stale
    # what the README states: V1 greedy outputs bitwise batch-invariant on this CPU (V0 only partly: its
    # fraction is measured, and never above V1's); seeded reruns identical on every engine
    for e in ("vllm-v1", "vllm-v1-fixed"):
        assert m[f"{e}/batch_invariant_frac"] == 1.0 and m[f"{e}/batch_max_abs_dlogp"] == 0.0
    assert m["vllm-v0/batch_invariant_frac"] <= m["vllm-v1/batch_invariant_frac"]
    for e in ("vllm-v0", "vllm-v1", "vllm-v1-fixed"):
        assert m[f"{e}/rerun_identical_frac"] == 1.0
        assert "=== rlwb: starting" in (d / "logs" / f"engine-{e}.log").read_text()  # engine logs archived


def check_equivalence_and_stress(d: Path, m: dict) -> None:
    # the validator: processed-logprob engines pass every case, V1's raw logprobs fail and get shrunk (V0, which
    # the smoke run leaves out to save an engine start: tests/test_equivalence.py and tests/test_stress.py)
    for e in ("vllm-v1-fixed",):
        assert m[f"{e}/validate_pass_rate"] == 1.0 and m[f"{e}/validate_worst_abs_dlogp"] <= 1e-3
    assert m["vllm-v1/validate_pass_rate"] < 1.0
    rate = "vllm-v1/validate_pass_rate"
    assert m[f"{rate}_ci_low"] <= m[rate] <= m[f"{rate}_ci_high"]
    shrunk = pd.read_parquet(d / "data" / "shrunk.parquet")
    assert list(shrunk["engine"]) == ["vllm-v1"] and shrunk["max_tokens"].iloc[0] == 1
    # memory pressure preempts on every vLLM preset; logprobs stay at the float floor
    for e in ("vllm-v1", "vllm-v1-fixed"):
        assert m[f"{e}/pressure_preemptions"] >= 1
        assert m[f"{e}/pressure_abs_dlogp_max"] <= 1e-4 and m[f"{e}/longctx_dist_abs_dlogp_max"] <= 1e-4
        assert m[f"{e}/longctx_max_position"] == 4064 + 8 - 1
    for f in ("validate_cases", "pressure_bars", "longctx_vs_position"):
        assert (d / "figures" / f"{f}.png").stat().st_size > 10_000
    html = (d / "report.html").read_text()
    assert "95% CI" in html and "preemptions" in html


def check_which_correction(d: Path, m: dict) -> None:
    from rlwb.core.rl.correction_catalog import HEALTH

    curves = pd.read_parquet(d / "data" / "curves.parquet")
    assert set(HEALTH) <= set(curves.columns)
    # the baseline level runs `none` only; the bf16 level every correction: (1 + 3) x 2 seeds x 3 steps
    assert len(curves) == (1 + 3) * 2 * 3
    base, bf16 = "vllm-v1-fixed+none", "vllm-v1-bf16"
    assert m[f"{base}/mismatch_k3_mean"] < 1e-9 < 1e-7 < m[f"{bf16}+none/mismatch_k3_mean"]  # floor vs bf16
    assert m[f"{base}/gap"] == 0 and m[f"{base}/ess_mean"] == 1 and m[f"{base}/masked_frac_mean"] == 0
    # Geo-RS's 0.1% band is narrower than bf16's per-token noise: it rejects sequences; TRL's band ([0, 3] on
    # the product ratio) keeps them all
    assert m[f"{bf16}+verl.geo_rs/masked_frac_mean"] > 0.05 and m[f"{bf16}+verl.geo_rs/ess_mean"] < 0.95
    assert m[f"{bf16}+trl.sequence_mask/masked_frac_mean"] == 0
    ranking = pd.read_parquet(d / "data" / "ranking.parquet")
    # 2 seeds, 3 tested rows: every verdict is a Holm-corrected test with its MDE beside it, never a CI alone
    assert len(ranking) == 4 and set(ranking["verdict"]) <= {"baseline", "recovers", "falls short",
                                                               "above baseline", "inconclusive"}
    tested = ranking[ranking["verdict"] != "baseline"]
    assert tested["p_equiv_holm"].notna().all() and (tested["mde"] >= 0).all()
    lvl = ranking[ranking["level"] == bf16]
    assert list(lvl["rank"]) == [1, 2, 3] and lvl["reward_final"].is_monotonic_decreasing
    for f in ("race_gaps", "race_reward_curves", "race_health", "time_breakdown"):
        assert (d / "figures" / f"{f}.png").stat().st_size > 10_000
    assert "How verdicts are reached" in (d / "report.html").read_text()


def check_engine_knobs(d: Path, m: dict) -> None:
    status = pd.read_parquet(d / "data" / "status.parquet").set_index("knob")
    assert m["baseline/abs_dlogp_max"] <= 1e-4 and status.loc["baseline", "verdict"] == "at the float floor"
    # prefix caching on distinct prompts changes nothing: same tokens, still at the floor
    assert m["prefix-caching/same_tokens_frac"] == 1 and m["prefix-caching/abs_dlogp_max"] <= 1e-4
    # bf16 moves the engine off the trainer, and the interval of its change against the baseline excludes 0
    assert m["bf16/k3_mean"] > 100 * m["baseline/k3_mean"] and m["bf16/delta_k3_mean_ci_low"] > 0
    assert status.loc["bf16", "verdict"] in ("healthy", "fails a health rule")
    # vLLM's own fp32 head (head_dtype) took effect and brings the bf16 engine closer to the trainer
    assert status.loc["bf16-head-native", "status"] == "ok"
    assert m["bf16-head-native/k3_mean"] < m["bf16/k3_mean"]
    # throughput priced against the baseline in the same run; the baseline carries no ratio to itself (1 by
    # construction) but its own tokens/s
    for k in ("bf16", "prefix-caching"):
        assert m[f"{k}/tok_s"] > 0 and np.isfinite(m[f"{k}/throughput_ratio"])
    assert m["baseline/tok_s"] > 0 and "baseline/throughput_ratio" not in m
    # the change against the baseline is paired by prompt and seed: prefix caching samples the same tokens with
    # the same logprobs, so every resampled pair differs by exactly 0 (an unpaired interval would not be [0, 0])
    assert m["prefix-caching/delta_k3_mean_ci_low"] == m["prefix-caching/delta_k3_mean_ci_high"] == 0
    # every setting the running knobs change was read back from the engine: nothing is left "not verified"
    assert (status.loc[status.status == "ok", "not_verified"] == "").all()
    # a knob this CPU cannot run is a row with the engine's own error, never dropped
    assert status.loc["tp2-ray", "status"] == "unsupported here" and "ray" in status.loc["tp2-ray", "error"].lower()
    assert "tp2-ray/k3_mean" not in m
    # the version axis: vLLM 0.8.5 (V0) on the same prompts, at the float floor
    assert status.loc["vllm-v0", "section"] == "version" and status.loc["vllm-v0", "vllm_version"].startswith("0.8.5")
    assert m["vllm-v0/abs_dlogp_max"] <= 1e-4
    # the MoE router: fp32 engine routes as the fp32 trainer; bf16 measured on every layer
    routing = pd.read_parquet(d / "data" / "routing.parquet")
    assert sorted(routing["knob"].unique()) == ["baseline", "bf16"] and len(routing) == 2 * 4
    assert m["moe/baseline/topk_set_agree"] >= 0.99 and m["moe/baseline/abs_dlogp_max"] <= 1e-4
    assert 0 < m["moe/bf16/topk_set_agree"] <= 1 and m["moe/bf16/k3_mean"] > m["moe/baseline/k3_mean"]
    for f in ("knob_heatmap", "knob_price", "router_agreement"):
        assert (d / "figures" / f"{f}.png").stat().st_size > 10_000
    html = (d / "report.html").read_text()
    assert "Unsupported here" in html and "MoE router" in html


def check_mismatch_cost(d: Path, m: dict) -> None:
    """The machinery, not the outcome: doses achieved, controls present and judged, paired gaps and KL computed,
    real engine points placed."""
    doses = pd.read_parquet(d / "data" / "doses.parquet").set_index(["label", "arm"])
    curves = pd.read_parquet(d / "data" / "curves.parquet")
    arms = ["none@engine", "none@trainer"]
    # clean, ratio, weights, stale x 2 arms; the point and its clean twin at T 1 x 1 arm; the placebo; the rerun;
    # the PPO-epochs regime (1 mini-batch x 2 epochs): decoupled's clean run and weights dose
    epochs = [("clean+ppo1x2", "none@trainer"), ("weights@0.03+ppo1x2", "none@trainer")]
    assert sorted(doses.index) == sorted([(lab, a) for lab in ("clean", "ratio@0.01", "weights@0.03", "stale@2")
                                          for a in arms] + [("vllm-v1@T1", "none@engine"), ("placebo", "none@engine"),
                                                            ("clean@T1", "none@engine"), ("rerun", "none@engine")]
                                         + epochs)
    runs = 4 * 2 * 2 + 2 * 2 + 2 + 1 + 2 * 2
    assert len(curves) == runs * 3  # runs x steps
    # every job kept the moment it finished (issue 46's resume), its probe dropped once the study finished; run.json
    # says which run trained them
    assert len(list((d / "data" / "jobs").glob("*.parquet"))) == runs
    assert not list((d / "data" / "jobs").glob("*.probe.pt")) and (d / "data" / "jobs" / "start.json").exists()
    resume = json.loads((d / "run.json").read_text())["resume"]
    assert resume["reused_jobs"] == 0 and resume["parts"] == {d.name: resume["parts"][d.name]}
    assert resume["parts"][d.name]["jobs"] == resume["jobs"] == runs
    for a in arms:
        assert doses.loc[("clean", a), "k3_achieved"] <= 1e-8  # fp32 V1-fixed: the float floor at dose 0
        # the ratio dose reaches the reported logprobs at its intended k3, as noise (mean log r near 0, not a bias)
        assert 0.5 * 0.01 <= doses.loc[("ratio@0.01", a), "k3_achieved"] <= 2 * 0.01
        assert abs(doses.loc[("ratio@0.01", a), "k1_achieved"]) < 0.02
        for lab in ("weights@0.03", "stale@2"):  # another policy sampled: a mismatch, and a policy that moved
            assert doses.loc[(lab, a), "k3_achieved"] > 1e-6 and doses.loc[(lab, a), "kl_to_clean"] > 0
    # the stale engine samples with the initial weights for its first 2 steps, then 2 updates behind
    st = curves[(curves["label"] == "stale@2")].groupby("step")["mismatch_k3"].mean()
    assert st.loc[0] <= 1e-8 and st.loc[1] > 1e-8
    # controls: ratio-blind none@trainer trains bitwise as its clean twin; the rerun reproduces the first clean run;
    # V1 raw at T 1 reports the processed logprobs (float floor) and is tested alone, unadjusted
    ctl = doses.loc[("ratio@0.01", "none@trainer")]
    assert ctl["control"] == "ratio-blind" and ctl["identical"] and ctl["gap"] == 0 and ctl["kl_to_clean"] == 0
    assert ctl["verdict"] == "null (passes)" and m["control/ratio@0.01/none@trainer"] == 1.0
    assert doses.loc[("ratio@0.01", "none@engine"), "kl_to_clean"] > 0
    assert m["control/rerun/identical"] == 1.0 and doses.loc[("rerun", "none@engine"), "identical"]
    # every trained policy was evaluated on its own (greedy, no engine): the bitwise twins score alike
    assert doses["heldout_acc"].between(0, 1).all() and doses["heldout_acc"].nunique() > 1
    assert ctl["heldout_gap"] == 0 and doses.loc[("rerun", "none@engine"), "heldout_gap"] == 0
    t1 = doses.loc[("vllm-v1@T1", "none@engine")]
    assert t1["control"] == "T=1" and t1["raw_logprobs"] and t1["k3_achieved"] <= 1e-8 and np.isnan(t1["p_holm"])
    assert t1["verdict"] == "null (passes)" and m["control/vllm-v1@T1/none@engine"] == 1.0
    # every outcome sampled by the clean base engine at the notebook's T (0.7), the T = 1 point's too (by the
    # scorer's own engine): a point that trained bitwise as its clean twin scores exactly as it
    assert (curves["outcome_engine"] == "vllm-v1-fixed").all() and (curves["outcome_temperature"] == 0.7).all()
    assert not t1["identical"] or t1["gap"] == 0
    # the initial policy scored as the trained ones (one value for the whole study): the clean gain's baseline
    assert curves["initial_policy_reward"].between(0, 1).all() and curves["initial_policy_reward"].nunique() == 1
    # one completion per problem (smoke: policy_samples 1) cannot measure its sampling noise: the bounds take the
    # binomial bound and say so (a run sampling 2 or more keeps it measured: test_mismatch_cost)
    bench = pd.read_parquet(d / "data" / "benchmarks.parquet")
    assert "initial_policy_reward_se" not in curves and len(bench)
    assert not any(k.startswith("scoring/") for k in m)  # nor split its scoring by draw (`scoring_noise`)
    assert (bench["baseline_se_source"] == "binomial bound").all() and (bench["baseline_se"] > 0).all()
    acc0 = curves["initial_heldout_greedy_acc"]
    assert acc0.between(0, 1).all() and acc0.nunique() == 1
    assert curves["kl_to_clean"].notna().all()  # each run's KL is in the curves: the analysis needs them alone
    from rlwb.experiments import mismatch_cost as mc
    from rlwb.params import load

    again = mc.reanalyze(d, load("08_mismatch_cost", [d / "params.yaml"]))  # redone from params and curves alone
    assert again.metrics.keys() <= m.keys()
    assert all(m[k] == v or (m[k] is None or np.isnan(m[k])) and np.isnan(v) for k, v in again.metrics.items())
    for key in ("gap", "gap_ci_low", "gap_ci_high", "mde"):  # paired over the 2 seeds: every interval exists
        assert np.isfinite(m[f"ratio@0.01/none@engine/{key}"]), key
    assert m["ratio@0.01/none@engine/gap_ci_low"] <= m["ratio@0.01/none@engine/gap"] <= m[
        "ratio@0.01/none@engine/gap_ci_high"]
    family = doses[(doses["control"] == "") & ~doses["kind"].isin(["clean", "rerun"])]
    # ratio, weights, stale x 2 arms, minus the control, plus the epochs regime's dose and the placebo: one Holm family
    assert len(family) == 7 and family["p_holm"].notna().all() and ("placebo", "none@engine") in family.index
    # the placebo is the clean run on another sampling-seed stream: same prompts, other completions; its gap is
    # exactly its own outcome minus the clean run's, seed by seed, and the reported false-positive rates are its
    # own test's rejections (recomputed here, so a rate that is not the placebo's fails)
    plc, cln = (curves[(curves["label"] == lab) & (curves["arm"] == "none@engine")] for lab in ("placebo", "clean"))
    assert (plc["stream"] == 1).all() and (cln["stream"] == 0).all()
    assert not np.array_equal(plc["reward_mean"].to_numpy(), cln["reward_mean"].to_numpy())
    per = [d.groupby("seed")["policy_reward"].first() for d in (plc, cln)]
    prow = doses.loc[("placebo", "none@engine")]
    assert prow["gap"] == pytest.approx((per[0] - per[1]).mean(), abs=1e-12) and prow["control"] == ""
    assert m["placebo/rows"] == 1 and m["placebo/false_positive_rate"] == float(prow["p"] < 0.05)
    assert m["placebo/false_positive_rate_holm"] == float(prow["p_holm"] < 0.05)
    # the tested outcome: the trained policy sampled from a clean engine; the training reward is secondary
    assert (doses["outcome"] == "policy_reward").all() and doses["policy_reward"].between(0, 1).all()
    assert doses["train_gap"].notna().sum() >= 6 and (doses.loc[doses["kind"] == "stale", "lag_bias"].notna()).all()
    # one update per batch: the decoupled ratio is exactly 1 on every token (the clip cannot act there); a second
    # epoch over the same batch moves it off 1 at every step, and the clip acts (issue #58's smoke check)
    dec = curves[curves["arm"] == "none@trainer"]
    assert (dec["updates_per_batch"] == 1).all() and set(dec["epochs"]) == {1, 2}
    assert (dec.loc[dec["epochs"] == 1, "ratio_abs_log_mean"] == 0).all()
    assert (dec.loc[dec["epochs"] == 2, "ratio_abs_log_mean"] > 1e-4).all()
    assert dec.loc[dec["epochs"] == 2, "clip_frac"].mean() > 0
    reg = pd.read_parquet(d / "data" / "regimes.parquet").set_index(["regime", "arm"])
    assert reg.loc[("1x1", "none@trainer"), "ratio_abs_log_mean"] == 0
    assert reg.loc[("1x2", "none@trainer"), "ratio_abs_log_mean"] > 1e-4 and reg.loc[("1x2", "none@trainer"),
                                                                                         "steps_per_batch"] == 2
    bench = pd.read_parquet(d / "data" / "benchmarks.parquet")  # one dose per kind: no curve to fit, said so
    # ratio none@trainer is a control (the epochs regime adds its weights row); two seeds are too few for a benchmark
    # dose's bootstrap, and it says so
    assert len(bench) == 3 * 2 - 1 + 1 and bench["status"].str.startswith("no benchmark (need at least 3 seeds").all()
    for f in ("dose_response", "cost_reward_curves"):
        assert (d / "figures" / f"{f}.png").stat().st_size > 10_000
    html = (d / "report.html").read_text()
    assert "Controls." in html and "(passes: the reported logprobs never reach its update)" in html
    assert "PPO regimes" in html and "1 mini-batch(es) x 2 epochs" in html
    assert "Real engines on the same axes" not in html  # the only point is the T = 1 control
    check_reanalysis(d, m, len(curves) // 3)


def check_reanalysis(d: Path, m: dict, jobs: int) -> None:
    """`rlwb run --reanalyze` (runner.run's `reanalyze`) of this finished study, in a real kernel: a run that trains
    nothing (no engine starts, no job kept) and whose analysis is the study's own, metric for metric; its record
    names the source run, the source's commit beside its own and the source's engines (`from_run`), and its report
    says where its data came from. Mock: `archive.git_info` says the trees are clean commits (the suite runs in a
    working tree that may hold uncommitted changes, which a reanalysis refuses: tests/test_reanalysis.py), and the
    source's copy says it was made at another commit, the case a reanalysis exists for."""
    import shutil
    from unittest import mock

    from rlwb import archive, host, runner

    src = d.parent.parent.parent / "reanalysis-source" / d.parent.name / d.name
    shutil.copytree(d, src, ignore=shutil.ignore_patterns("jobs"))
    source = json.loads((d / "run.json").read_text())
    archive.update_record(src, git_commit="a" * 40, git_dirty=False, host={**source["host"], "cpu": "Other CPU"})
    with mock.patch.object(archive, "git_info", lambda: {"git_commit": "b" * 40, "git_dirty": False}):
        new = runner.run(d.parent.name, [], None, src.parent.parent.parent / "reanalysis", reanalyze=src)
    rec, again = (json.loads((new / f).read_text()) for f in ("run.json", "metrics.json"))
    assert rec["status"] == "ok" and rec["git_commit"] == "b" * 40 and rec["host"]["cpu"] != "Other CPU"
    trained = rec["reanalysis"]["training"]
    assert rec["reanalysis"]["from"] == str(src.resolve()) and rec["reanalysis"]["via"] == []
    assert (trained["run_id"], trained["commit"]) == (d.name, "a" * 40)
    assert trained["host"] == host.cpu_name({**source["host"], "cpu": "Other CPU"})  # its instruction set too
    assert trained["host"].startswith("Other CPU")
    assert (trained["duration_s"], trained["time_s"], trained["jobs"]) == (source["duration_s"], source["time_s"],
                                                                         jobs)
    assert [c["run_id"] for c in trained["chain"]] == [d.name] and trained["parts"][d.name]["jobs"] == jobs
    assert rec["engines"] == {k: {**v, "from_run": d.name} for k, v in source["engines"].items()}  # none started here
    assert all(rec["time_s"].get(phase, 0) == 0 for phase in ("engine_start", "sampling", "training"))
    assert not list((new / "data").glob("jobs/*.parquet"))
    assert again["resume/trained_jobs"] == 0 and again["resume/reused_jobs"] == jobs
    same = {k: v for k, v in m.items() if not k.startswith("resume/")}
    assert {k for k in again if not k.startswith("resume/")} == same.keys()
    assert all(again[k] == v or (v is None or np.isnan(v)) and (again[k] is None or np.isnan(again[k]))
               for k, v in same.items())
    pd.testing.assert_frame_equal(pd.read_parquet(new / "data" / "curves.parquet"),
                                  pd.read_parquet(d / "data" / "curves.parquet"))
    assert f"trained by run <code>{d.name}</code> at git <code>{'a' * 10}</code>" in (new / "report.html").read_text()


def check_audit(d: Path, m: dict) -> None:
    """The prompts file's three row shapes through one preset, rlwb's fp32 scorer: at the float floor, every
    framework's number beside its threshold, the worst tokens, and a self-contained rollouts table."""
    assert m["vllm-v1-processed/abs_dlogp_max"] <= 1e-4 and m["vllm-v1-processed/frameworks_flagged"] == 0
    assert m["vllm-v1-processed/k3_mean_ci_low"] <= m["vllm-v1-processed/k3_mean"] + 1e-15
    info = json.loads((d / "run.json").read_text())
    assert info["source"]["rows"] == 8 and info["source"]["fields"] == {"prompt": 6, "prompt_token_ids": 2}
    assert info["trainer"] == {"kind": "hf", "dtype": "float32", "attn_implementation": "sdpa", "device": "cpu"}
    panel = pd.read_parquet(d / "data" / "panel.parquet")
    assert {"verl", "NeMo-RL", "slime", "SkyRL", "prime-rl"} == set(panel["framework"])
    assert (panel["threshold"].isna() == (panel["verdict"] == "no threshold")).all()
    worst = pd.read_parquet(d / "data" / "worst_tokens.parquet")
    assert len(worst) == 10 and worst["abs_dlogp"].is_monotonic_decreasing and set(worst["prompt"]) <= {
        f"task-{i}" for i in range(8)}
    rollouts = pd.read_parquet(d / "data" / "rollouts.parquet")
    assert {"prompt_token_ids", "temperature", "seed"} <= set(rollouts.columns)
    html = (d / "report.html").read_text()
    assert "On each framework" in html and "rollout_corr/kl" in html and "prompts_smoke.jsonl" in html


def check_trainer_settings(d: Path, m: dict) -> None:
    status = pd.read_parquet(d / "data" / "status.parquet").set_index("setting")
    # the control: float64 in the scorer's batches agrees with the per-sequence float64 reference, and with its own
    # batch-of-one values, to float64's rounding, far below any fp32 setting (that the reference is not fp32-rounded
    # is tests/test_trainer_settings.py's)
    assert m["fp64/abs_dlogp_max"] < 1e-12 and m["fp64/batch1_abs_dlogp_max"] < 1e-12
    # fp32 computations at the float floor (but not float64 itself); bf16 leaves it
    for s in ("fp32", "batch1", "packed", "mb4+grad"):
        assert 0 < m[f"{s}/abs_dlogp_max"] <= 1e-4, s
    assert m["bf16/abs_dlogp_max"] > 1e-3 and m["bf16/k3_mean_ci_low"] > 1e-9
    assert np.isnan(m.get("batch1/batch1_identical_frac", np.nan)) and 0 <= m["fp32/batch1_identical_frac"] <= 1
    assert 0 <= m["mb4+grad/ppo_ratio_identical_frac"] <= 1 and m["fp32/time_ratio"] == 1
    # a setting this CPU cannot run is a row with the library's own error, never dropped
    assert status.loc["flash2", "status"] == "unsupported here" and "FlashAttention2" in status.loc["flash2", "error"]
    # the grid: both bf16 engines (vLLM's own fp32 head on the second), each scored by both trainers
    grid = pd.read_parquet(d / "data" / "grid.parquet")
    assert len(grid) == 4 and (grid["status"] == "ok").all()
    for e in ("vllm-v1-fixed@bf16", "vllm-v1-fixed@bf16-head-native"):
        assert m[f"grid/{e}/engine_vs_reference/k3_mean"] > 1e-9  # a bf16 engine is off float64
        assert m[f"grid/{e}/fp32/trainer_k3_vs_reference"] < 1e-9  # the fp32 trainer is not
    ranking = pd.read_parquet(d / "data" / "ranking.parquet")
    assert ranking["k3_mean"].is_monotonic_decreasing and set(ranking["side"]) == {"trainer", "engine (this run)"}
    for f in ("settings_ranking", "settings_price", "head_grid"):
        assert (d / "figures" / f"{f}.png").stat().st_size > 10_000
    html = (d / "report.html").read_text()
    assert "Control." in html and "Did not run here" in html and "compare_run: none" in html


CHECKS = {"00_default_policy": check_default_policy, "01_logprob_mismatch": check_logprob_mismatch,
          "02_kl_vs_temperature": check_kl_vs_temperature, "03_toy_grpo": check_toy_grpo,
          "04_determinism_and_staleness": check_determinism_and_staleness,
          "05_equivalence_and_stress": check_equivalence_and_stress, "06_engine_knobs": check_engine_knobs,
          "07_which_correction": check_which_correction, "08_mismatch_cost": check_mismatch_cost,
          "09_trainer_settings": check_trainer_settings,
          "10_audit": check_audit}

NEGATIVE_NOISE = re.compile(r">\s*-\d(\.\d+)?e-(0[7-9]|[1-9]\d)\s*<")  # a negative value below 1e-6 in a cell


def check_report(d: Path) -> None:
    """What a reader of report.html sees: the answer first, no code, no stderr, no temporary paths, no negative
    float noise, the provenance. HTML assertions on every report; that such a page renders in a browser is
    `test_a_report_renders_in_chromium` (one Chromium start, not one per report)."""
    html = (d / "report.html").read_text()
    assert not reader_noise(html), f"report.html shows {reader_noise(html)}"
    assert not NEGATIVE_NOISE.search(html), NEGATIVE_NOISE.search(html).group(0)
    assert "run.save_result" not in html and "In&nbsp;[" not in html and "Out&nbsp;[" not in html  # no code/prompts
    provenance, answer, figure = (html.index('class="rlwb-provenance"'), html.index('id="Answer"'),
                                  html.find('src="data:image/png'))  # nbconvert writes alt= and class= first
    assert provenance < answer and (figure == -1 or answer < figure)
    assert (figure != -1) == any((d / "figures").glob("*.png")), "a figure of the run is missing from its report"
    info = json.loads((d / "run.json").read_text())
    assert info["git_commit"][:10] in html and info["params_hash"] in html
    if os.environ.get("RLWB_TEST_SCREENSHOTS"):  # a developer's look at every report (CI takes one: below)
        screenshot(d, Path(os.environ["RLWB_TEST_SCREENSHOTS"]))


def screenshot(d: Path, folder: Path) -> Path:
    """report.html of run `d` in headless Chromium, as `folder/<notebook>.png`."""
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / f"{d.parent.name}-{d.name}.png"
    with tempfile.TemporaryDirectory() as profile:  # one profile per call: two xdist workers may shoot at once
        r = chromium(f"--screenshot={shot}", "--window-size=1280,1800", (d / "report.html").as_uri(),
                     profile=Path(profile))
    assert shot.exists() and shot.stat().st_size > 20_000, r.stderr[-1000:]
    return shot


@pytest.mark.slow
@pytest.mark.browser
def test_a_report_renders_in_chromium(notebook00_runs, tmp_path):
    """A report as a reader opens it: headless Chromium renders the page with its embedded figure (a screenshot of
    a blank or broken page is a few KB). Every report's HTML is checked by `check_report`; this is the browser."""
    d = notebook00_runs[1][0]
    check_report(d)
    screenshot(d, tmp_path)
    dom = chromium("--dump-dom", (d / "report.html").as_uri(), profile=tmp_path / ".chromium-profile")
    assert 'id="Answer"' in dom.stdout and 'class="rlwb-provenance"' in dom.stdout


# notebook 00's and 10's smoke runs are the session's shared ones (tests/conftest.py `notebook00_runs`,
# `audit_smoke_run`: 10's through `rlwb audit -f params/10_audit/smoke.yaml`, which is `rlwb run` of notebook 10), so
# their tests go to the xdist group of that fixture (it is asked for by name below, which pytest cannot see)
SHARED_SMOKE = {"00_default_policy": "notebook00_runs", "10_audit": "audit_smoke_run"}
SMOKE = [pytest.param(stem, marks=[pytest.mark.slow]
                      + ([pytest.mark.engines] if stem != "00_default_policy" else [])
                      + ([pytest.mark.xdist_group(XDIST_GROUPS[SHARED_SMOKE[stem]])] if stem in SHARED_SMOKE else []),
                      id=stem)
         for stem in CHECKS]


@pytest.mark.parametrize("stem", SMOKE)
def test_notebook_smoke(stem, outputs, default_model, request):
    if stem in SHARED_SMOKE:  # notebook00_runs is (archive, [a, b, c]): 00's smoke run is `a`
        shared = request.getfixturevalue(SHARED_SMOKE[stem])
        d = shared[1][0] if SHARED_SMOKE[stem] == "notebook00_runs" else shared
    else:  # `rlwb run` of the notebook with its smoke params, into `outputs` (RLWB_OUTPUTS)
        d = finished_run(rlwb(*notebook_args(stem), timeout=1200))
    CHECKS[stem](d, json.loads((d / "metrics.json").read_text()))
    # time to report, split by phase (rlwb.timing): the phases and `other` add up to the run's wall time
    info = json.loads((d / "run.json").read_text())
    split = info["time_s"]
    assert split["total"] == info["duration_s"] and split["archiving"] > 0 and split["model"] >= 0
    assert sum(v for k, v in split.items() if k != "total") == pytest.approx(split["total"], abs=0.1)
    if stem != "00_default_policy":
        assert split["engine_start"] > 1 and split["sampling"] > 0
    check_report(d)
    check_figures_fit(d)  # every figure in every style: no missing glyph, no overlapping text


@pytest.mark.slow
def test_a_model_built_inside_a_run_stays_out_of_its_report(tmp_path):
    """From an empty RLWB_CACHE the run builds its model itself (the fresh-machine case, whatever ran before): the
    build's progress goes to the run's logs/progress.log (echoed by `rlwb run` to the terminal), never into the
    notebook's outputs or report.html."""
    r = rlwb(*notebook_args("00_default_policy", "-p", "model", "qwen2-chat-smoke", "--outputs", str(tmp_path / "out")),
             env={"RLWB_CACHE": str(tmp_path / "cache")}, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    d = Path(r.stdout.strip().splitlines()[-1])
    assert (tmp_path / "cache" / "models").is_dir()  # it really built here
    assert "SFT chat arithmetic" in (d / "logs" / "progress.log").read_text() and "SFT chat arithmetic" in r.stderr
    book = nbformat.read(d / "notebook.ipynb", as_version=4)
    streams = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "stream"]
    assert not [o for o in streams if o.name == "stderr"], streams
    html = (d / "report.html").read_text()
    assert "SFT chat arithmetic" not in html and 'data-mime-type="application/vnd.jupyter.stderr"' not in html
