"""rlwb.experiments.wording on hand-made numbers: each verdict sentence says what its numbers say, and changes when
they cross what decides it (a criterion, a floor, a failed rule); sections appear only when there is something to
say. No engine, no run: the experiments' own smoke runs (tests/test_notebooks.py) check the sentences in context."""

from rlwb.experiments.wording import engine_knobs as W06
from rlwb.experiments.wording import equivalence_and_stress as W05
from rlwb.experiments.wording import logprob_mismatch as W01
from rlwb.experiments.wording import toy_grpo as W03

NAN = float("nan")


def _grpo_metrics(label: str, first: float, last: float, **extra) -> dict:
    return {f"{label}/reward_first": first, f"{label}/reward_last": last, f"{label}/clip_frac_mean": 0.125,
            f"{label}/mismatch_k3_mean": 2.5e-4, f"{label}/step_s_mean": 1.234, **extra}


def _grpo_setup(metrics: dict, **over) -> dict:
    gains = {k.rsplit("/", 1)[0]: metrics[k.replace("reward_first", "reward_last")] - metrics[k]
             for k in metrics if k.endswith("/reward_first")}
    return {"steps": 10, "prompts_per_step": 4, "group_size": 8, "temperature": 1.0, "lr": 1e-4,
            "old_logprobs": "engine", "num_seeds": 3, "timing_note": "Runs went one at a time.",
            "skipped_k3_max": {}, "others": [], "labels": list(gains), "gains": gains,
            "learning_reference": "fixed+none", "learning_min_gain": 0.15, "paired_reference": "fixed+none",
            "gaps": {}, "drift": None, **over}


def test_learning_check_turns_on_the_criterion():
    assert "`fixed+none` learns on this budget: reward +0.150" in W03.learning_check_line("fixed+none", 0.15, 0.01,
                                                                                           0.29, 0.15)
    below = W03.learning_check_line("fixed+none", 0.149, 0.01, 0.29, 0.15)
    assert "does NOT learn" in below and "(criterion: ≥ +0.15)" in below
    assert "[95% CI over seeds +0.010, +0.290]" in below
    assert "CI" not in W03.learning_check_line("fixed+none", 0.3, NAN, NAN, 0.15)
    assert "CI" not in W03.learning_check_line("fixed+none", 0.3, None, None, 0.15)


def test_run_line_states_the_numbers_and_the_interval_only_where_there_is_one():
    m = _grpo_metrics("v1+none", 0.25, 0.5, **{"v1+none/reward_last_ci_low": 0.4, "v1+none/reward_last_ci_high": 0.6})
    line = W03.run_line(m, "v1+none")
    assert line == ("- `v1+none`: reward 0.250 → 0.500 [95% CI 0.400, 0.600] (+0.250); clip fraction 12.5%; "
                    "engine-trainer k3 2.5e-04; 1.23 s/step.")
    m["v1+none/reward_last_ci_low"] = NAN
    assert "CI" not in W03.run_line(m, "v1+none")


def test_skipped_engines_are_named_with_their_k3_or_nothing_is_said():
    assert W03.skipped_lines({"fixed": 1e-9}, []) == [] and W03.skipped_lines({}, ["verl.geo_rs"]) == []
    (line,) = W03.skipped_lines({"fixed": 3e-9}, ["verl.geo_rs", "trl.opsm"])
    assert "Not run on `fixed` (largest per-step k3" in line and "`verl.geo_rs`, `trl.opsm`" in line


def test_drift_monitor_and_no_gain_lines():
    line = W03.drift_monitor_line("engine-trainer k3", "above", 1e-5, 2, 2, {"v1+none": (0.5, 3.0)}, ["fixed+none"])
    assert "tripped on `v1+none` (50% of seeds, at step 3 on average); quiet on `fixed+none`." in line
    assert "tripped on none; quiet on none." in W03.drift_monitor_line("k3", "above", 1e-5, 2, 2, {}, [])
    assert W03.no_gain_line(0.05, 10) == ""
    assert W03.no_gain_line(0.049, 10) == ("\nNo configuration improved its reward by 0.05 or more within 10 steps "
                                           "(best: +0.049).")


