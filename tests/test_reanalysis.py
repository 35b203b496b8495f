"""`rlwb run --reanalyze RUN_DIR`: a run that trains nothing and redoes a finished run's analysis from its data with
today's code, so a fixed analysis becomes a run of record of the same data at the commit that holds it. The
runner checks the source before any kernel starts (`archive.reanalysis_check`); the kernel's experiment reads it
through `Run.reanalyzes`. The whole path on a real finished study: tests/test_notebooks.py, notebook 08's smoke
check (`check_reanalysis`)."""

import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from rlwb import archive, runner
from rlwb import params as params_mod
from rlwb.errors import ParamError
from rlwb.experiments.mismatch_cost import RUN_COLUMNS
from rlwb.experiments.mismatch_study.design import TrainingRun

NB = "08_mismatch_cost"
ENV = {"python": "3.12.3", "packages": {"rlwb": "0.1", "torch": "2.9.0"},
       "host": {"cpu": "AMD EPYC 9654", "cores": 2, "gpu": None, "platform": "Linux"}}


def finished(root: Path, name: str, p, **rec) -> Path:
    d = root / NB / name
    (d / "data").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "ok", "notebook": NB, "run_id": name, "git_commit": "a" * 40,
                                            "git_dirty": False, "model": {"weights_sha256_16": "ab12"},
                                            "engines": {"vllm-v1-fixed": {"vllm_version": "0.11.0"}}, **ENV,
                                            "duration_s": 3600.0, "time_s": {"training": 1800.0},
                                            "started_at": "t0", "finished_at": "t1",
                                            "resume": {"from": None, "jobs": 9, "parts": {"src": {
                                                "jobs": 9, "wall_s": 20.5, "host": {"cpu": "AMD EPYC 9654",
                                                                                    "gpu": None}}}},
                                            **rec}))
    (d / "params.yaml").write_text(yaml.safe_dump(p.to_dict(), sort_keys=False))
    return d


