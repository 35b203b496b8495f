"""`rlwb audit` and `rlwb rescore` as a user types them: a real vLLM server audited by URL, a server that fails
archived as a failure (never as a success), and an archived run re-scored by another trainer (a real command)."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import free_port, rlwb
from tests.test_notebooks import check_report
from tests.test_served import PROCESSED

pytestmark = [pytest.mark.engines, pytest.mark.slow]
SMOKE = ["-f", "params/10_audit/smoke.yaml"]
BF16_EAGER = f"{sys.executable} scripts/score_bf16_eager.py"


def _run_dir(r) -> Path:
    return Path(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def archived(audit_smoke_run):
    """One smoke audit of the vllm-v1-processed preset, archived: what `rescore` re-scores. The session's
    (tests/conftest.py `audit_smoke_run`: `rlwb audit -f params/10_audit/smoke.yaml`), which test_notebooks' smoke
    of notebook 10 checks."""
    return audit_smoke_run, audit_smoke_run.parents[1]


def test_a_served_engine_audited_by_url(vllm_server, tmp_path):
    url = vllm_server(*PROCESSED)
    r = rlwb("audit", "--model", "default", "--prompts", "params/10_audit/prompts_smoke.jsonl", "--engine", url,
             "-p", "temperature", "0.7", "-p", "max_tokens", "16", "--outputs", str(tmp_path), timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    d = _run_dir(r)
    info = json.loads((d / "run.json").read_text())
    port = url.split(":")[-1].split("/")[0]
    served = info["engines"][f"served:127.0.0.1:{port}"]
    assert served["server_version"] == "0.32.0" and served["echo"]["system_fingerprint"].startswith("vllm-0.32.0")
    m = json.loads((d / "metrics.json").read_text())
    assert m[f"served:127.0.0.1:{port}/abs_dlogp_max"] <= 1e-4
    check_report(d)
    assert "served vLLM 0.32.0" in (d / "report.html").read_text()


def test_a_server_that_cannot_be_reached_is_archived_as_failed_with_one_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    r = rlwb("audit", *SMOKE, "--engine", url, "--outputs", str(tmp_path), timeout=600)
    assert r.returncode == 1
    assert "cannot reach the server" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
    info = json.loads((_run_dir(r) / "run.json").read_text())
    assert info["status"] == "failed" and "cannot reach the server" in info["error"] and "\n" not in info["error"]
    assert not (tmp_path / "latest" / "10_audit").exists()  # a failure never becomes the latest run


def test_rescore_with_another_trainer_writes_a_run_that_names_its_source(archived, tmp_path):
    src, _ = archived
    r = rlwb("rescore", str(src), "--trainer", BF16_EAGER, "--outputs", str(tmp_path), timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    d = _run_dir(r)
    info = json.loads((d / "run.json").read_text())
    assert info["source"]["kind"] == "archived run" and info["source"]["run_id"] == src.name
    assert info["trainer"]["kind"] == "command" and "score_bf16_eager.py" in info["trainer"]["command"]
    m = json.loads((d / "metrics.json").read_text())
    # the engine's logprobs are the archive's; only the trainer changed, and bf16 moves it off the float floor
    assert m["vllm-v1-processed/vs_archived_trainer_abs_dlogp_max"] > 1e-4
    assert m["vllm-v1-processed/abs_dlogp_max"] > 1e-4
    before = pd.read_parquet(src / "data" / "rollouts.parquet")
    after = pd.read_parquet(d / "data" / "rollouts.parquet")
    assert after["logp_engine"].tolist() == before["logp_engine"].tolist()
    assert f"re-scored from run <code>{src.name}</code>" in (d / "report.html").read_text()


def test_the_same_trainer_rescores_the_archive_bitwise(archived, default_model):
    """The experiment itself (what `rlwb rescore` runs in its kernel), with rlwb's fp32 scorer: the archived trainer
    logprobs come back bit for bit from the archived prompts, tokens and sampling settings alone."""
    from rlwb import params
    from rlwb.experiments import audit

    src, _ = archived
    p = params.load("10_audit", [], {"rollouts_from": str(src), "prompts_file": "", "engines": []})
    result = audit.run(p, default_model.path, progress=False)
    assert result.metrics["vllm-v1-processed/vs_archived_trainer_abs_dlogp_max"] == 0
    assert result.source["run_id"] == src.name and list(result.rollouts) == ["vllm-v1-processed"]


def test_rescore_refuses_what_is_not_a_run(tmp_path):
    r = rlwb("rescore", str(tmp_path), timeout=120)
    assert r.returncode == 2 and "not an archived run" in r.stderr