def test_grpo_conclusion_says_only_what_it_has_numbers_for():
    m = {**_grpo_metrics("fixed+none", 0.2, 0.5), **_grpo_metrics("v1+none", 0.2, 0.21)}
    gaps = {"v1+none": (-0.1, -0.3, 0.1)}
    text = W03.conclusion(m, _grpo_setup(m, gaps=gaps))
    assert "**Setup.** 10 steps × 4 prompts × 8 completions" in text and "Runs went one at a time." in text
    assert "`fixed+none` learns" in text and "`v1+none` -0.100 [-0.300, +0.100]" in text
    assert "Drift monitor" not in text and "No configuration improved" not in text
    assert "Paired gaps" not in W03.conclusion(m, _grpo_setup(m, gaps=gaps, num_seeds=1))  # one seed: no interval
    without_ref = {k: v for k, v in m.items() if not k.startswith("fixed+none/")}
    assert "Learning check" not in W03.conclusion(without_ref, _grpo_setup(without_ref))
    flat = {**_grpo_metrics("fixed+none", 0.2, 0.21)}
    assert "does NOT learn" in (t := W03.conclusion(flat, _grpo_setup(flat))) and "best: +0.010" in t


def _knob_metrics(k: str, k3: float, dlogp: float) -> dict:
    return {f"{k}/k3_mean": k3, f"{k}/k3_mean_ci_low": k3 / 2, f"{k}/k3_mean_ci_high": k3 * 2,
            f"{k}/abs_dlogp_max": dlogp, f"{k}/same_tokens_frac": 0.75, f"{k}/throughput_ratio": 1.5}


def _knob_setup(**over) -> dict:
    return {"run": {"baseline": "v1-fixed", "model": "m", "prompts": 8, "prompt_source": "open_ended",
                    "temperature": 1.0, "max_tokens": 16, "trainer_dtype": "float32",
                    "baseline_abs_dlogp_max": 2e-6, "baseline_tok_s": 123.4},
            "float_floor": 1e-4, "floor": {}, "failed": {}, "not_run": {}, "unverified": {}, "versions": [],
            "moe_model": "moe", "moe": [], **over}


def test_a_knob_passes_or_fails_the_health_rules_by_name():
    rule = W06.failed_rule("ess_tis", 0.2, ">=", 0.3, "verl")
    assert rule == "ess_tis 0.2 (needs >= 0.3, verl)"
    m = {**_knob_metrics("bf16", 1e-3, 0.5), **_knob_metrics("fp8", 1e-2, 2.0)}
    fails_line, passes_line = W06.moved_lines(m, {"fp8": [rule], "bf16": []})[1:]
    assert fails_line.startswith("- `fp8`:") and fails_line.endswith("fails ess_tis 0.2 (needs >= 0.3, verl).")
    assert passes_line.startswith("- `bf16`: k3 = 1.00e-03 [5.00e-04, 2.00e-03]")
    assert passes_line.endswith("passes the published health rules.")


def test_knob_conclusion_sections_follow_what_ran():
    bare = W06.conclusion({}, _knob_setup())
    assert bare.startswith("**Setup.** Baseline `v1-fixed` on `m`, 8 open-ended prompts") and "123 tok/s" in bare
    assert not any(s in bare for s in ("Free of mismatch", "move the engine", "Versions", "MoE", "Not verified"))
    assert bare.endswith("except those marked not verified.")
    m = {**_knob_metrics("prefix-caching", 0.0, 0.0), **_knob_metrics("bf16", 1e-3, 0.5),
         "v0/abs_dlogp_max": 0.25, "v0/throughput_ratio": 0.5}
    text = W06.conclusion(m, _knob_setup(
        floor={"prefix-caching": 1.5}, failed={"bf16": []},
        not_run={"unsupported here": {"tp2-ray": "needs 2 GPUs"}}, unverified={"bf16": "x=1"},
        versions=[{"knob": "v0", "status": "ok", "vllm_version": "0.8.5", "error": None},
                  {"knob": "v2", "status": "failed to start", "vllm_version": None, "error": "no env"}]))
    assert "**Free of mismatch** (max |Δlogp| ≤ 1e-4, as the baseline): `prefix-caching` (1.50× throughput)." in text
    assert "**Unsupported here** (the engine's own words): `tp2-ray`: needs 2 GPUs." in text
    assert "**Not verified**" in text and "`bf16`: x=1." in text
    assert ("**Versions**: `v0` (vLLM 0.8.5): max |Δlogp| 2.5e-01, 0.50× the baseline's throughput; "
            "`v2`: failed to start (no env).") in text
    moe = W06.conclusion({"moe/baseline/topk_set_agree": 0.975, "moe/baseline/any_layer_differs_frac": 0.125,
                          "moe/baseline/k3_mean": 3e-4}, _knob_setup(moe=["moe/baseline"]))
    assert ("**MoE router** (`moe`, top-k set agreement engine vs trainer, mean over layers): `baseline` 97.50% "
            "(12.5% of tokens routed differently in some layer; k3 3.0e-04).") in moe


