"""Engine workers forked from a fork server (rlwb/engines/forking.py): real vLLM V1 workers, no mocks.

The claim is that a forked worker *is* the worker a fresh process would be: same tokens, same logprobs bit for
bit, same failure reports, nothing left behind. Speed is not asserted here (docs/performance.md measures it).
"""

import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from rlwb.engines import EngineCrashed, EngineError, EngineWorker, Sampling, forking
from tests.conftest import process_group_members

pytestmark = pytest.mark.engines
FORKED = "vllm-v1-fixed"  # a V1 preset (OMP_NUM_THREADS=1): forked on CPU


def _parent(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().split(")")[-1].split()[1])


def _sample(w, prompts):
    return w.generate(prompts, Sampling(temperature=1.0, max_tokens=16, seed=5), full=True)


def test_a_forked_worker_equals_a_fresh_one(default_model, prompts, monkeypatch):
    """Two forked workers (the second one forked from a server that has served one already) and a fresh one
    sample the same tokens with the same full-vocabulary logprobs, bit for bit."""
    forked = []
    for _ in range(2):
        with EngineWorker(FORKED, default_model.path) as w:
            assert isinstance(w.proc, forking.ForkedProcess)
            assert _parent(w.pid) == w.proc.server.proc.pid != os.getpid()  # the fork server's child, not ours
            forked.append(_sample(w, prompts))
    assert forked[0][0].full is not None
    monkeypatch.setenv("RLWB_FORK_SERVER", "0")
    with EngineWorker(FORKED, default_model.path) as w:
        assert isinstance(w.proc, subprocess.Popen) and _parent(w.pid) == os.getpid()
        fresh = _sample(w, prompts)
    for run in forked:
        assert [c.token_ids for c in run] == [c.token_ids for c in fresh]
        for a, b in zip(run, fresh, strict=True):
            np.testing.assert_array_equal(a.logprobs, b.logprobs)
            np.testing.assert_array_equal(a.full, b.full)


def test_which_workers_are_forked(default_model, engine, monkeypatch):
    """Only single-threaded OpenMP environments: in the others (V0, HF) importing torch starts OpenMP's pool,
    after which a forked child hangs in its first parallel region (GNU libgomp). The session's V0 worker (the one
    test_equivalence and test_stress use) is asked, rather than a V0 start of its own (~20 s)."""
    assert isinstance(engine("vllm-v0").proc, subprocess.Popen)
    monkeypatch.setenv("RLWB_FORK_SERVER", "yes")
    with pytest.raises(ValueError, match="RLWB_FORK_SERVER='yes'"):
        EngineWorker(FORKED, default_model.path)


def test_killed_forked_worker_reports_the_signal_and_leaves_nothing(default_model, prompts, tmp_path, monkeypatch):
    monkeypatch.setenv("RLWB_RUN_DIR", str(tmp_path))
    w = EngineWorker(FORKED, default_model.path)
    group = w.pid
    assert isinstance(w.proc, forking.ForkedProcess) and process_group_members(group)
    killer = threading.Timer(0.3, lambda: os.kill(w.pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(EngineCrashed) as ei:
        for _ in range(200):
            w.generate(prompts * 8, Sampling(temperature=1.0, max_tokens=64, seed=0, ignore_eos=True))
    killer.join()
    assert "killed by signal SIGKILL" in str(ei.value) and ei.value.stderr_tail
    text = (tmp_path / "logs" / f"engine-{FORKED}.log").read_text(errors="replace")
    assert text.startswith(f"=== rlwb: starting {FORKED}") and "vllm" in text.lower()
    w.close()
    time.sleep(1)
    assert process_group_members(group) == [], "no orphaned engine processes"


def test_workers_of_a_killed_fork_server_end_and_the_next_start_gets_a_new_server(default_model, prompts):
    """The fork server stands between the kernel and its workers: if it dies (here: SIGKILL, a fault that cannot
    be caused otherwise), its workers end their process groups, the kernel's next call raises EngineCrashed, and
    the next worker of that environment starts from a new server."""
    w = EngineWorker(FORKED, default_model.path)
    server = w.proc.server
    group = w.pid
    os.kill(server.proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_group_members(group) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_group_members(group) == [], "a worker outlived its fork server"
    with pytest.raises(EngineCrashed, match="SIGKILL"):
        w.generate(prompts, Sampling(max_tokens=4))
    w.close()
    with EngineWorker(FORKED, default_model.path) as w2:
        assert w2.proc.server is not server and w2.proc.server.alive()
        assert len(w2.generate(prompts, Sampling(max_tokens=4))) == len(prompts)


def test_two_workers_forked_at_once_both_work(default_model, prompts):
    """Two lanes (GRPO's concurrent_runs) launch workers of one environment at the same time: both are forked
    from the one server, each answers its own requests."""
    a = EngineWorker(FORKED, default_model.path, wait=False)
    b = EngineWorker(FORKED, default_model.path, wait=False)
    try:
        assert a.proc.server is b.proc.server
        outs = {}
        threads = [threading.Thread(target=lambda k, w: outs.__setitem__(k, _sample(w.wait_ready(), prompts)),
                                    args=(k, w)) for k, w in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert a.pid != b.pid and [c.token_ids for c in outs["a"]] == [c.token_ids for c in outs["b"]]
    finally:
        a.close()
        b.close()


def test_an_environment_without_the_engine_fails_at_start_with_the_import_error(tmp_path, monkeypatch,
                                                                                 default_model):
    """The fork server imports the engine on its first fork, with its output on that worker's log: a failed
    import is that worker's start-up error, with the traceback in its stderr tail."""
    extra = tmp_path / "mine.yaml"
    extra.write_text("no-vllm:\n  extends: vllm-v1-fixed\n  python: .venv/bin/python\n")  # the kernel's venv
    monkeypatch.setenv("RLWB_ENGINE_PRESETS", str(extra))
    with pytest.raises((EngineCrashed, EngineError)) as ei:
        EngineWorker("no-vllm", default_model.path)
    assert "No module named 'vllm'" in (ei.value.stderr_tail or "")


def test_a_fork_server_that_gained_a_thread_starts_workers_fresh(tmp_path, monkeypatch, default_model, prompts):
    """A fork server forks only while it is single-threaded. The fault (an import that starts a thread) cannot be
    caused with the shipped environments, so an interpreter wrapper puts a `sitecustomize` that starts one on the
    path: the worker then starts fresh on the same pipes, and so do later workers of that environment."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import threading, time\n"
                                           "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    from rlwb.engines import resolve_preset

    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexport PYTHONPATH="$PYTHONPATH:{site}"\n'
                      f'exec {resolve_preset(FORKED).python} "$@"\n')
    python.chmod(0o755)
    extra = tmp_path / "mine.yaml"
    extra.write_text(f"threaded:\n  extends: {FORKED}\n  python: {python}\n")
    monkeypatch.setenv("RLWB_ENGINE_PRESETS", str(extra))
    with EngineWorker("threaded", default_model.path) as w:
        assert isinstance(w.proc, forking.ForkedProcess) and w.proc._popen is not None
        assert "threads" in w.proc.server.unsafe and _parent(w.pid) == os.getpid()
        first = _sample(w, prompts)
    with EngineWorker("threaded", default_model.path) as w:
        assert isinstance(w.proc, subprocess.Popen)
        assert [c.token_ids for c in _sample(w, prompts)] == [c.token_ids for c in first]
