"""The GPU command (`scripts/gpu_runs.sh`) proven on CPU before a GPU is lent: its wheel list is the one the kernel
env's versions require, a view of the device image lacks what the wheels bring, and the whole script runs end to end
there at tiny sizes, archives every step, packs what the device may return, and on a second call does nothing twice."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlwb import publish

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "device"))
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_runs  # noqa: E402
import image_venv  # noqa: E402
import wheels  # noqa: E402


def test_wheel_list_is_what_the_kernel_env_requires():
    stale = "scripts/device/wheels.txt is stale: python scripts/device/wheels.py write"
    # the names follow from the env's requirements; the versions are the pins the rehearsal tests, which a machine
    # whose index resolves other versions (CI's did for platformdirs) must still admit
    assert set(wheels.listed()) == set(wheels.needed()), stale
    assert wheels.excluded(wheels.listed()) == [], stale
    assert wheels.excluded({**wheels.listed(), "pydantic-core": "1.0"}), "a pin pydantic does not admit passes"
    # what a run imports and the image does not hold
    for name in ("papermill", "nbconvert", "ipykernel", "pydantic", "tinycss2"):
        assert name in wheels.listed()
    assert not set(wheels.listed()) & image_venv.image_packages()
    # left behind on purpose (the carried tree's 64 MiB); the rehearsal's kernel runs without them
    assert not set(wheels.listed()) & set(wheels.LEFT_OUT)


def test_the_tree_and_the_wheels_fit_what_the_device_carries():
    """The GPU command travels as what the device counts: the tracked and the untracked-not-ignored files, shared/
    where there is one, and the carried `.whl/` folder whole, 64 MiB in all (the device refuses more); every run of
    record published counts against it. Half a MiB of margin; where `.whl/` was not fetched here (CI), the pinned
    wheels' measured weight stands in for it. Catches a publish that leaves no GPU session able to start."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    files = {ROOT / f for f in listed if f} | set((ROOT / "shared").rglob("*"))
    size = sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())
    whl = [f for f in (ROOT / ".whl").rglob("*") if f.is_file()] if (ROOT / ".whl").is_dir() else []
    carried = sum(f.stat().st_size for f in whl) if whl else wheels.WHEELS_BYTES_CP312
    assert size + carried <= wheels.DEVICE_TREE_LIMIT - 2**19, (
        f"tree {size / 2**20:.2f} MiB + wheels {carried / 2**20:.2f} MiB: over what the device carries")
    # and what publish lets the runs of record grow to still fits: a publish within FOLDER_LIMIT cannot break this
    shipped = ROOT / "docs" / "runs"
    runs = sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink() and shipped in f.parents)
    assert size - runs + publish.FOLDER_LIMIT + carried <= wheels.DEVICE_TREE_LIMIT - 2**19, (
        f"the tree outside docs/runs ({(size - runs) / 2**20:.2f} MiB), publish.FOLDER_LIMIT "
        f"({publish.FOLDER_LIMIT / 2**20:.2f} MiB) and the wheels pass what the device carries: lower FOLDER_LIMIT")


def test_requirements_follow_extras_and_markers():
    import importlib.metadata as md

    names = image_venv.requirements(md.distribution("nbconvert"))
    assert ("bleach", frozenset({"css"})) in names
    assert "tinycss2" in {n for n, _ in image_venv.requirements(md.distribution("bleach"), frozenset({"css"}))}
    assert "tinycss2" not in {n for n, _ in image_venv.requirements(md.distribution("bleach"))}
    # pyzmq needs cffi on PyPy only: not carried to a CPython
    assert "cffi" not in {n for n, _ in image_venv.requirements(md.distribution("pyzmq"))}