def test_reward_verdict_turns_at_the_5_percent_level():
    m = {"a/reward_mean": 0.5, "b/reward_mean": 0.6, "a_vs_b/reward_mean_diff": -0.1, "a_vs_b/reward_pvalue": 0.049}
    differ = "\n".join(W01.reward_lines(m, ["a", "b"], 64))
    assert "**Reward equivalence** (64 rollouts per engine" in differ and "`a` 0.500" in differ
    assert "Pairs whose rewards differ (permutation p < 0.05): `a_vs_b` Δ = -0.100 , p = 0.049." in differ
    same = "\n".join(W01.reward_lines({**m, "a_vs_b/reward_pvalue": 0.05}, ["a", "b"], 64))
    assert "No pair's rewards differ at the 5% level (smallest p = 0.05, `a_vs_b`)" in same
    assert W01.reward_lines(m, ["c"], 64) == []


def test_mismatch_conclusion_sorts_engines_by_the_float_floor_and_explains_raw_logprobs():
    def eng(e, dlogp):
        return {f"{e}/abs_dlogp_max": dlogp, f"{e}/abs_dlogp_mean": dlogp / 10, f"{e}/k3_mean": dlogp ** 2,
                f"{e}/clip_frac": 0.0, f"{e}/n_tokens": 128}

    p = {"prompts": 8, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "dtype": "float32", "trainer_dtype": "float32",
         "heterogeneous_batch": False, "prompt_source": "task", "engines": ["vllm-v1-fixed", "vllm-v1"],
         "reward_samples": 0}
    m = {**eng("vllm-v1-fixed", 5e-5), **eng("vllm-v1", 0.3)}
    text = W01.conclusion(m, p)
    assert "At the float floor (max |Δlogp| ≤ 1e-4): `vllm-v1-fixed`." in text and "Above it: `vllm-v1`." in text
    assert "reports raw (T=1) logprobs by default, so at T=0.7" in text
    assert "raw (T=1)" not in W01.conclusion(m, {**p, "temperature": 1.0})
    assert "Above it" not in W01.conclusion({**eng("vllm-v1-fixed", 5e-5)}, p)


def test_stress_conclusion_says_when_there_is_no_paged_cache_or_no_preemption_count():
    m = {"hf/validate_pass_rate": 0.5, "hf/validate_cases": 6, "hf/validate_pass_rate_ci_low": 0.19,
         "hf/validate_pass_rate_ci_high": 0.81, "hf/validate_worst_abs_dlogp": 0.2, "hf/longctx_max_position": 4096,
         "hf/longctx_abs_dlogp_max": 1e-3, "hf/longctx_dist_abs_dlogp_max": NAN, "hf/longctx_max_near": 1e-4,
         "hf/longctx_max_far": 1e-3, "hf/longctx_abs_dlogp_mean": 1e-4, "hf/longctx_abs_dlogp_mean_ci_low": 5e-5,
         "hf/longctx_abs_dlogp_mean_ci_high": 2e-4}
    text = W05.conclusion(m, ["hf", "not-run"], 0.01).split("\n\n", 1)[1]
    assert text.startswith("- `hf`: validator 50% of 6 cases within 0.01 (95% CI 19%-81%)")
    assert "No paged KV cache, so no memory-pressure check." in text and "not-run" not in text
    assert "over the whole vocabulary n/a" in text
    pressed = {**m, "hf/pressure_abs_dlogp_max": 1e-3, "hf/pressure_preemptions": NAN, "hf/pressure_kv_tokens": 512,
               "hf/pressure_abs_dlogp_mean": 1e-4, "hf/pressure_abs_dlogp_mean_ci_low": 1e-4,
               "hf/pressure_abs_dlogp_mean_ci_high": 2e-4, "hf/free_abs_dlogp_max": 1e-3,
               "hf/pressure_identical_frac": 1.0}
    assert "(512-token KV cache, preemptions not exposed)" in W05.conclusion(pressed, ["hf"], 0.01)
    assert "3 preemptions" in W05.conclusion({**pressed, "hf/pressure_preemptions": 3.0}, ["hf"], 0.01)