def test_a_reanalysis_is_refused_unless_it_reads_a_finished_run_of_the_same_params(tmp_path, monkeypatch):
    """Another commit and another environment are allowed (nothing trains: that is what a reanalysis is for) and
    named in the record; everything else is refused with its reason, before any kernel starts: an unfinished run
    (it resumes instead), other params, a dirty or unknown tree on either side, another notebook's run, a directory
    that is no run, a notebook whose experiment cannot reanalyse, resume and reanalyse at once; the model build as
    the kernel resolves it. Catches a check that lets another computation's data pass as this one's, or that
    refuses the commit change it exists for."""
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: pytest.fail("a kernel started"))
    p = params_mod.load(NB, [], {"num_seeds": 2, "steps": 2})
    src = finished(tmp_path, "src", p)
    here = {"git_commit": "b" * 40, "git_dirty": False, **ENV, "python": "3.13.0"}
    (src / "data" / "curves.parquet").write_bytes(b"")
    again = archive.reanalysis_check(src, NB, p, here, reads=("curves",))
    training = {"run_id": "src", "commit": "a" * 40, "host": "AMD EPYC 9654", "duration_s": 3600.0,
                "time_s": {"training": 1800.0}, "jobs": 9,
                "parts": {"src": {"jobs": 9, "job_s": 20.5, "host": {"cpu": "AMD EPYC 9654", "gpu": None}}},
                "chain": [{"run_id": "src", "status": "ok", "started_at": "t0", "finished_at": "t1",
                           "duration_s": 3600.0}]}
    assert again == {"from": str(src.resolve()), "training": training, "via": [], "defaulted": {}}
    # each part the study ran as, with its own duration: the run it resumed, where it is archived beside it
    part = finished(tmp_path, "part", p, status="failed", duration_s=1200.0)
    archive.update_record(src, resume={**json.loads((src / "run.json").read_text())["resume"], "from": str(part)})
    chain = archive.reanalysis_check(src, NB, p, here)["training"]["chain"]
    assert [(c["run_id"], c["status"], c["duration_s"]) for c in chain] == [("src", "ok", 3600.0),
                                                                            ("part", "failed", 1200.0)]
    with pytest.raises(ParamError, match="no data/doses.parquet"):
        archive.reanalysis_check(src, NB, p, here, reads=("curves", "doses"))
    # a reanalysis of a reanalysis names the run that trained the data, and the reanalysis it read
    first = finished(tmp_path, "first", p, git_commit="b" * 40, reanalysis=again,
                     engines={"vllm-v1-fixed": {"vllm_version": "0.11.0", "from_run": "src"}})
    second = archive.reanalysis_check(first, NB, p, {**here, "git_commit": "c" * 40})
    assert second["training"] == training and second["via"] == [{"run_id": "first", "commit": "b" * 40}]
    assert archive.reanalysis_engines(first) == {"vllm-v1-fixed": {"vllm_version": "0.11.0", "from_run": "src"}}
    # a param added since the source ran: its file lacks it; at its neutral value (the schema's HASH_NEUTRAL: what
    # runs before it computed) it is the source's computation, named in the record; at any other it is refused
    legacy = finished(tmp_path, "legacy", p)
    (legacy / "params.yaml").write_text(yaml.safe_dump({k: v for k, v in p.to_dict().items() if k != "ppo_epochs"}))
    loaded = params_mod.load(NB, [legacy / "params.yaml"]).to_dict()
    neutral = type(p).HASH_NEUTRAL
    assert archive.reanalysis_check(legacy, NB, p, here, loaded, neutral=neutral)["defaulted"] == {"ppo_epochs": [1]}
    with pytest.raises(ParamError, match="param ppo_epochs: not in its params.yaml .* not known to compute"):
        archive.reanalysis_check(legacy, NB, p, here, loaded, neutral={})
    with pytest.raises(ParamError, match="param ppo_epochs: '\\(none\\)' there, \\[1\\] here"):
        archive.reanalysis_check(legacy, NB, p, here)  # the raw file: the runner always passes the loaded params
    assert archive.reanalysis_check(src, NB, params_mod.load(NB, [], {"num_seeds": 2, "steps": 2,
                                                                      "concurrent_runs": 1}), here)
    for args, what in (((src, NB, params_mod.load(NB, [], {"num_seeds": 3, "steps": 2}), here),
                        "param num_seeds: 2 there, 3 here"),
                       ((src, NB, p, {**here, "git_dirty": True}), "dirty here"),
                       ((src, NB, p, {**here, "git_dirty": None}), "unknown here"),
                       ((src, NB, p, {**here, "git_commit": None}), "here"),
                       ((src, "03_toy_grpo", p, here), "a run of 08_mismatch_cost, not 03_toy_grpo"),
                       ((tmp_path, NB, p, here), "not an archived run directory")):
        with pytest.raises(ParamError, match=what):
            archive.reanalysis_check(*args)
    for rec, what in (({"status": "failed"}, "status is 'failed'.*--resume-from"),
                      ({"git_dirty": True}, "dirty there")):
        with pytest.raises(ParamError, match=what):
            archive.reanalysis_check(finished(tmp_path, f"bad-{len(what)}", p, **rec), NB, p, here)
    # the runner: params are the source's (none given), refusals before the kernel
    out = tmp_path / "out"
    with pytest.raises(ParamError, match="01_logprob_mismatch cannot redo its analysis.*reanalyze: 08_mismatch_cost"):
        runner.run("01_logprob_mismatch", [], None, out, reanalyze=src)
    with pytest.raises(ParamError, match="one or the other"):
        runner.run(NB, [], None, out, resume_from=src, reanalyze=src)
    with pytest.raises(ParamError, match="not an archived run directory"):
        runner.run(NB, [], None, out, reanalyze=tmp_path)
    with pytest.raises(ParamError, match="param lr"):  # -p may not change the source's params
        runner.run(NB, [], {"lr": 1e-3}, out, reanalyze=src)
    assert not out.exists() or not list(out.rglob("run.json"))  # nothing archived by a refusal
    # in the kernel: the source once the model build is the same
    new = finished(tmp_path, "new", p, reanalysis={"from": str(src)})
    assert archive.Run(new).reanalyzes == src and archive.Run(src).reanalyzes is None
    archive.update_record(new, model={"weights_sha256_16": "cd34"})
    with pytest.raises(ParamError, match="model weights checksum ab12 there, cd34 here"):
        _ = archive.Run(new).reanalyzes
    assert archive.reanalysis_engines(src) == {"vllm-v1-fixed": {"vllm_version": "0.11.0", "from_run": "src"}}
    assert sorted(RUN_COLUMNS) == sorted(f.name for f in fields(TrainingRun) if f.name != "steps")  # `+long` labels