def test_plan_names_every_step_once_and_rejects_unknown_ones(tmp_path):
    gpu = [s.name for s in gpu_runs.plan(cpu=False)]
    assert gpu[0] == "build" and len(gpu) == len(set(gpu))
    assert {"09", "03", "memory", "01-float32", "01-bfloat16", "02-bfloat16", "04-bfloat16"} <= set(gpu)
    r = subprocess.run([sys.executable, "scripts/gpu_runs.py", "--steps", "09,nope", "--list"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown step(s) ['nope']" in r.stderr


@pytest.fixture(scope="module")
def device_view(tmp_path_factory):
    """The image's packages alone, linked from the kernel env, and the wheel list fetched for this Python."""
    d = tmp_path_factory.mktemp("device")
    view = image_venv.build(d / "image")
    whl = d / "wheels"
    wheels.download(whl, platform.python_version())
    return view, whl, image_venv.device_tree(d / "tree")


def test_the_image_view_lacks_what_the_wheels_bring(device_view):
    view, _, _ = device_view
    py = str(view / "bin" / "python")
    ok = subprocess.run([py, "-c", "import torch, transformers, pandas, scipy, statsmodels, matplotlib"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    for mod in ("papermill", "pydantic", "ipykernel", "nbconvert"):
        r = subprocess.run([py, "-c", f"import {mod}"], capture_output=True, text=True)
        assert r.returncode != 0 and "No module named" in r.stderr, mod


# The suite runs three of the rehearsal's steps, one of each kind of run (an hf-engine notebook through its
# gpu-hf.yaml, the trainer-settings notebook, the GRPO loop), and imports every experiment and figure module in the
# image view for the others; `make gpu-rehearsal` runs every step. The whole rehearsal took ~4 min here, more than
# the suite's 30 minutes leave.
# the steps the suite rehearses: a GRPO run (the trainer and the hf engine under the kernel's interpreter) and
# notebook 09 (the trainer's settings); every other module's imports are the test above
SUITE_STEPS = ["03", "09"]


def test_every_experiment_and_figure_module_imports_in_the_image_view(device_view):
    view, whl, tree = device_view
    site = tree.parent / "site-imports"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *map(str, sorted(whl.glob("*.whl")))], check=True)
    mods = sorted(f"rlwb.{d}.{p.stem}" for d in ("experiments", "plots")
                  for p in (tree / "rlwb" / d).glob("*.py") if p.stem != "__init__")
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\nprint(len(sys.argv) - 1)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(view / "bin" / "python"), "-c", code, *mods], cwd=tree, capture_output=True, text=True,
                       env={**env, "PYTHONPATH": f"{site}:{tree}"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.strip()) == len(mods) >= 20


@pytest.mark.slow
@pytest.mark.engines
def test_cpu_rehearsal_runs_its_steps_in_the_image_view(device_view, tmp_path):
    view, whl, tree = device_view
    assert not (tree / ".venv").exists() and (tree / "scripts" / "gpu_runs.py").is_file()
    assert set(SUITE_STEPS) <= {s.name for s in gpu_runs.plan(cpu=True)}
    archive, out = tmp_path / "archive", tmp_path / "out"
    env = {**os.environ, "PYTHON": str(view / "bin" / "python"), "WHEELS": str(whl),
           "RLWB_DEVICE_SITE": str(tmp_path / "site")}
    env.pop("PYTHONPATH", None)
    cmd = ["bash", "scripts/gpu_runs.sh", "--cpu", "--lanes", "1", "--archive", str(archive), "--out", str(out),
           "--steps", ",".join(SUITE_STEPS), "--budget", "3600"]
    # from a copy of the tree as the device gets it: no .venv or .venvs there to be found by a repo path
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for name in SUITE_STEPS:
        run_dir = Path((archive / "gpu-steps" / f"{name}.done").read_text().strip())
        rec = json.loads((run_dir / "run.json").read_text())
        assert rec["status"] == "ok" and (run_dir / "report.html").is_file(), name
        assert rec["engines"]["hf"]["settings"]["device"] == "cpu"
    parts = sorted(out.iterdir())
    assert 1 <= len(parts) <= gpu_runs.MAX_FILES and all(p.stat().st_size <= 16 * 2**20 for p in parts)
    # a second call finishes only what is not done: here, nothing
    r2 = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stdout[-3000:]
    assert r2.stdout.count(": done before (") == len(SUITE_STEPS) and " -m rlwb.cli run " not in r2.stdout


def test_gpu_mode_runs_only_from_a_clean_commit(tmp_path):
    """The lent GPU's runs are worth something only as runs of record, and `rlwb publish` refuses a dirty tree's
    runs: the first lent session spent its device time on such runs. What the device adds (the carried .whl/, the
    archive under outputs/) is ignored and must not count."""
    tree = image_venv.device_tree(tmp_path / "tree")
    git = lambda *a: subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=tree, check=True,
                                    capture_output=True)
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "tree")
    (tree / ".whl").mkdir()
    (tree / ".whl" / "x.whl").write_text("")
    cmd = [sys.executable, "scripts/gpu_runs.py", "--steps", "memory", "--budget", "0", "--grace", "0",
           "--out", str(tmp_path / "out"), "--archive", str(tree / "outputs" / "gpu")]
    r = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    # clean: it gets past the check, then starts nothing (the memory check would not end in a zero budget): exit 3
    assert r.returncode == 3 and "not started" in r.stdout, r.stdout + r.stderr
    (tree / "scripts" / "new_module.py").write_text("")
    r = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    assert r.returncode == 2 and "not a clean commit" in r.stderr


