"""The run archive and `rlwb run`, end to end on notebook 00 (the real notebook, real papermill)."""

import json
import os
from pathlib import Path

import pytest
import yaml

from rlwb import archive
from tests.conftest import rlwb

REPO = Path(__file__).resolve().parent.parent
SMOKE00 = ["notebooks/00_default_policy.ipynb", "-f", "params/00_default_policy/smoke.yaml"]


@pytest.mark.slow
def test_run_notebook_00_smoke_end_to_end(notebook00_runs, default_model):
    """The first of the session's three real runs of notebook 00 (tests/conftest.py `notebook00_runs`)."""
    outputs, (run_dir, _, newest) = notebook00_runs
    assert run_dir.parent == outputs / "00_default_policy"
    for f in archive.RUN_FILES:
        assert (run_dir / f).is_file(), f
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "ok" and info["error"] is None and info["seed"] == 0
    for key in ("started_at", "finished_at", "duration_s", "git_commit", "git_dirty", "python", "packages", "host"):
        assert key in info
    assert info["packages"]["torch"].startswith("2.")
    assert info["model"]["recipe_hash"] == default_model.card["recipe_hash"]
    m = json.loads((run_dir / "metrics.json").read_text())
    assert 0 <= m["policy/greedy_accuracy"] <= 1 and m["policy/params"] == default_model.card["params"]
    assert m["policy/mean_completion_tokens"] >= 8
    p = yaml.safe_load((run_dir / "params.yaml").read_text())
    assert p == {"seed": 0, "model": "default", "eval_prompts": 50, "sample_rows": 5, "rebuild": False}
    figures = {f.name for f in (run_dir / "figures").iterdir()}
    assert figures == {f"accuracy_by_digits.{x}" for x in ("png", "pdf", "svg")}
    assert (run_dir / "data" / "samples.parquet").stat().st_size > 0
    html = (run_dir / "report.html").read_text()
    assert "data:image/png;base64" in html and "Conclusion" in html
    assert run_dir.name.endswith("-" + __import__("rlwb.params").params.load(
        "00_default_policy", [REPO / "params/00_default_policy/smoke.yaml"], {"seed": 0}).hash())
    assert os.path.realpath(outputs / "latest" / "00_default_policy") == str(newest)  # the newest ok run
    assert not [d for d in (outputs / "00_default_policy").iterdir() if d.name.startswith(".tmp")]
    # the newest run's `-p` overrides reached the notebook and name its directory
    assert yaml.safe_load((newest / "params.yaml").read_text()) == {**p, "seed": 5, "eval_prompts": 20}
    assert json.loads((newest / "run.json").read_text())["seed"] == 5
    assert newest.name.endswith("-" + __import__("rlwb.params").params.load(
        "00_default_policy", [REPO / "params/00_default_policy/smoke.yaml"], {"seed": 5, "eval_prompts": 20}).hash())
    listing = rlwb("runs", "--outputs", str(outputs))
    assert run_dir.name in listing.stdout and "policy/greedy_accuracy" in listing.stdout


def test_unknown_param_fails_before_compute_naming_it(outputs):
    r = rlwb("run", *SMOKE00, "-p", "no_such_key", "1")
    assert r.returncode == 2
    assert "no_such_key" in r.stderr
    assert not outputs.exists() or not any(outputs.rglob("run.json")), "nothing archived for rejected params"


def test_malformed_yaml_file_fails_with_file_and_line(outputs, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval_prompts: [1,\n")
    r = rlwb("run", "notebooks/00_default_policy.ipynb", "-f", str(bad))
    assert r.returncode == 2 and "bad.yaml:" in r.stderr and "malformed YAML" in r.stderr


def test_unknown_notebook(outputs):
    r = rlwb("run", "notebooks/99_nope.ipynb")
    assert r.returncode == 2 and "not found" in r.stderr


@pytest.mark.slow
def test_failed_run_is_archived_as_failed_and_never_latest(outputs, tmp_path):
    """A real failure inside the notebook: the model cache path is a file, so the build cell raises."""
    bad_cache = tmp_path / "not-a-dir"
    bad_cache.write_text("x")
    r = rlwb("run", *SMOKE00, env={"RLWB_CACHE": str(bad_cache)})
    assert r.returncode == 1
    run_dir = Path(r.stdout.strip().splitlines()[-1])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed"
    assert info["error"] and ("NotADirectoryError" in info["error"] or "FileExistsError" in info["error"])
    assert (run_dir / "notebook.ipynb").exists() and (run_dir / "report.html").exists()
    assert not (outputs / "latest" / "00_default_policy").exists()


def test_outputs_not_writable_fails_before_compute(tmp_path):
    ro = tmp_path / "ro"
    ro.write_text("a file, not a directory")
    r = rlwb("run", *SMOKE00, "--outputs", str(ro / "sub"))
    assert r.returncode == 2 and "not writable" in r.stderr


def test_metrics_must_be_flat_group_name_numbers(tmp_path):
    run = archive.Run(tmp_path / "r")
    run.log_metrics({"a/b": 1.0, "a/c": float("nan")})
    assert run.metrics == {"a/b": 1.0, "a/c": None}
    with pytest.raises(ValueError, match="group/name"):
        run.log_metrics({"flat": 1.0})
    with pytest.raises(ValueError, match="number"):
        run.log_metrics({"a/d": "high"})
