"""`rlwb sweep`: grid files, cells as ordinary archived runs, the summary, interruption and --resume, and
the same grid on a local Ray cluster (real `ray start`, real engines)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from rlwb import sweep
from rlwb.errors import ParamError
from tests.conftest import REPO, rlwb


def write_grid(tmp_path: Path, **grid) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


def test_cells_are_the_cartesian_product_of_axes_and_zip_groups(tmp_path):
    g = sweep.load_grid(write_grid(tmp_path, notebook="01_logprob_mismatch", params={"reward_samples": 0},
                                   grid={"temperature": [0.5, 1.0], "engines": [["vllm-v0"], ["vllm-v1"]]},
                                   zip=[{"seed": [0, 1, 2], "prompts": [4, 8, 16]}]))
    cells = g.cells()
    assert len(cells) == 2 * 2 * 3
    assert all(c["reward_samples"] == 0 for c in cells)
    assert {(c["seed"], c["prompts"]) for c in cells} == {(0, 4), (1, 8), (2, 16)}  # zipped, not crossed
    assert len({sweep.cell_id(c) for c in cells}) == len(cells)
    assert sweep.cell_id(cells[0]) == sweep.cell_id(dict(reversed(list(cells[0].items()))))  # order-free
    assert g.varying() == ["temperature", "engines", "seed", "prompts"]


@pytest.mark.parametrize("grid, message", [
    ({"notebook": "01_logprob_mismatch", "grid": {"temperature": [0.5]}, "colour": 1}, "unknown key"),
    ({"grid": {"temperature": [0.5]}}, "`notebook`"),
    ({"notebook": "01_logprob_mismatch", "grid": {"temperature": []}}, "non-empty list"),
    ({"notebook": "01_logprob_mismatch", "zip": [{"seed": [0, 1], "prompts": [4]}]}, "one non-zero length"),
    ({"notebook": "01_logprob_mismatch", "params": {"seed": 1}, "grid": {"seed": [0, 1]}}, "more than one"),
    ({"notebook": "01_logprob_mismatch", "grid": {"temperature": [0.5, -1.0]}}, "cell 1"),
    ({"notebook": "01_logprob_mismatch", "grid": {"temprature": [0.5]}}, "temprature"),
    ({"notebook": "01_logprob_mismatch", "grid": {"seed": [0, 1]}, "summary": {"x": "temperature"}}, "summary x"),
    ({"notebook": "99_nothing", "grid": {"seed": [0]}}, "unknown notebook '99_nothing'"),
    ({"notebook": "01_logprob_mismatch", "files": ["nowhere.yaml"], "grid": {"seed": [0]}}, "nowhere.yaml"),
])
def test_bad_grids_fail_before_anything_runs_naming_the_problem(tmp_path, grid, message):
    with pytest.raises(ParamError, match=message):
        sweep.load_grid(write_grid(tmp_path, **grid))


def test_a_cell_reserves_what_its_engines_need(tmp_path, monkeypatch):
    """On CPU two threads per engine rank; on CUDA one GPU per tensor-parallel rank."""
    presets = tmp_path / "presets.yaml"
    presets.write_text(yaml.safe_dump({"tp2": {"extends": "vllm-v1", "vllm_kwargs": {"tensor_parallel_size": 2}}}))
    monkeypatch.setenv("RLWB_ENGINE_PRESETS", str(presets))
    assert sweep.cell_resources("01_logprob_mismatch", [], {"engines": ["vllm-v1"]}, cuda=False) == \
        {"num_cpus": 2, "num_gpus": 0}
    assert sweep.cell_resources("01_logprob_mismatch", [], {"engines": ["vllm-v0", "tp2"]}, cuda=False) == \
        {"num_cpus": 4, "num_gpus": 0}
    assert sweep.cell_resources("01_logprob_mismatch", [], {"engines": ["vllm-v0", "tp2"]}, cuda=True) == \
        {"num_cpus": 2, "num_gpus": 2}


def ok_runs(outputs: Path, notebook: str) -> list[Path]:
    return sorted(d for d in (outputs / notebook).iterdir()
                  if (d / "run.json").exists() and json.loads((d / "run.json").read_text())["status"] == "ok")


@pytest.mark.slow
def test_interrupted_sweep_keeps_finished_cells_and_resume_runs_only_the_rest(outputs, default_model, tmp_path):
    """Each cell an ordinary archived run; Ctrl-C after the first one keeps it; --resume runs only the rest and
    writes the summary from the cells' archived metrics."""
    grid = write_grid(tmp_path, notebook="00_default_policy", files=["params/00_default_policy/smoke.yaml"],
                      grid={"seed": [0, 1]}, summary={"x": "seed", "metrics": ["policy/greedy_accuracy"]})
    proc = subprocess.Popen([sys.executable, "-m", "rlwb.cli", "sweep", str(grid)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ},
                            # SIGINT ignored, as a shell's background job inherits it (a suite started with `&`): the
                            # sweep stops all the same (the moment between two cells: the test below)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.time() + 600
    state_file = None
    while time.time() < deadline:  # wait for the first cell to be archived, then Ctrl-C
        found = list((outputs / "sweeps" / "grid").glob("*/sweep.json")) if (outputs / "sweeps").exists() else []
        if found and any(c["status"] == "ok" for c in json.loads(found[0].read_text())["cells"]):
            state_file = found[0]
            break
        time.sleep(0.5)
    assert state_file is not None, "the first cell never finished"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in err
    before = json.loads(state_file.read_text())["cells"]
    first = [c for c in before if c["status"] == "ok"]
    assert len(first) == 1  # a cell takes far longer than the 0.5 s poll: the second was still running
    r = rlwb("sweep", str(grid), "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    after = json.loads(state_file.read_text())["cells"]
    assert all(c["status"] == "ok" for c in after)
    for c in first:  # finished cells were not run again
        assert next(a for a in after if a["id"] == c["id"])["run_dir"] == c["run_dir"]
    assert len(ok_runs(outputs, "00_default_policy")) == 2  # ordinary runs, in the ordinary archive
    assert "1 to run" in r.stderr
    # the summary holds exactly what the cells archived, whichever invocation ran them
    sweep_dir = Path(r.stdout.strip().splitlines()[-1])
    df = pd.read_parquet(sweep_dir / "summary.parquet")
    acc = df[df.metric == "policy/greedy_accuracy"].set_index("seed")["value"]
    for c in after:
        m = json.loads((Path(c["run_dir"]) / "metrics.json").read_text())
        assert acc[c["overrides"]["seed"]] == m["policy/greedy_accuracy"]
    assert (sweep_dir / "figures" / "summary.png").stat().st_size > 10_000
    assert "2 of 2 cells" in (sweep_dir / "report.html").read_text()


@pytest.mark.slow
def test_a_signal_between_two_cells_stops_a_sweep_that_inherited_sigint_ignored(outputs, default_model, tmp_path):
    """A sweep started as a shell's background job inherits SIGINT ignored; a SIGINT between two cells (outside
    `rlwb run`'s own handler) must still stop it, keeping the finished cell. The moment between two cells is timed
    through the sweep's progress callback, which it calls right after archiving a cell: a real signal, sent at the
    one moment a signal from outside cannot be aimed at."""
    grid = write_grid(tmp_path, notebook="00_default_policy", files=["params/00_default_policy/smoke.yaml"],
                      grid={"seed": [0, 1]})

    def say(msg: str) -> None:
        if msg.lstrip().startswith("cell ") and ": ok" in msg:
            os.kill(os.getpid(), signal.SIGINT)

    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt):
            sweep.run_sweep(grid, outputs, progress=say)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # what it inherited, given back
    finally:
        signal.signal(signal.SIGINT, inherited)
    state = sweep.read_state(sweep.latest_sweep_dir(outputs, grid))
    assert [c["status"] for c in state["cells"]] == ["ok", "pending"]
    assert len(ok_runs(outputs, "00_default_policy")) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ray_head(ray: str, port: int, num_cpus: int, env: dict, timeout: float = 300) -> subprocess.Popen:
    """`ray start --head --block` in a session of its own, returned once Ray says it started: every Ray process it
    starts is in that process group, and `os.killpg` ends exactly them, at once. (`ray stop` kills every process
    whose command line contains one of Ray's names, "monitor.py" among them, a `pytest tests/test_monitor.py` beside
    this test included, and takes ~9 s; so no test file is named `*monitor.py`.)"""
    import threading

    proc = subprocess.Popen([ray, "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}", "--num-gpus=0",
                             "--include-dashboard=false", "--disable-usage-stats", "--block"], text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    seen: list[str] = []
    started = threading.Event()

    def read():
        for line in proc.stdout:
            seen.append(line)
            if "Ray runtime started" in line:
                started.set()
        started.set()  # the process ended: `ray start` failed

    threading.Thread(target=read, daemon=True).start()
    if not started.wait(timeout) or not any("Ray runtime started" in x for x in seen):
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("".join(seen)[-2000:])
    return proc


@pytest.mark.slow
@pytest.mark.engines
def test_sweep_on_a_local_ray_cluster(outputs, default_model, tmp_path):
    """`ray start --head` here, then `rlwb sweep --ray ADDRESS`: two notebook-01 cells as Ray tasks, at once (the
    head declares 4 CPUs; each cell reserves 2). V1's raw logprobs give a k3 gap at T = 0.7 and none at T = 1,
    cell by cell."""
    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    head = start_ray_head(ray, port, 4, {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        grid = write_grid(tmp_path, notebook="01_logprob_mismatch", files=["params/01_logprob_mismatch/smoke.yaml"],
                          params={"engines": ["vllm-v1"], "reward_samples": 0},
                          grid={"temperature": [0.7, 1.0]}, summary={"x": "temperature", "metrics": ["*/k3_mean"]})
        r = rlwb("sweep", str(grid), "--ray", f"127.0.0.1:{port}", timeout=1500)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "on Ray" in r.stderr
        sweep_dir = Path(r.stdout.strip().splitlines()[-1])
        df = pd.read_parquet(sweep_dir / "summary.parquet")
        k3 = df[df.metric == "vllm-v1/k3_mean"].set_index("temperature")["value"]
        assert k3[0.7] > 1e-5 and k3[1.0] < 1e-8
        runs = [json.loads((d / "run.json").read_text()) for d in ok_runs(outputs, "01_logprob_mismatch")]
        assert len(runs) == 2
        assert max(r["started_at"] for r in runs) < min(r["finished_at"] for r in runs)  # side by side
        assert (sweep_dir / "figures" / "summary.png").exists()
    finally:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(60)


@pytest.mark.parametrize("grid", sorted((REPO / "params" / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_sweep_validates_every_cell(grid):
    """A sweep the README tells users to run validates as a whole before it starts (every cell's params)."""
    from rlwb.sweep import load_grid

    g = load_grid(grid)
    assert g.cells() and g.notebook in {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}
