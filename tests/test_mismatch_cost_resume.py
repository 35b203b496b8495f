"""Notebook 08's study resumes job by job. Each finished job is kept at once in the run's job store
(`archive.Run.jobs()`, `rlwb.job_store`), a run with `resume_from` (a run option, `rlwb run --resume-from`, never a
param, checked by the runner before the kernel starts: `archive.resume_check`) reuses the finished jobs of an
interrupted run of the same computation and refuses any other, and `rlwb sweep --resume` finds a cell's unfinished
run. The slow test interrupts a tiny study on the real engines and checks the resumed study equals an
uninterrupted one."""

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from rlwb import archive, sweep
from rlwb.errors import ParamError
from rlwb.experiments import mismatch_cost as mc
from rlwb.experiments.mismatch_study import design, execution
from rlwb.job_store import JobStore, job_key
from rlwb.params.schemas.mismatch_cost import MismatchCostParams

NB = "08_mismatch_cost"

COMMIT = "c0ffee" * 6 + "c0ff"
ENV = {"python": "3.12.3", "packages": {"rlwb": "0.1", "torch": "2.9.0", "vllm": "0.11.0"},
       "host": {"cpu": "AMD EPYC 9654", "isa": "avx512", "cores": 2, "gpu": None,
                "platform": "Linux"}}  # run.json's environment


def run_dir(root: Path, name: str, p, status: str = "failed", **rec) -> Path:
    """An archived run's directory as `rlwb run` and `use_model` write it: run.json, params.yaml, data/."""
    d = root / "08_mismatch_cost" / name
    (d / "data").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": status, "notebook": "08_mismatch_cost", "run_id": name,
                                            "started_at": name, "git_commit": COMMIT, "git_dirty": False,
                                            "model": {"weights_sha256_16": "ab12"}, **ENV, **rec}))
    (d / "params.yaml").write_text(yaml.safe_dump(p.to_dict(), sort_keys=False))
    return d


def tiny(**kw) -> MismatchCostParams:
    return MismatchCostParams(**{"arms": ["none@engine", "none@trainer"], "ratio_k3": [0.01],
                                         "weight_noise": [], "stale_steps": [], "engine_points": [],
                                         "placebo_arms": [], "num_seeds": 2, "steps": 2, "prompts_per_step": 2,
                                         "group_size": 2, "max_tokens": 8, "policy_samples": 1,
                                         "concurrent_runs": 1, **kw})