def test_default_policy_names_its_model_and_adds_held_out_text_only_when_measured():
    from rlwb.experiments.wording import default_policy as W00

    m = {"policy/params": 1234567, "policy/greedy_accuracy": 0.4, "policy/mean_completion_tokens": 21.25,
         "policy/reversed_answer_frac": 0.1}
    text = W00.conclusion(m, "default", 200)
    assert text.startswith("**Conclusion.** The default policy has 1,234,567 parameters and solves 40.0% of 200")
    assert "held-out standard-library" not in text
    other = W00.conclusion({**m, "policy/held_out_entropy": 2.5, "policy/held_out_cross_entropy": 2.75}, "chat", 200)
    assert "The `chat` model has" in other and "entropy is 2.50 nats (cross-entropy 2.75)" in other


def test_determinism_line_per_engine_that_ran():
    from rlwb.experiments.wording import determinism_and_staleness as W04

    m = {"v1/batch_invariant_frac": 0.5, "v1/prefix_caching": 1.0, "v1/batch_max_abs_dlogp": 0.01,
         "v1/rerun_identical_frac": 1.0, "v1/stale_cache_abs_dlogp_max": 0.2, "v1/after_reset_abs_dlogp_max": 1e-9}
    (line,) = W04.conclusion(m, ["v1", "v0"], 8).splitlines()[2:]
    assert line.startswith("- `v1` (prefix caching on): 50% of greedy requests bitwise identical alone vs in a batch "
                           "of 8 (max |Δlogp| 1.0e-02); 100% of seeded reruns identical")


def _setting_metrics(s: str, k3: float, **extra) -> dict:
    return {f"{s}/k3_mean": k3, f"{s}/k3_mean_ci_low": k3 / 2, f"{s}/k3_mean_ci_high": k3 * 2,
            f"{s}/abs_dlogp_max": 0.5, **extra}


def _settings_setup(**over) -> dict:
    return {"run": {"sampler": "v1-fp32", "model": "m", "prompt_sources": ["task", "open_ended"], "prompts": 8,
                    "temperature": 1.0, "max_tokens": 16},
            "control": None, "ordered": [], "not_run": {}, "grid_failed": [], "grid": [], "grid_extremes": None,
            "ranking": None, **over}


def test_the_float64_control_says_whether_the_reference_is_batch_invariant():
    from rlwb.experiments.wording import trainer_settings as W09

    same = W09.control_line(0.0, 1.0, batch_invariant=True)
    assert "max |Δlogp| 0, 100% of sequences bitwise identical — the reference agrees with itself" in same
    differs = W09.control_line(3e-15, 0.5, batch_invariant=False)
    assert "50% of sequences" in differs and "the float64 reference is not batch-invariant here" in differs


def test_a_trainer_setting_line_says_only_what_was_measured():
    from rlwb.experiments.wording import trainer_settings as W09

    m = _setting_metrics("bf16", 1e-3, **{"bf16/batch1_identical_frac": 0.25, "bf16/time_ratio": 0.5})
    assert W09.setting_line(m, "bf16") == ("- `bf16`: k3 1.00e-03 [5.00e-04, 2.00e-03], max |Δlogp| 5.00e-01, "
                                           "25% same as batch 1, 0.50× time.")
    bare = W09.setting_line(_setting_metrics("batch1", 1e-3), "batch1")  # no batch-1 twin, no fp32 to time against
    assert "batch 1 itself, – time." in bare and "PPO" not in bare
    grad = W09.setting_line({**m, "bf16/ppo_ratio_abs_log_max": 0.0, "bf16/ppo_ratio_identical_frac": 1.0}, "bf16")
    assert grad.endswith("; PPO ratio at the first micro-step exactly 1 on 100% of sequences (max |log r| 0 against "
                         "its old-logprob pass).")
    no_ci = W09.setting_line({**m, "bf16/k3_mean_ci_low": NAN}, "bf16")
    assert "k3 1.00e-03 , max" in no_ci


