"""The run archive and `rlwb run`, end to end on notebook 00 (the real notebook, real papermill)."""

import json
import os
import subprocess
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


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=rlwb-test", "-c", "user.email=test@rlwb", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def test_git_dirty_counts_untracked_source_but_not_ignored_outputs(tmp_path):
    """A run's `git_dirty` on a repository made here: a new source file that git does not ignore makes the tree dirty
    (the run may import code its commit does not have, and `rlwb publish` must refuse it), as do a changed or staged
    file; what .gitignore keeps out (outputs/, caches) does not."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    assert archive.git_info(repo) == {"git_commit": None, "git_dirty": None}  # no commit: nothing to name
    (repo / ".gitignore").write_text("outputs/*\n!outputs/README.md\n__pycache__/\n")
    (repo / "mod.py").write_text("X = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a commit")
    assert archive.git_info(repo) == {"git_commit": _git(repo, "rev-parse", "HEAD"), "git_dirty": False}

    (repo / "outputs" / "bench" / "20261126-000000").mkdir(parents=True)  # runs and caches: ignored
    (repo / "outputs" / "bench" / "20261126-000000" / "run.json").write_text("{}")
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    assert archive.git_info(repo)["git_dirty"] is False

    (repo / "helper.py").write_text("Y = 2\n")  # untracked, not ignored: code the commit does not have
    assert archive.git_info(repo)["git_dirty"] is True
    (repo / "helper.py").unlink()
    (repo / "pkg").mkdir()  # in a new folder too
    (repo / "pkg" / "new.py").write_text("Z = 3\n")
    assert archive.git_info(repo)["git_dirty"] is True
    (repo / "pkg" / "new.py").unlink()
    (repo / "outputs" / "README.md").write_text("not ignored\n")  # the one file outputs/ does not ignore
    assert archive.git_info(repo)["git_dirty"] is True
    (repo / "outputs" / "README.md").unlink()
    assert archive.git_info(repo)["git_dirty"] is False

    (repo / "mod.py").write_text("X = 2\n")  # a tracked file changed, then staged
    assert archive.git_info(repo)["git_dirty"] is True
    _git(repo, "add", "mod.py")
    assert archive.git_info(repo)["git_dirty"] is True


def test_the_kernel_imports_the_rlwb_of_the_checkout_that_runs_it(tmp_path):
    """A worktree or second clone sharing one .venv: `pip install -e` points `rlwb` at another checkout. The kernel's
    PYTHONPATH (runner.kernel_pythonpath) must win over that, or run.json names one commit while another's code ran.
    A stand-in checkout (a package named rlwb in tmp_path) shows which one a fresh interpreter imports."""
    import sys

    from rlwb.runner import kernel_pythonpath

    other = tmp_path / "other-checkout"
    (other / "rlwb").mkdir(parents=True)
    (other / "rlwb" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": kernel_pythonpath(other, os.environ.get("PYTHONPATH"))}
    out = subprocess.run([sys.executable, "-c", "import rlwb; print(rlwb.__file__)"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out) == other / "rlwb" / "__init__.py"
    assert kernel_pythonpath(other, "/x").split(os.pathsep) == [str(other), "/x"]  # the caller's path kept, after
