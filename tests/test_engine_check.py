"""`rlwb engines check` holds each preset to what its running engine reports it is (fp32 processed: the float
floor; fp32 raw: the raw gap; bf16: a low-precision band), lists presets whose environment is not installed
without failing, and exits 1 when something is wrong: a preset that cannot start or misses its expectation."""

import json

import pytest

from rlwb.engine_check import verdict
from rlwb.engines.worker import expected_agreement as expectation
from tests.conftest import rlwb


def test_expectation_follows_the_read_back_settings():
    assert expectation({"dtype": "float32", "kv_cache_dtype": "auto"}, raw=False) == "float floor"
    assert expectation({"dtype": "float32", "kv_cache_dtype": "auto"}, raw=True) == "raw gap"
    assert expectation({"dtype": "bfloat16"}, raw=False) == "low-precision band"
    assert expectation({"dtype": "float32", "kv_cache_dtype": "fp8_e5m2"}, raw=False) == "low-precision band"


def test_each_expectation_can_fail():
    """The numbers a wrong engine produces fail their rule: an fp32 engine off the floor, a raw engine with no gap
    (processed logprobs while it claims raw), a bf16 engine with a temperature-sized error."""
    floor = {"max_abs_dlogp": 2e-6, "max_abs_dlogp_vs_raw": 2e-6, "k3_mean": 1e-13, "k3_mean_vs_raw": 1e-13}
    off = {**floor, "max_abs_dlogp": 0.4, "k3_mean": 3e-4}
    assert verdict("float floor", {1.0: floor, 0.7: floor})[0]
    assert not verdict("float floor", {1.0: floor, 0.7: off})[0]
    raw_at_07 = {**floor, "max_abs_dlogp": 0.4}  # off the processed logprobs, on the raw ones
    assert verdict("raw gap", {1.0: floor, 0.7: raw_at_07})[0]
    assert not verdict("raw gap", {1.0: floor, 0.7: floor})[0]  # no gap: not what a raw engine reports
    bf16 = {**floor, "max_abs_dlogp": 0.03, "k3_mean": 2e-5, "raw": False}
    assert verdict("low-precision band", {1.0: bf16, 0.7: bf16})[0]
    assert not verdict("low-precision band", {1.0: bf16, 0.7: {**bf16, "k3_mean": 3e-3}})[0]


@pytest.mark.engines
def test_engines_check_passes_a_correct_install_and_fails_a_broken_preset(default_model, tmp_path):
    presets = tmp_path / "presets.yaml"
    presets.write_text("not-installed:\n  extends: vllm-v1-fixed\n  python: /nonexistent/bin/python\n"
                       "cannot-start:\n  extends: vllm-v1-fixed\n  vllm_kwargs: {max_model_len: 100000000}\n")
    env = {"RLWB_ENGINE_PRESETS": str(presets)}
    r = rlwb("engines", "check", "vllm-v1", "vllm-v1-bf16", "vllm-v1-fixed", "not-installed", "--json", env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert {k: (v["status"], v["expected"]) for k, v in rows.items()} == {
        "vllm-v1": ("ok", "raw gap"), "vllm-v1-bf16": ("ok", "low-precision band"),
        "vllm-v1-fixed": ("ok", "float floor"), "not-installed": ("not installed", None)}
    assert rows["vllm-v1"]["max_abs_dlogp_T0.7"] > 1e-4 > rows["vllm-v1-fixed"]["max_abs_dlogp_T0.7"]
    # one preset that cannot start fails the call beside one that does not fail it (not installed: a row, no engine
    # start; the passing engines' rows are the call above's)
    r = rlwb("engines", "check", "not-installed", "cannot-start", env=env)
    assert r.returncode == 1
    assert "cannot-start" in r.stdout and "FAILED" in r.stdout and "max_model_len" in r.stdout
    assert "not-installed" in r.stdout and "not installed" in r.stdout