def test_grid_extremes_and_the_scale_turn_on_the_experiments_decisions():
    from rlwb.experiments.wording import trainer_settings as W09

    lo = {"engine": "e-fp32head", "trainer": "fp32", "k3_mean": 1e-5, "k3_mean_ci_low": 5e-6, "k3_mean_ci_high": 2e-5}
    hi = {"engine": "e", "trainer": "bf16", "k3_mean": 1e-3, "k3_mean_ci_low": 5e-4, "k3_mean_ci_high": 2e-3}
    apart = W09.grid_extremes_line(lo, hi, separate=True)
    assert apart.endswith("most: `e` with trainer `bf16` (1.00e-03 [5.00e-04, 2.00e-03]).")
    assert W09.grid_extremes_line(lo, hi, separate=False).endswith("; their intervals overlap at this sample size.")
    t, e = {"name": "bf16", **{k: v for k, v in hi.items() if k.startswith("k3")}}, {"name": "e", **lo}
    run = {"run_id": "r1", "model": "m", "prompt_source": "task"}
    engine_side = " ".join(W09.ranking_lines(run, "m", True, t, e, engine_bigger=True, separate=True))
    assert "notebook 06's run `r1` (model `m`, task prompts)." in engine_side and "another model" not in engine_side
    assert "of the settings measured, the engine's side contributes more of the mismatch a user sees." in engine_side
    trainer_side = " ".join(W09.ranking_lines(run, "other", False, t, e, engine_bigger=False, separate=False))
    assert "the trainer's side contributes more" in trainer_side and "though their intervals overlap" in trainer_side
    assert "another model than this run's `other`" in trainer_side
    (alone,) = W09.ranking_lines({"note": "not asked for"}, "m", None, t, None, engine_bigger=False, separate=False)
    assert alone.endswith("Engine knobs of notebook 06: none ranked: not asked for.")


def test_settings_answer_and_conclusion_say_only_what_ran():
    from rlwb.experiments.wording import trainer_settings as W09

    assert W09.answer(None, None, None) == ""
    t = {"name": "bf16", "k3_mean": 1e-3}
    assert W09.answer(t, None, 1.0) == ("Largest trainer-side k3 bf16 1.00e-03 (vs float64); rlwb's fp32 scorer "
                                        "bitwise equal to its batch-1 result on 100% of sequences.")
    bare = W09.conclusion({}, _settings_setup())
    assert bare.startswith("**Setup.** `v1-fp32` (fp32) sampled 8 prompts (task, open_ended; T=1, up to 16 tokens)")
    assert bare.count("\n") == 0
    m = _setting_metrics("bf16", 1e-3)
    text = W09.conclusion(m, _settings_setup(
        ordered=["bf16"], not_run={"flash3": "ImportError: no flash_attn_3."},
        grid_failed=[("e-fp8", "unsupported here", "no fp8 kernels.")],
        grid=[{"engine": "e", "engine_k3": 2e-3, "cells": [{"trainer": "fp32", "k3": 1e-3, "trainer_k3": 0.0}]}]))
    assert "**Trainer settings, largest k3 against float64 first**" in text and "- `bf16`: k3 1.00e-03" in text
    assert "**Did not run here** (the library's own words): `flash3`: ImportError: no flash_attn_3." in text
    assert "**Engines of the head grid that did not run here**: `e-fp8`: unsupported here (no fp8 kernels)." in text
    assert "- `e` (engine alone 2.00e-03): trainer `fp32` 1.00e-03 (trainer alone 0)." in text
    assert "Control" not in text and "One scale" not in text and "Least mismatch" not in text


def _audit_metrics(e: str, dlogp_max: float, **extra) -> dict:
    return {f"{e}/abs_dlogp_max": dlogp_max, f"{e}/abs_dlogp_mean": dlogp_max / 10,
            f"{e}/abs_dlogp_mean_ci_low": dlogp_max / 20, f"{e}/abs_dlogp_mean_ci_high": dlogp_max / 5,
            f"{e}/k3_mean": dlogp_max ** 2, f"{e}/clip_frac": 0.0125, f"{e}/n_tokens": 256, **extra}


