"""How numbers read in reports, the CLI and the index: the float floor, counts, missing values."""

import math

import pandas as pd

from rlwb.formatting import DLOGP_FLOOR, KL_FLOOR, metric, number, table


def test_divergences_at_the_float_floor_never_read_negative():
    assert metric("hf/full_kl_mean", -3.4e-09) == "≤ 1e-08"
    assert metric("vllm-v0/k3_mean", 2e-10) == "≤ 1e-08"
    assert metric("vllm-v0/k3_mean_ci_low", -1e-12) == "≤ 1e-08"
    assert metric("vllm-v1/k3_mean", 7.8e-5) == "7.80e-05"  # above the floor: the value
    assert metric("vllm-v1/T=0.5/k3_mean", KL_FLOOR * 2) == "2.00e-08"


def test_signed_and_other_metrics_are_not_clamped():
    assert metric("hf/k1_mean", -3e-9) == "-3.00e-09"  # k1 is a signed estimator: its sign is information
    assert metric("hf/clip_frac", 0.0) == "0.00e+00"
    assert metric("hf/abs_dlogp_max", 0.0) == "0"  # bit-identical is a finding of its own
    assert metric("hf/abs_dlogp_max", 4e-8) == "≤ 1e-07" and DLOGP_FLOOR == 1e-7
    assert metric("hf/abs_dlogp_max", 2.4e-6) == "2.40e-06"
    # a difference is signed: a knob below its baseline reads negative, however large
    assert metric("bf16/delta_k3_mean", -1e-3) == "-1.00e-03" and metric("Δk3 vs baseline", 2e-5) == "2.00e-05"
    assert metric("x/delta_k3_mean", -7.5e-15) == "≈ 0" == metric("Δk3 vs baseline", 3e-9)  # both at the floor
    # the χ² estimate: floored near 0 (rounding), shown when clearly negative (sampling noise)
    assert metric("baseline/chi2_token", -7.45e-9) == "≤ 1e-06" and metric("bf16/chi2_token", -3.2e-4) == "-3.20e-04"


def test_numbers_counts_and_missing():
    assert number(None) == number(math.nan) == "–"
    assert number(803968.0) == "803,968" and number(0.52) == "0.52" and number("x") == "x"
    assert number(True) == "True"


def test_table_formats_by_column_or_metric_row_and_keeps_raw_values():
    df = pd.DataFrame({"k3_mean": [-3e-9, 0.012], "n_tokens": [1536.0, 1600.0]}, index=["hf", "vllm-v1"])
    html = table(df).to_html()
    assert "≤ 1e-08" in html and ">0.012<" in html and "1,536" in html and "-3" not in html
    assert df.loc["hf", "k3_mean"] == -3e-9  # the frame is untouched
    by_row = pd.DataFrame({"vllm-v1": [-1e-10, 0.5]}, index=pd.Index(["full_kl_mean", "clip_frac"], name="metric"))
    assert "≤ 1e-08" in table(by_row).to_html()