def test_the_notebooks_that_reanalyse_are_the_ones_whose_experiment_can():
    """The registry's `reanalyzes` is true exactly where the experiment's `run` takes `reanalyzing` (what the notebook
    passes `Run.reanalyzes` to). Catches a notebook declared able whose experiment would train anyway, or one able
    that the runner refuses."""
    import inspect

    from rlwb.registry import NOTEBOOKS

    for stem, nb in NOTEBOOKS.items():
        assert ("reanalyzing" in inspect.signature(nb.experiment().run).parameters) == nb.reanalyzes, stem
    assert NOTEBOOKS[NB].reanalyzes


def test_the_index_says_whose_data_a_reanalysis_analysed_and_what_training_took():
    """The runs index shows a reanalysis's own seconds with what they are not: the training run it analysed again and
    the sum of its parts' durations. Catches a reanalysis listed as if its minute were the study's wall time."""
    from rlwb.reports.index import reanalysis_note

    again = {"training": {"run_id": "20261127-073912-69f6476f", "commit": "665b5d7559",
                          "chain": [{"duration_s": 4101.1}, {"duration_s": 3451.3}]}}
    assert reanalysis_note(again) == "reanalysis of 20261127-073912-69f6476f (commit 665b5d7, 7552 s to train)"
    assert reanalysis_note(None) == ""


def test_a_record_names_the_run_it_reads_as_the_repository_does(tmp_path, tmp_path_factory, monkeypatch):
    """A run of record ships in the repository: the run it reanalysed or resumed is named repo-relatively (no one
    machine's checkout in a committed record), and read back from anywhere, the notebook kernel's `notebooks/`
    included; outside the repository the path stays absolute. Catches a record that writes `/work/...` or a reader
    that resolves a relative name against its working directory, or a chain cut short read from another checkout."""
    from rlwb import paths

    p = params_mod.load(NB, [], {"num_seeds": 2, "steps": 2})
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path)  # after the params: their engines' venvs are the real repo's
    src = finished(tmp_path / "outputs", "src", p)
    part = finished(tmp_path / "outputs", "part", p, status="failed", duration_s=1200.0)
    archive.update_record(src, resume={**json.loads((src / "run.json").read_text())["resume"],
                                       "from": paths.shown(part)})
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    here = {"git_commit": "b" * 40, "git_dirty": False, **ENV}
    again = archive.reanalysis_check(src, NB, p, here)
    assert again["from"] == f"outputs/{NB}/src"
    assert [c["run_id"] for c in again["training"]["chain"]] == ["src", "part"]
    resumed = finished(tmp_path / "outputs", "resumed", p, resume={"from": f"outputs/{NB}/part"})
    assert archive.Run(resumed).resumes == part
    elsewhere = finished(tmp_path_factory.mktemp("elsewhere"), "src", p)
    assert archive.reanalysis_check(elsewhere, NB, p, here)["from"] == str(elsewhere.resolve())
    # read from another checkout (a worktree: its REPO_ROOT another), the run resumed from is found beside it
    monkeypatch.setattr(paths, "REPO_ROOT", tmp_path_factory.mktemp("worktree"))
    assert [c["run_id"] for c in archive.reanalysis_check(src, NB, p, here)["training"]["chain"]] == ["src", "part"]