def test_an_audited_engines_bullet_says_raw_logprobs_flags_and_the_archived_trainer_only_when_so():
    from rlwb.experiments.wording import audit as W10

    m = _audit_metrics("srv", 0.5, **{"srv/abs_dlogp_raw_mean": 2e-6})
    (plain,) = W10.engine_lines(m, "srv", 0.7, reports_raw=False, panel=None)
    assert plain.startswith("- `srv`: max |Δlogp| = 5.00e-01, mean = 5.00e-02 [2.50e-02, 1.00e-01], k3 = 2.50e-01")
    assert plain.endswith("clip fraction 1.2% over 256 tokens.")
    raw = W10.engine_lines(m, "srv", 0.7, reports_raw=True, panel=None)[1]
    assert "*raw* (T = 1, untruncated) ones (mean gap to those 2.0e-06)" in raw and "at T = 0.7;" in raw
    flag = {"framework": "verl", "metric": "rollout_corr/kl", "value": 0.25, "alert": "above", "threshold": 0.1}
    flagged = W10.engine_lines(m, "srv", 0.7, False, {"flagged": [flag], "thresholds": 5})[1]
    assert flagged == "  Flagged on the dashboards: verl `rollout_corr/kl` = 0.25 (alerts when > 0.1)."
    quiet = W10.engine_lines(m, "srv", 0.7, False, {"flagged": [], "thresholds": 5})[1]
    assert quiet == "  No framework's threshold is crossed (5 thresholds checked)."
    rescored = W10.engine_lines({**m, "srv/vs_archived_trainer_abs_dlogp_max": 0.0}, "srv", 0.7, False, None)
    assert rescored[-1] == "  This trainer vs the archived run's trainer, same tokens: max |Δlogp| = 0."
    assert W10.alert_text("abs above", 0.1) == "|x| > 0.1" and W10.alert_text("above", NAN) == "–"