def test_a_resume_is_refused_unless_it_is_the_same_computation(tmp_path):
    """Each difference is named, before any compute: params (bar concurrent_runs), the commit, a dirty tree on either
    side, the environment (python, each package, the host's CPU model, its instruction set and GPU, an environment
    either run did not record) before the kernel starts; the model build as the run opens its job store; an engine's
    versions as it starts, before any of its jobs trains. Catches a check that lets any of them through (a study resumed
    on another machine or after an upgrade would mix jobs of two computations), or one that refuses a mere change of
    host core count or platform string."""
    p = tiny()
    src = run_dir(tmp_path, "src", p)
    (src / "data" / "jobs").mkdir()
    here = {"git_commit": COMMIT, "git_dirty": False, "model": {"weights_sha256_16": "ab12"}, **ENV}
    assert archive.resume_check(src, NB, p, {**here, "host": {**ENV["host"], "cores": 64, "platform": "Linux-6"}})
    for change, what in (({"python": "3.12.4"}, "python '3.12.3' there, '3.12.4' here"),
                         ({"packages": {**ENV["packages"], "torch": "2.9.1"}}, "package torch 2.9.0 there, 2.9.1"),
                         ({"packages": {**ENV["packages"], "scipy": "1.16"}}, "package scipy \\(none\\) there"),
                         ({"packages": {}}, "packages recorded there, unrecorded here"),
                         ({"host": {**ENV["host"], "cpu": "Intel Xeon"}}, "host cpu 'AMD EPYC 9654' there"),
                         # the same CPU model on a host that exposes no AVX-512 (its kernels round otherwise)
                         ({"host": {**ENV["host"], "isa": "avx2"}},
                          "host cpu instruction set 'avx512' there, 'avx2' here"),
                         ({"host": {k: v for k, v in ENV["host"].items() if k != "isa"}},
                          "host cpu instruction set 'avx512' there, None here"),
                         ({"host": {**ENV["host"], "gpu": "NVIDIA H100"}}, "host gpu None there, 'NVIDIA H100'"),
                         ({"host": None}, "host cpu 'AMD EPYC 9654' there, None here")):
        with pytest.raises(ParamError, match=what):
            archive.resume_check(src, NB, p, {**here, **change})
    vllm = {"preset": "vllm-v1-fixed", "vllm_version": "0.11.0", "torch_version": "2.9.0", "dtype": "float32"}
    archive.update_record(src, engines={"vllm-v1-fixed": vllm})
    resumed = run_dir(tmp_path, "resumed", p, resume={"from": str(src)})
    run = archive.Run(resumed)
    run.record_engine({**vllm, "dtype": "float32", "gpu_memory_utilization": 0.3})  # settings: the params' business
    run.record_engine({"preset": "hf", "torch_version": "2.0"})  # no record there: none of its jobs reused
    assert len(run.record["engines"]) == 2
    for other, what in (({"vllm_version": "0.11.1"}, "engine vllm-v1-fixed vllm_version '0.11.0' there, '0.11.1'"),
                        ({"torch_version": None}, "torch_version '2.9.0' there, None here")):
        with pytest.raises(ParamError, match=what):
            run.record_engine({**vllm, **other})
    assert run.record["engines"]["vllm-v1-fixed"]["vllm_version"] == "0.11.0"  # a refused engine is not recorded
    kept = (src / "run.json").read_text()
    (src / "run.json").write_text("{not json")  # the source's record gone bad since the runner checked it
    with pytest.raises(ParamError, match="its record is gone or unreadable"):
        run.record_engine(vllm)
    (src / "run.json").write_text(kept)
    # an engine none of whose jobs is left: its record comes from the run resumed from, tagged as that run's
    todo = design.training_runs(p)
    store = JobStore(tmp_path / "jobs", "new", source_dir=src / "data" / "jobs",
                     source_record={"run_id": "src", "engines": {"vllm-v1-fixed": vllm}})
    assert execution.reused_engines(store, todo, dict.fromkeys(todo)) == [{**vllm, "from_run": "src"}]
    assert execution.reused_engines(store, todo, dict.fromkeys(todo[:-1])) == []  # one job left: started here
    assert archive.resume_check(src, NB, replace(p, concurrent_runs=2), here)["run_id"] == "src"
    for other, what in ((replace(p, lr=1e-4), "param lr"), (replace(p, ratio_k3=[0.1]), "param ratio_k3")):
        with pytest.raises(ParamError, match=what):
            archive.resume_check(src, NB, other, here)
    for change, what in (({"git_commit": "f" * 40}, "git commit"), ({"git_dirty": True}, "dirty here"),
                         ({"git_dirty": None}, "unknown here")):
        with pytest.raises(ParamError, match=what):
            archive.resume_check(src, NB, p, {**here, **change})
    assert archive.model_differences(archive.read_record(src), here) == []
    for model in ({"weights_sha256_16": "cd34"}, {"weights_sha256_16": None}, None):
        assert archive.model_differences(archive.read_record(src), {**here, "model": model})
        archive.update_record(resumed, model=model)
        with pytest.raises(ParamError, match="model weights checksum ab12 there"):
            run.jobs()
    dirty = run_dir(tmp_path, "dirty", p, git_dirty=True)
    (dirty / "data" / "jobs").mkdir()
    with pytest.raises(ParamError, match="dirty there"):
        archive.resume_check(dirty, NB, p, here)
    with pytest.raises(ParamError, match="kept no jobs"):
        archive.resume_check(resumed, NB, p, here)
    with pytest.raises(ParamError, match="is not an archived run directory"):
        archive.resume_check(tmp_path, NB, p, here)
    with pytest.raises(ParamError, match="does not resume from .* a run of 08_mismatch_cost"):
        archive.resume_check(src, "03_toy_grpo", p, here)


