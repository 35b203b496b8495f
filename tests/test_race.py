"""Notebook 07's ranking and verdicts on hand-made curves (the real race runs in test_notebooks' smoke test)."""

import numpy as np
import pandas as pd
import pytest

from rlwb import params as P
from rlwb.core.correction_catalog import HEALTH
from rlwb.errors import ParamError
from rlwb.experiments import which_correction as W


def curves(final: dict, steps: int = 10) -> pd.DataFrame:
    """`final[(engine, correction)]` = per-seed reward held flat over the steps."""
    rows = []
    for (e, c), per_seed in final.items():
        for seed, r in enumerate(per_seed):
            for s in range(steps):
                rows.append({"step": s, "engine": e, "correction": c, "seed": seed, "reward_mean": r,
                             "mismatch_k3": 1e-3, "t_step": 0.5, "t_correction": 1e-4,
                             **{h: (0.5 if c == "x.mask" else 1.0) if h == "ess" else 0.0 for h in HEALTH}})
    return pd.DataFrame(rows)


def test_ranking_verdicts_and_separation():
    p = P.load("07_which_correction", overrides={"engines": ["vllm-v1-fixed", "vllm-v1-raw"],
                                                  "corrections": ["none", "tis", "icepop"], "num_seeds": 4})
    c = curves({("vllm-v1-fixed", "none"): [0.80, 0.82, 0.78, 0.80],
                ("vllm-v1-raw", "none"): [0.81, 0.80, 0.79, 0.82],  # within noise of the baseline
                ("vllm-v1-raw", "tis"): [0.60, 0.63, 0.58, 0.61],  # clearly short of it
                ("vllm-v1-raw", "icepop"): [0.81, 0.84, 0.77, 0.82]})
    m = W.race_metrics(c, p)
    assert m["vllm-v1-fixed+none/gap"] == 0
    assert m["vllm-v1-raw+tis/gap"] == pytest.approx(-0.195)
    r = W.ranking(m, c, p)
    raw = r[r["level"] == "vllm-v1-raw"].set_index("correction")
    assert list(raw.index) == ["icepop", "none", "tis"]  # by final reward
    assert raw.loc["tis", "verdict"] == "falls short" and raw.loc["tis", "vs_best"] == "worse than best"
    assert raw.loc["none", "verdict"] == "recovers" and raw.loc["none", "vs_best"] == "not separated"
    assert raw.loc["icepop", "vs_best"] == "best"
    text = W.conclusion(m, r, p)
    assert "fall short (whole CI below 0): `tis (removes 0% of tokens, ESS 1.00)`" in text
    assert "do not separate `none` from the best" in text
    assert m["vllm-v1-raw+none/same_as_baseline"] == 0 and "exactly as the baseline" not in text
    base = [0.80, 0.82, 0.78, 0.80]  # an uncorrected level that trains exactly as the baseline
    same = curves({("vllm-v1-fixed", "none"): base, ("vllm-v1-raw", "none"): base, ("vllm-v1-raw", "tis"): base})
    m = W.race_metrics(same, p)
    assert m["vllm-v1-raw+none/same_as_baseline"] == 1
    assert "exactly as the baseline" in W.conclusion(m, W.ranking(m, same, p), p)

def test_one_seed_gives_no_verdict():
    p = P.load("07_which_correction", overrides={"engines": ["vllm-v1-fixed", "vllm-v1-raw"],
                                                  "corrections": ["none", "tis"], "num_seeds": 1})
    c = curves({("vllm-v1-fixed", "none"): [0.8], ("vllm-v1-raw", "none"): [0.7], ("vllm-v1-raw", "tis"): [0.6]})
    m = W.race_metrics(c, p)
    r = W.ranking(m, c, p)
    assert set(r.loc[r["level"] == "vllm-v1-raw", "verdict"]) == {"n/a"} and np.isnan(m["vllm-v1-raw+tis/gap_ci_low"])
    assert "every verdict is n/a" in W.conclusion(m, r, p)


def test_params_need_none_and_no_duplicates():
    with pytest.raises(ParamError, match="must include 'none'"):
        P.load("07_which_correction", overrides={"corrections": ["tis"]})
    with pytest.raises(ParamError, match="lists an entry twice"):
        P.load("07_which_correction", overrides={"engines": ["vllm-v1-fixed", "vllm-v1-fixed"]})
    with pytest.raises(ParamError, match="not allowed"):
        P.load("07_which_correction", overrides={"corrections": ["none", "verl.nope"]})