def test_the_audit_conclusion_names_its_source_trainer_and_the_float_floor():
    from rlwb.experiments.wording import audit as W10

    run = {"source": {"kind": "prompts file", "path": "/x/mine.jsonl", "sha256": "ab" * 32, "rows": 3},
           "trainer": {"kind": "hf", "dtype": "float32", "attn_implementation": "eager"}, "samples_per_prompt": 2,
           "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16}
    m = {**_audit_metrics("a", 5e-5), **_audit_metrics("b", 0.5)}
    text = W10.conclusion(m, {"run": run, "engines": {"a": {"reports_raw": False, "panel": None},
                                                      "b": {"reports_raw": False, "panel": None}},
                              "temperature": 1.0, "floor": 1e-4, "at_floor": ["a"], "off_floor": ["b"]})
    assert text.startswith("**Setup.** 3 prompts from `mine.jsonl` (sha256 abababababab), 2 completion(s) each")
    assert "scored by rlwb's scorer (float32, eager attention)." in text
    assert "On-policy to float precision (max |Δlogp| ≤ 0.0001): `a`." in text
    assert "Off the float floor: `b`: its importance ratios are not 1" in text
    archived = {**run, "source": {"kind": "archived run", "run_id": "r1", "notebook": "01_logprob_mismatch"},
                "trainer": {"kind": "command", "command": "python score.py"}}
    text = W10.conclusion({}, {"run": archived, "engines": {}, "temperature": 1.0, "floor": 1e-4, "at_floor": [],
                               "off_floor": []})
    assert text == ("**Setup.** The rollouts of archived run `r1` (01_logprob_mismatch) re-scored by the command "
                    "`python score.py`; the engines' logprobs are the archive's.\n\nIntervals: 95%, bootstrap over "
                    "completions.")


def test_the_audit_decides_raw_logprobs_and_the_floor_from_the_numbers():
    """The experiment's side of notebook 10's conclusion: an engine off the floor whose logprobs match the trainer's
    raw ones is said to report raw logprobs; at the floor it is not (nothing to explain); flags come from the panel."""
    import pandas as pd

    from rlwb import params
    from rlwb.experiments import audit as E

    p = params.load("10_audit")
    src = {"kind": "prompts file", "path": "p.jsonl", "sha256": "0" * 64, "rows": 1}
    trainer = {"kind": "hf", "dtype": "float32", "attn_implementation": "eager"}
    m = {**_audit_metrics("raw", 0.5, **{"raw/abs_dlogp_raw_mean": 1e-6}),
         **_audit_metrics("floor", 5e-5, **{"floor/abs_dlogp_raw_mean": 1e-9})}
    panels = pd.DataFrame([
        {"engine": "raw", "framework": "verl", "metric": "kl", "value": 0.25, "alert": "above", "threshold": 0.1,
         "verdict": "flagged"},
        {"engine": "floor", "framework": "verl", "metric": "kl", "value": 0.0, "alert": "above", "threshold": 0.1,
         "verdict": "ok"},
        {"engine": "floor", "framework": "trl", "metric": "x", "value": 0.0, "alert": None, "threshold": None,
         "verdict": "no threshold"}])
    text = E.conclusion(m, p, ["raw", "floor"], panels, src, trainer)
    assert text.count("*raw* (T = 1, untruncated)") == 1 and "Flagged on the dashboards: verl `kl` = 0.25" in text
    assert "No framework's threshold is crossed (1 thresholds checked)." in text
    assert "(max |Δlogp| ≤ 0.0001): `floor`." in text and "Off the float floor: `raw`:" in text
    far = E.conclusion({**m, "raw/abs_dlogp_raw_mean": 0.05}, p, ["raw", "floor"], panels, src, trainer)
    assert "*raw*" not in far  # the raw logprobs are as far from the engine's as the processed ones
    exact = E.conclusion({**m, "floor/abs_dlogp_max": 0.0}, p, ["raw", "floor"], panels, src, trainer)
    assert "(max |Δlogp| ≤ 0.0001): `floor`." in exact  # bitwise the trainer's logprobs: at the floor, not unlisted


def test_the_02_answer_leads_with_the_engine_that_drifts_with_temperature_or_says_none_does():
    from rlwb.experiments.wording import kl_vs_temperature as W02
    from rlwb.experiments.wording import one_line

    labels = {(T, tp): f"T={T:g}" + (f",top_p={tp:g}" if tp < 1 else "") for T in (0.5, 1.0, 1.5) for tp in (1, 0.9)}
    m = {}
    for T in (0.5, 1.0, 1.5):
        for e, d in (("v1", 0.0 if T == 1 else 0.8 * T), ("hf", 2e-6)):
            m |= {f"{e}/{labels[T, 1]}/abs_dlogp_max": d, f"{e}/{labels[T, 1]}/k3_mean": d / 100 or 1e-14,
                  f"{e}/{labels[T, 1]}/analytic_abs_err_max": 3e-6}
        m[f"hf+trainer_no_renorm/{labels[T, 0.9]}/k3_mean"] = 2e-4 * T
    ans = one_line(W02.conclusion(m, ["hf", "v1"], [0.5, 1.0, 1.5], [1.0, 0.9], labels, off=["v1"],
                                  explained=["v1"], floor=["hf"], truncation={0.9: ["hf"]}), limit=1000)
    assert ans.startswith("v1 drifts with T: k3 4.0e-03 at T=0.5, 1.2e-02 at T=1.5 (max |Δlogp| 0.40, 1.20), "
                          "matching raw logprobs' analytical log ratio to 3.0e-06; hf stays at the float floor")
    assert "does not renormalise under top_p=0.9 is off by k3 up to 3.0e-04 (hf, T=1.5" in ans
    none = one_line(W02.conclusion(m, ["hf", "v1"], [0.5, 1.0, 1.5], [1.0], labels, off=[], floor=["hf", "v1"]))
    assert none.startswith("No engine drifts with T: hf, v1 stay at the float floor at every T (max |Δlogp| 1.2e+00")
    odd = one_line(W02.conclusion(m, ["v1"], [0.5, 1.0, 1.5], [1.0], labels, off=["v1"], explained=[]))
    assert odd.startswith("v1 is off the float floor") and "does not account for" in odd


def test_the_04_answer_leads_with_the_stale_cache_and_batch_invariance_or_says_there_is_none():
    from rlwb.experiments.wording import determinism_and_staleness as W04
    from rlwb.experiments.wording import one_line

    def eng(e, inv, stale, reset, rerun=1.0):
        return {f"{e}/batch_invariant_frac": inv, f"{e}/prefix_caching": 1.0, f"{e}/batch_max_abs_dlogp": 0.0,
                f"{e}/rerun_identical_frac": rerun, f"{e}/stale_cache_abs_dlogp_max": stale,
                f"{e}/after_reset_abs_dlogp_max": reset}

    m = eng("v1", 1.0, 0.25, 2e-6) | eng("v0", 0.5, 2e-6, 2e-6)
    ans = one_line(W04.conclusion(m, ["v0", "v1"], 8, stale=["v1"], reset_fixes=["v1"], fresh=["v0"],
                                  variant=["v0"], invariant=["v1"]))
    assert ans.startswith("Stale prefix cache after an in-flight weight update: v1 max |Δlogp| vs the trainer 2.5e-01 "
                          "without a reset, 2.0e-06 after reset_prefix_cache(). v0: no stale cache. Greedy requests "
                          "bitwise identical alone vs in a batch of 8: v0 50%; v1 100%.")
    m = eng("v1", 1.0, 0.25, 0.25, rerun=0.5)
    worse = one_line(W04.conclusion(m, ["v1"], 8, stale=["v1"], fresh=[], invariant=["v1"], rerun_differs=["v1"]))
    assert "(still off the float floor)" in worse and "100% for every engine" in worse
    assert "Seeded reruns differ: v1 (50% identical)" in worse
    m = eng("v1", 1.0, 3e-6, 3e-6)
    assert one_line(W04.conclusion(m, ["v1"], 8, fresh=["v1"], invariant=["v1"])).startswith(
        "No engine served a stale prefix cache after an in-flight weight update (max |Δlogp| vs the trainer 3.0e-06")


def test_the_05_answer_leads_with_the_engines_that_fail_the_validator_or_says_every_one_passes():
    from rlwb.experiments.wording import one_line

    def eng(e, rate, press=None, long=1e-6):
        return {f"{e}/validate_pass_rate": rate, f"{e}/validate_cases": 50, f"{e}/validate_pass_rate_ci_low": rate / 2,
                f"{e}/validate_pass_rate_ci_high": 1.0, f"{e}/validate_worst_abs_dlogp": 1.0,
                f"{e}/longctx_max_position": 99, f"{e}/longctx_abs_dlogp_max": long,
                f"{e}/longctx_dist_abs_dlogp_max": NAN, f"{e}/longctx_max_near": 1e-6, f"{e}/longctx_max_far": 1e-6,
                f"{e}/longctx_abs_dlogp_mean": 1e-7, f"{e}/longctx_abs_dlogp_mean_ci_low": 0.0,
                f"{e}/longctx_abs_dlogp_mean_ci_high": 1e-7}

    m = eng("v1", 0.5) | eng("hf", 1.0)
    ans = one_line(W05.conclusion(m, ["hf", "v1"], 0.001, failing=["v1"], passing=["hf"], shrunk={"v1": "1 request"},
                                  longctx_floor=["hf", "v1"]), limit=1000)
    assert ans.startswith("Fail the validator: v1 50% of 50 cases within 0.001 (95% CI 25%-100%). Pass: hf. Long "
                          "context keeps every engine checked at the float floor. v1's shrunk failing case: 1 request.")
    m = eng("v1", 1.0, long=0.5) | eng("hf", 1.0)
    ok = one_line(W05.conclusion(m, ["hf", "v1"], 0.001, passing=["hf", "v1"], longctx_off=["v1"],
                                 longctx_floor=["hf"]))
    assert ok.startswith("Every engine passes the validator (hf, v1: every case within 0.001). Off the float floor "
                         "under long context: v1 (max |Δlogp| 5.0e-01).")


def test_the_07_answer_leads_with_the_verdicts_per_level_or_says_none_could_be_tested():
    import pandas as pd

    from rlwb.experiments.wording import which_correction as W07

    rank = pd.DataFrame({"level": ["raw", "raw", "raw", "bf16"], "correction": ["icepop", "geo", "none", "icepop"],
                         "gap": [0.01, -0.25, -0.05, 0.0],
                         "verdict": ["recovers", "falls short", "inconclusive", "inconclusive"]})
    assert W07.finding(rank, ["raw", "bf16"], 0.05) == ("`raw`: recovers `icepop` (+0.010), falls short `geo` "
                                                        "(-0.250), 1 inconclusive; `bf16`: 1 inconclusive.")
    none = W07.finding(rank.assign(verdict=["inconclusive"] * 3 + ["falls short"]), ["raw", "bf16"], 0.05)
    assert none.startswith("No correction is shown to recover the baseline (within ±0.05) at any mismatch level. "
                           "`raw`: 3 inconclusive; `bf16`: falls short `icepop` (+0.000).")
    assert W07.finding(rank.assign(verdict="n/a"), ["raw", "bf16"], 0.05).startswith("No correction could be tested")
    assert W07.finding(rank, [], 0.05).startswith("No mismatch level ran")


def test_08s_doses_text_keeps_an_intended_doses_two_digits():
    """A ratio dose of k3 1.5e-3 (the one matched to V1's k3) was printed as "2e-03 →" beside its measured 1.50e-03."""
    import pandas as pd

    from rlwb.experiments.wording.mismatch_cost import doses_text

    first = pd.DataFrame([{"kind": "ratio", "label": "ratio@0.0015", "dose": 0.0015, "k3_intended": 0.0015,
                           "k3_achieved": 0.0015022, "sigma": 0.055, "k1_achieved": 0.0, "achieved": True}])
    text = doses_text(first, [{"name": "ratio", "title": "ratio mismatch", "intended_k3": True,
                               "intended_words": "", "dose_words": ""}])
    assert "1.5e-03 → 1.50e-03" in text and "2e-03" not in text