def test_a_dosed_run_finished_before_its_clean_twin_keeps_its_probe_for_the_resume(tmp_path):
    """Two lanes can finish a dosed run before its clean twin: its probe is kept until the twin's arrives, so the
    resumed study computes its KL to the twin exactly as an uninterrupted one; a KL already known is reused as a
    number (its probe dropped). Catches a store that keeps only KL values (the pending run's KL lost: NaN) or
    keys jobs by less than every field (the rerun taken for the first clean run)."""
    p = tiny()
    todo = design.training_runs(p)
    clean, dosed = todo[0], next(j for j in todo if j.kind == "ratio" and j.twin == todo[0].twin)
    rerun = todo[-1]
    assert rerun.kind == "rerun" and rerun.twin == clean.twin and job_key(rerun) != job_key(clean)
    assert len({job_key(j) for j in todo}) == len(todo)
    g = torch.Generator().manual_seed(0)
    probe = {j: torch.log_softmax(torch.randn(5, 7, generator=g), -1) for j in (clean, dosed, rerun)}
    src = run_dir(tmp_path, "src", p)
    store = JobStore(src / "data" / "jobs", "src")
    kl = execution.TwinKL(todo, store)
    store.put_shared("start", {"initial_heldout_greedy_acc": 0.25})
    for j in (dosed, rerun):  # finished before their twin (the interrupted run never finishes it)
        kl.add(j, probe[j])
        store.save(j, pd.DataFrame({"step": [0, 1], "label": j.label, "t_step": [1.0, 2.0]}), 3.0)
    assert (src / "data" / "jobs" / f"{job_key(dosed)}.probe.pt").exists()
    # the resume: the two reused, the clean twin trained now
    new = run_dir(tmp_path, "new", p)
    store2 = JobStore(new / "data" / "jobs", "new", source_dir=src / "data" / "jobs")
    kl2, start, done = execution.TwinKL(todo, store2), {}, {}
    assert set(execution.reuse(store2, todo, kl2, start, done)) == {dosed, rerun}
    assert start == {"initial_heldout_greedy_acc": 0.25} and done[dosed]["t_step"].tolist() == [1.0, 2.0]
    kl2.add(clean, probe[clean])
    want = execution.kl_divergence(probe[clean], probe[dosed])
    assert kl2.values[dosed] == want and kl2.values[rerun] == execution.kl_divergence(probe[clean], probe[rerun])
    kept = new / "data" / "jobs"
    assert json.loads((kept / f"{job_key(dosed)}.kl.json").read_text())["kl_to_clean"] == want
    assert not (kept / f"{job_key(dosed)}.probe.pt").exists()  # known now: its probe went
    assert (src / "data" / "jobs" / f"{job_key(dosed)}.probe.pt").exists()  # the source untouched
    # a resume of the resumed run reuses the KL as a number, and the clean run with its probe
    kl2.add(clean, probe[clean])
    store2.save(clean, pd.DataFrame({"step": [0, 1], "label": clean.label, "t_step": [1.0, 2.0]}), 1.0)
    third = JobStore(tmp_path / "third" / "data" / "jobs", "third", source_dir=new / "data" / "jobs")
    kl3, done3 = execution.TwinKL(todo, third), {}
    assert set(execution.reuse(third, todo, kl3, {}, done3)) == {clean, dosed, rerun}
    assert kl3.values[dosed] == want
    nowhere = {"cpu": None, "isa": None, "gpu": None}
    assert store2.provenance()["parts"] == {"src": {"jobs": 2, "wall_s": 6.0, "host": nowhere},
                                                     "new": {"jobs": 1, "wall_s": 1.0, "host": nowhere}}


