"""The GPU command (`scripts/gpu_runs.sh`) proven on CPU before a GPU is lent: its wheel list is the one the kernel
env's versions require, a view of the device image lacks what the wheels bring, and the whole script runs end to end
there at tiny sizes, archives every step, packs what the device may return, and on a second call does nothing twice."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "device"))
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_runs  # noqa: E402
import image_venv  # noqa: E402
import wheels  # noqa: E402


def test_wheel_list_is_what_the_kernel_env_requires():
    stale = "scripts/device/wheels.txt is stale: python scripts/device/wheels.py write"
    assert wheels.listed() == wheels.needed(), stale
    # what a run imports and the image does not hold
    for name in ("papermill", "nbconvert", "ipykernel", "pydantic", "tinycss2"):
        assert name in wheels.listed()
    assert not set(wheels.listed()) & image_venv.image_packages()


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


@pytest.mark.slow
@pytest.mark.engines
def test_cpu_rehearsal_runs_every_step_in_the_image_view(device_view, tmp_path):
    view, whl, tree = device_view
    assert not (tree / ".venv").exists() and (tree / "scripts" / "gpu_runs.py").is_file()
    archive, out = tmp_path / "archive", tmp_path / "out"
    env = {**os.environ, "PYTHON": str(view / "bin" / "python"), "WHEELS": str(whl),
           "RLWB_DEVICE_SITE": str(tmp_path / "site")}
    env.pop("PYTHONPATH", None)
    cmd = ["bash", "scripts/gpu_runs.sh", "--cpu", "--lanes", "1", "--archive", str(archive), "--out", str(out)]
    # from a copy of the tree as the device gets it: no .venv or .venvs there to be found by a repo path
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = [s.name for s in gpu_runs.plan(cpu=True)]
    for name in steps:
        run_dir = Path((archive / "gpu-steps" / f"{name}.done").read_text().strip())
        rec = json.loads((run_dir / "run.json").read_text())
        assert rec["status"] == "ok" and (run_dir / "report.html").is_file(), name
        assert rec["engines"]["hf"]["settings"]["device"] == "cpu"
    parts = sorted(out.iterdir())
    assert 1 <= len(parts) <= gpu_runs.MAX_FILES and all(p.stat().st_size <= 16 * 2**20 for p in parts)
    # a second call finishes only what is not done: here, nothing
    r2 = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stdout[-3000:]
    assert r2.stdout.count(": done before (") == len(steps) and " -m rlwb.cli run " not in r2.stdout


def test_gpu_mode_refuses_a_tree_that_is_not_a_clean_commit(device_view):
    """The lent GPU's runs are worth something only as runs of record, and `rlwb publish` refuses a dirty tree's
    runs: the first lent session spent its device time on such runs. The copy is no git repository at all."""
    _, _, tree = device_view
    r = subprocess.run([sys.executable, "scripts/gpu_runs.py", "--steps", "build"], cwd=tree, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "not a clean commit" in r.stderr


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