def test_the_build_lanes_next_step_waits_for_the_memory_check(tmp_path):
    """On the H100 of record the build finished first and notebook 09 (the build's lane) started beside the memory
    check, which held the GPU: 09 ran out of memory. A lane's GPU step starts only after phase 0."""
    import types

    a = types.SimpleNamespace(budget=60, grace=5, lanes=6, cpu=False, out=str(tmp_path / "out"),
                              archive=str(tmp_path / "archive"))
    stamp = tmp_path / "stamps"
    stamp.mkdir()
    build = gpu_runs.Step("build", ["bash", "-c", f"date +%s.%N > {stamp}/build"], lane=0, script=True, est_s=1)
    memory = gpu_runs.Step("memory", ["bash", "-c", f"sleep 2; date +%s.%N > {stamp}/memory; echo '{{}}'"], lane=2,
                           script=True, est_s=1, phase=0)
    nb09 = gpu_runs.Step("09", ["bash", "-c", f"date +%s.%N > {stamp}/09"], lane=0, script=True, est_s=1,
                         needs_build=True)
    r = gpu_runs.Runner(a)
    assert r.go([build, memory, nb09]) == 0, r.results
    t = {k: float((stamp / k).read_text()) for k in ("build", "memory", "09")}
    assert t["build"] < t["memory"] < t["09"], t  # the build ran beside the check; 09 after it


def test_a_step_cut_at_the_budget_is_interrupted_and_not_marked_done(tmp_path):
    """The budget's SIGINT stops a step at once, also where the runner was started ignoring SIGINT (a shell's
    `cmd &`: set here, as such a shell sets it), so rlwb can archive the step's run as interrupted; the step is not
    marked done and a second call runs only it. Catches steps that inherit the ignored SIGINT (then the step lives
    until the SIGKILL 30 s later, unarchived), or a runner that keeps its handler after it returns."""
    import signal
    import types

    a = types.SimpleNamespace(budget=2, grace=1, lanes=2, cpu=False, out=str(tmp_path / "out"),
                              archive=str(tmp_path / "archive"))
    slow = gpu_runs.Step("slow", ["bash", "-c", "sleep 60"], lane=1, script=True, est_s=1)
    quick = gpu_runs.Step("quick", ["bash", "-c", "echo '{}'"], lane=2, script=True, est_s=1)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        t0 = time.monotonic()
        rc = gpu_runs.Runner(a).go([slow, quick])
        took = time.monotonic() - t0
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # the runner's own disposition given back
    finally:
        signal.signal(signal.SIGINT, before)
    assert took < 20 and rc == 1, took
    markers = tmp_path / "archive" / "gpu-steps"
    assert (markers / "quick.done").is_file() and not (markers / "slow.done").exists()
    assert len(list((tmp_path / "out").glob("gpu_runs.tar.gz.part*"))) == 1
    # a second call runs only the cut step
    r = gpu_runs.Runner(types.SimpleNamespace(**{**vars(a), "budget": 30}))
    quick_again = gpu_runs.Step("quick", ["bash", "-c", "exit 7"], lane=2, script=True, est_s=1)
    assert r.go([quick_again]) == 0 and r.results["quick"] == "done before"


def test_hf_preset_runs_under_the_kernels_own_interpreter():
    from rlwb.engines.presets import interpreter_path, resolve_preset

    assert interpreter_path("kernel") == Path(sys.executable)
    assert resolve_preset("hf").python == Path(sys.executable)


def test_every_gpu_hf_file_validates_over_its_gpu_yaml():
    from rlwb import params as params_mod

    files = sorted((ROOT / "params").glob("*/gpu-hf.yaml"))
    assert files
    for f in files:
        for dt in ("float32", "bfloat16"):
            p = params_mod.load(f.parent.name, [str(f.parent / "gpu.yaml"), str(f)], {"dtype": dt})
            assert p.engines == ["hf"] and p.model == "qwen2.5-0.5b-random" and p.dtype == dt


def test_pinned_takes_only_the_listed_versions_and_names_a_missing_wheel(tmp_path):
    pins = wheels.listed()
    for n, v in pins.items():
        (tmp_path / f"{n.replace('-', '_')}-{v}-py3-none-any.whl").write_text("")
    (tmp_path / "papermill-0.0.1-py3-none-any.whl").write_text("")  # an older version left in the folder
    found, missing = wheels.pinned(tmp_path)
    assert not missing and len(found) == len(pins) and not any("0.0.1" in w.name for w in found)
    dropped = next(iter(pins))
    next(tmp_path.glob(f"{dropped.replace('-', '_')}-*")).unlink()
    r = subprocess.run([sys.executable, "scripts/device/wheels.py", "pinned", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and f"{dropped}=={pins[dropped]}" in r.stderr