def test_a_job_counts_as_kept_only_once_its_curve_is(tmp_path, monkeypatch):
    """`JobStore.save` writes the job's meta after its curve, and the provenance counts only metas with a
    curve: a run killed between the two files (or a curve that failed to write) counts no job it has not kept.
    Catches the meta written first, or a provenance that counts every meta."""
    todo = design.training_runs(tiny())
    store = JobStore(tmp_path / "jobs", "run", {"cpu": "x", "gpu": None, "cores": 2})
    df = pd.DataFrame({"step": [0, 1], "t_step": [1.0, 2.0]})
    store.save(todo[0], df, 2.0)

    def broken(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", broken)
    with pytest.raises(OSError):
        store.save(todo[1], df, 5.0)
    assert not (tmp_path / "jobs" / f"{job_key(todo[1])}.json").exists()
    (tmp_path / "jobs" / f"{job_key(todo[2])}.json").write_text(json.dumps({"run_id": "run", "wall_s": 9.0}))
    assert store.provenance()["parts"] == {"run": {"jobs": 1, "wall_s": 2.0,
                                                            "host": {"cpu": "x", "isa": None, "gpu": None}}}


def test_threads_of_one_process_write_one_json_file_safely(tmp_path):
    """`write_json`'s temporary file is its writer's own (process and thread), so threads updating one
    file (lanes recording run.json) never rename each other's half-written file or find theirs gone. Catches a
    temporary name shared by every thread of a process."""
    import threading

    from rlwb.jsonfile import read_json, write_json

    path, errors = tmp_path / "run.json", []

    def writer(i: int) -> None:
        try:
            for j in range(100):
                write_json(path, {"writer": i, "n": j, "pad": "x" * 20000})
        except Exception as e:  # noqa: BLE001 - any failure of a writer is the finding
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and read_json(path)["n"] == 99 and not list(tmp_path.glob(".*.tmp"))


def test_sweep_resume_finds_the_cells_unfinished_run(tmp_path, monkeypatch):
    """`rlwb sweep --resume` passes the run option `resume_from` for notebook 08 (never a cell param): the cell's
    unfinished run (failed, or a killed run's .tmp dir) with its params, on the current clean commit, with the most
    kept jobs. Catches a sweep that resumes from a finished run, another cell's run, another commit's or another
    environment's (which the runner would refuse, failing the cell at every rerun), or from nothing, or puts
    resume_from among the cell's params."""
    monkeypatch.setattr(sweep.archive, "git_info", lambda: {"git_commit": COMMIT, "git_dirty": False})
    cell = {"num_seeds": 2, "steps": 2}
    p = mc_params = MismatchCostParams(**cell)
    here = sweep.archive.start_record("08_mismatch_cost", "", p)
    this_env = {k: here[k] for k in ("python", "packages", "host")}

    def run_dir(root: Path, name: str, p, status: str = "failed", **rec) -> Path:  # a run of this environment
        return globals()["run_dir"](root, name, p, status, **{**this_env, **rec})

    def with_jobs(d: Path, n: int) -> Path:
        (d / "data" / "jobs").mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (d / "data" / "jobs" / f"j{i}.parquet").write_bytes(b"")
        return d

    assert sweep.unfinished_run("08_mismatch_cost", [], cell, tmp_path) is None
    with_jobs(run_dir(tmp_path, "20260101-000000-ok", p, status="ok"), 9)
    with_jobs(run_dir(tmp_path, "20260101-000001-other", replace(p, lr=1e-3)), 9)
    with_jobs(run_dir(tmp_path, "20260101-000002-oldcommit", p, git_commit="f" * 40), 9)
    with_jobs(run_dir(tmp_path, "20260101-000002-otherhost", p, **ENV), 9)  # another python, CPU and packages
    few = with_jobs(run_dir(tmp_path, "20260101-000003-few", replace(p, concurrent_runs=1)), 2)
    # a run archived when resume_from was a param: its params.yaml still holds it
    (few / "params.yaml").write_text(yaml.safe_dump({**replace(p, concurrent_runs=1).to_dict(), "resume_from": "x"}))
    assert sweep.unfinished_run("08_mismatch_cost", [], cell, tmp_path).endswith("few")
    killed = with_jobs(run_dir(tmp_path, ".tmp-20260101-000004-abc-999999999", mc_params, status="running"), 5)
    assert sweep.unfinished_run("08_mismatch_cost", [], cell, tmp_path) == str(killed)
    assert sweep.unfinished_run("01_logprob_mismatch", [], {}, tmp_path) is None  # does not resume
    g = sweep.Grid(notebook="08_mismatch_cost")
    c = {"id": "x", "overrides": dict(cell)}
    assert sweep.cell_resume(g, c, tmp_path, True, print) == str(killed)
    assert sweep.cell_resume(g, c, tmp_path, False, print) is None and c["overrides"] == cell


def test_resume_is_a_run_option_never_a_param(tmp_path, monkeypatch):
    """`rlwb run --resume-from` (runner.run's `resume_from`) is checked before the kernel starts and reaches the
    kernel as the run's record (`resume`, what `Run.jobs()` reads), never params.yaml or the params hash: a resumed
    run has the whole run's hash (one configuration for index, trends and compare), its params.yaml reloads after
    its source is deleted, and a rerun from it (what `rlwb rerun` does) does not resume. A params.yaml of a run
    archived when resume_from was a param still loads. Catches resume_from back among the params (hashed, archived,
    validated for existence on reload), a run not asked to resume that resumes, a source of other params let
    through to the kernel, or a notebook taking another notebook's run."""
    import shutil

    import papermill

    from rlwb import params as params_mod
    from rlwb import runner

    seen = []
    monkeypatch.setattr(papermill, "execute_notebook",  # the kernel: what it would be given
                        lambda *a, **k: seen.append((k["parameters"], archive.Run(Path(a[1]).parent).resumes)))
    monkeypatch.setattr(archive, "environment_record",  # the environment the source run was made in
                        lambda params=None: {**ENV, "git_commit": COMMIT, "git_dirty": False, "seed": params.seed})
    over, out = {"num_seeds": 2, "steps": 2}, tmp_path / "out"
    src = run_dir(tmp_path / "old", "src", params_mod.load(NB, [], over))
    (src / "data" / "jobs").mkdir()
    whole = runner.run(NB, [], over, out)
    resumed = runner.run(NB, [], over, out, resume_from=src)
    assert seen[0][1] is None and seen[1][1] == src.resolve()
    assert all("resume_from" not in params for params, _ in seen)
    rec = {d: json.loads((d / "run.json").read_text()) for d in (whole, resumed)}
    assert rec[resumed]["params_hash"] == rec[whole]["params_hash"] and rec[whole]["params_hash"] in resumed.name
    assert rec[resumed]["resume"] == {"from": str(src.resolve())} and "resume" not in rec[whole]
    assert "resume_from" not in yaml.safe_load((resumed / "params.yaml").read_text())
    with pytest.raises(ParamError, match="param num_seeds: 2 there, 3 here"):
        runner.run(NB, [], {**over, "num_seeds": 3}, out, resume_from=src)
    shutil.rmtree(src)
    again = params_mod.load(NB, [resumed / "params.yaml"])
    assert again.hash() == rec[whole]["params_hash"]
    rerun = runner.run(NB, [str(resumed / "params.yaml")], None, out)  # `rlwb rerun`'s call
    assert seen[-1][1] is None and "resume" not in json.loads((rerun / "run.json").read_text())
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(yaml.safe_dump({**again.to_dict(), "resume_from": str(src)}))
    assert params_mod.load(NB, [legacy]).hash() == again.hash()
    with pytest.raises(ParamError, match="--resume-from"):
        params_mod.load(NB, [], {"resume_from": str(whole)})
    with pytest.raises(ParamError, match="not an archived run directory"):
        runner.run(NB, [], over, out, resume_from=src)
    with pytest.raises(ParamError, match="does not resume"):
        runner.run("01_logprob_mismatch", [], {}, out, resume_from=whole)
    assert len(seen) == 3


@pytest.mark.slow
def test_a_resumed_study_equals_an_uninterrupted_one(default_model, tmp_path, monkeypatch):
    """A tiny study run whole, run again and interrupted after 5 of its 9 jobs (the 6th run's training raises, as
    a Ctrl-C would), then resumed from that interrupted run: the resumed run trains only the 4 jobs left, and its
    curves are the whole run's bar the wall-time columns (`t_*`), its analysis the same metrics. Catches a
    resume that loses the initial policy's outcomes (start.json), a reused run's KL to its twin, or reuses the
    wrong job's curve; the kept files make the resumed run self-contained and say which run trained which jobs."""
    p = tiny()
    card = json.loads((Path(default_model.path) / "model.json").read_text())
    rec = {"model": {"weights_sha256_16": card.get("weights_sha256_16")}}
    whole_dir, cut_dir, resumed_dir = (run_dir(tmp_path, n, p, **rec) for n in ("whole", "cut", "resumed"))
    real, trained = execution.train, []

    def counting(*a, **k):
        trained.append(a[2])
        return real(*a, **k)

    monkeypatch.setattr(execution, "train", counting)
    whole = mc.run(p, default_model.path, progress=False, store=archive.Run(whole_dir).jobs())
    assert len(trained) == len(design.training_runs(p)) == 9

    def cut_after_5(*a, **k):
        if len(trained) == 9 + 5:
            raise KeyboardInterrupt
        return counting(*a, **k)

    monkeypatch.setattr(execution, "train", cut_after_5)
    with pytest.raises(KeyboardInterrupt):
        mc.run(p, default_model.path, progress=False, store=archive.Run(cut_dir).jobs())
    kept = cut_dir / "data" / "jobs"
    assert len(list(kept.glob("*.parquet"))) == 5 and (kept / "start.json").exists()
    assert len(list(kept.glob("*.probe.pt"))) == 4  # the 4 clean runs' probes: their twins' KLs need them
    monkeypatch.setattr(execution, "train", counting)
    del trained[:]
    archive.update_record(resumed_dir, resume={"from": str(cut_dir)})  # as `rlwb run --resume-from` records it
    resumed = mc.run(p, default_model.path, progress=False, store=archive.Run(resumed_dir).jobs())
    assert len(trained) == 4
    wall = [c for c in whole.curves if c.startswith("t_")]
    assert wall
    pd.testing.assert_frame_equal(resumed.curves.drop(columns=wall), whole.curves.drop(columns=wall))
    assert resumed.curves["kl_to_clean"].notna().all()
    m_whole = {k: v for k, v in whole.metrics.items() if not k.startswith("resume/")}
    m_res = {k: v for k, v in resumed.metrics.items() if not k.startswith("resume/")}
    assert m_res.keys() == m_whole.keys()
    assert all(m_res[k] == v or (pd.isna(v) and pd.isna(m_res[k])) for k, v in m_whole.items())
    assert resumed.metrics["resume/reused_jobs"] == 5 and resumed.metrics["resume/trained_jobs"] == 4
    info = json.loads((resumed_dir / "run.json").read_text())["resume"]
    assert info["from"] == str(cut_dir) and info["reused_jobs"] == 5 and len(info["reused"]) == 5
    assert {k: v["jobs"] for k, v in info["parts"].items()} == {"cut": 5, "resumed": 4}
    assert all(v["wall_s"] > 0 and v["host"] == {"cpu": ENV["host"]["cpu"], "isa": ENV["host"]["isa"], "gpu": None}
               for v in info["parts"].values())
    done = resumed_dir / "data" / "jobs"
    assert len(list(done.glob("*.parquet"))) == 9 and not list(done.glob("*.probe.pt"))  # finished: probes gone


def test_a_run_of_record_is_published_without_its_kept_jobs(tmp_path):
    """`rlwb publish` always leaves data/jobs/ out (every row is in curves.parquet): the study's hundreds of job
    files never count against a run of record's size. Catches a publish that copies them."""
    from rlwb import publish

    d = run_dir(tmp_path, "20260101-000000-ok", tiny(), status="ok")
    (d / "data" / "jobs").mkdir()
    (d / "data" / "jobs" / "clean.none_engine.s0-abc.parquet").write_bytes(b"x" * 100_000)
    (d / "data" / "curves.parquet").write_bytes(b"x" * 10)
    left, size = publish.plan(d, "08_mismatch_cost", limit=10**9)
    assert [c.path for c in left] == ["data/jobs/"] and left[0].bytes == 100_000 and size < 10_000  # one entry


def fake_grid(monkeypatch, visited: list, phases: list, cut_at_phase: list):
    """`run_grid` without engines: each engine visit's plan, each phase's jobs finished in order with a one-row curve
    and a uniform probe (its KL kept as a lane's would be); records the engines visited and each phase drawn with
    how many jobs had finished before it. A phase whose index is in `cut_at_phase` is interrupted before its first
    job (a Ctrl-C)."""
    from types import SimpleNamespace

    kls, real = [], execution.TwinKL

    class Recorded(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            kls.append(self)

    monkeypatch.setattr(execution, "TwinKL", Recorded)

    def run_grid(p, model_path, engines, plan, one_run, *, on_start=None, progress=True, on_done=None):
        frames = []
        for name in engines:
            visited.append(name)
            w = SimpleNamespace(preset=SimpleNamespace(name=name), info=lambda: {})
            _, drawn = plan(w)
            for jobs in drawn:
                phases.append((name, len(frames), [(j.label, j.seed) for j in jobs]))
                if len(phases) - 1 in cut_at_phase:
                    raise KeyboardInterrupt
                for j in jobs:
                    kls[-1]._store.put_shared("start", {"initial_policy_reward": 0.3})  # as the first lane's run
                    kls[-1].add(j, torch.log_softmax(torch.zeros(2, 3), -1))
                    df = pd.DataFrame({"step": [0], "label": [j.label], "arm": [j.arm], "seed": [j.seed],
                                       "t_step": [0.1]}).assign(_wall_s=0.1)
                    frames.append(on_done(j, df))
        return frames

    monkeypatch.setattr(execution, "run_grid", run_grid)
    monkeypatch.setattr(execution, "probe_batch", lambda codec, p: None)


def test_the_second_pass_is_the_base_engines_last_phase_after_every_first_pass_job(tmp_path, monkeypatch,
                                                                                 default_model):
    """With a sequential rule the base engine comes back after the point engines, and its last phase (the second
    pass) is drawn only once every first-pass job, the points' included, has finished; it trains the rule's rows at
    seeds num_seeds ... n - 1, clean twins first, and the curves hold them after the base engine's first pass. A
    study cut as its second pass starts, resumed: the first pass all reused, the second decided at once, only the
    base engine started, the curves the uninterrupted study's. Catches a second pass decided on part of the first
    (the points not yet trained), drawn before the first pass ran, or trained on the wrong engine, or a resume that
    cannot decide without training. No engine runs here (`run_grid` is faked)."""
    from rlwb.experiments.mismatch_study import sequential

    p = tiny(engine_points=["vllm-v1@T1.0"], max_seeds=4)
    first = design.training_runs(p)
    decided = []

    def first_pass(curves, p):
        decided.append(len(curves))
        return [sequential.SeedCall("ratio@0.01", "none@engine", "ratio", (sequential.STRADDLES,), 0.1, 0.1, 0.2, 4,
                                    0.8, False)], 7

    monkeypatch.setattr(sequential, "first_pass", first_pass)
    visited, phases, cut = [], [], []
    fake_grid(monkeypatch, visited, phases, cut)
    base = p.engines[0]
    whole = run_dir(tmp_path, "whole", p)
    curves, reused, total = execution.train_study(p, default_model.path, progress=False,
                                                  store=archive.Run(whole).jobs())
    assert visited == [base, "vllm-v1", base] and decided == [len(first)]
    second = [("clean", 2), ("clean", 3), ("ratio@0.01", 2), ("ratio@0.01", 3)]
    assert phases[-1] == (base, len(first), second) and total == len(first) + 4 and reused == 0
    on_base = sum(j.engine == base for j in first)  # engine by engine: the base engine's passes, then the point's
    assert [tuple(x) for x in curves[["label", "seed"]].to_numpy()[on_base:on_base + 4]] == second
    assert (curves["arm"].iloc[on_base:on_base + 4] == "none@engine").all() and curves["kl_to_clean"].notna().all()
    # cut as the second pass starts (the first pass kept), then resumed
    visited.clear(), phases.clear()
    cut.append(2)
    src = run_dir(tmp_path, "cut", p)
    with pytest.raises(KeyboardInterrupt):
        execution.train_study(p, default_model.path, progress=False, store=archive.Run(src).jobs())
    assert visited == [base, "vllm-v1", base] and len(list((src / "data" / "jobs").glob("*.parquet"))) == len(first)
    visited.clear(), phases.clear(), cut.clear()
    resumed = run_dir(tmp_path, "resumed", p)
    archive.update_record(resumed, resume={"from": str(src)})
    c2, reused, total = execution.train_study(p, default_model.path, progress=False,
                                              store=archive.Run(resumed).jobs())
    assert visited == [base] and phases == [(base, 0, second)] and decided[-1] == len(first)
    assert reused == len(first) and total == len(first) + 4
    pd.testing.assert_frame_equal(c2, curves)


@pytest.mark.xdist_group("engines")  # its engines beside the session's: on the engines' worker
def test_a_two_pass_study_with_placebo_streams_runs_on_the_real_engines(default_model, tmp_path, monkeypatch):
    """A tiny study on the real engines with two placebo streams and a second pass (the rule's decision fixed: the
    tiny runs learn too little for a BMR): the second pass trains after the first in the same run, its runs get their
    KL to their own clean twins, and `analyze` records the rows' seeds; the two placebo streams reach the loop as
    sampling streams of their own (1 and 1001), and the engine is asked for those streams' sampling seeds.
    Catches a second pass that never trains, a second-pass run without its twin's KL, or a placebo stream that
    reaches the loop as the clean run's stream or as the other placebo's."""
    from rlwb.experiments.mismatch_study import sequential

    p = tiny(arms=["none@engine"], max_seeds=4, placebo_arms=["none@engine"], placebo_streams=2)
    call = sequential.SeedCall("ratio@0.01", "none@engine", "ratio", (sequential.STRADDLES,), 0.1, 0.1, 0.2, 4, 0.8,
                               False)
    monkeypatch.setattr(sequential, "first_pass", lambda curves, p: ([call], 5))
    streams, real = {}, execution.train

    def train(m, engine, cfg, *a, **k):  # the sampling stream each run's loop draws from
        streams[k["desc"].split()[0]] = cfg.sampling_stream
        return real(m, engine, cfg, *a, **k)

    monkeypatch.setattr(execution, "train", train)
    from rlwb.engines.worker import EngineWorker

    asked, generate = set(), EngineWorker.generate

    def recorded(self, prompts, sampling, *a, **k):
        asked.add(sampling.seed)
        return generate(self, prompts, sampling, *a, **k)

    monkeypatch.setattr(EngineWorker, "generate", recorded)
    res = mc.run(p, default_model.path, progress=False, store=archive.Run(run_dir(tmp_path, "two", p)).jobs())
    c = res.curves
    runs = c[["label", "arm", "seed"]].drop_duplicates()
    assert len(runs) == len(design.training_runs(p)) + 4 == res.metrics["resume/trained_jobs"]
    extra = runs[runs["seed"] >= 2]
    assert sorted(map(tuple, extra[["label", "arm", "seed"]].to_numpy())) == [
        ("clean", "none@engine", 2), ("clean", "none@engine", 3), ("ratio@0.01", "none@engine", 2),
        ("ratio@0.01", "none@engine", 3)]
    assert c["kl_to_clean"].notna().all()
    assert res.metrics["sequential/ratio@0.01/none@engine/seeds"] == res.metrics["sequential/clean/none@engine/seeds"]
    assert res.doses.set_index(["label", "arm"]).loc[("ratio@0.01", "none@engine"), "seeds"] == 4
    assert res.metrics["placebo/rows"] == 2
    assert streams == {"placebo": 1, "placebo#2": 1001, "clean": 0, "ratio@0.01": 0, "rerun": 0}
    from rlwb.core.rl.grpo_config import sampling_seed

    for k in (1, 1001):
        assert {sampling_seed(s, t, k) for s in p.seeds for t in range(p.steps)} <= asked
