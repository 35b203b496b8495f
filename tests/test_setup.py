"""Setup from nothing: the V0 wheel's cache key, the one-line diagnosis of a build that reaches for the
network, env markers, progress in logs, and the V0 build that `make setup` made (from an empty cache in CI)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WHEEL = [sys.executable, str(REPO / "scripts" / "vllm_v0_wheel.py")]
FACTS = ["--torch", "2.13.0+cpu", "--isa", "avx2", "--python", "cp311", "--machine", "x86_64",
         "--libc", "glibc-2.36", "--compiler", "c++ (Debian 12.2.0-14) 12.2.0", "--sdist-sha256", "abc"]


def wheel_key(*overrides: str) -> dict:
    args = list(FACTS)
    for flag, value in zip(overrides[::2], overrides[1::2]):
        args[args.index(flag) + 1] = value
    r = subprocess.run([*WHEEL, "key", *args], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_wheel_key_changes_with_everything_the_wheel_depends_on():
    base = wheel_key()
    assert wheel_key()["key"] == base["key"]  # deterministic
    assert base["facts"]["build_env"] == {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_DISABLE_AVX512": "true"}
    for flag, other in (("--isa", "avx512"), ("--torch", "2.13.1+cpu"), ("--python", "cp312"),
                        ("--libc", "glibc-2.38"), ("--compiler", "c++ 13.3"), ("--machine", "aarch64"),
                        ("--sdist-sha256", "def")):
        assert wheel_key(flag, other)["key"] != base["key"], flag
    assert wheel_key("--isa", "avx512")["facts"]["build_env"]["VLLM_CPU_DISABLE_AVX512"] == "false"


def test_unknown_isa_is_refused():
    r = subprocess.run([*WHEEL, "key", *FACTS[:2], "--isa", "sse4"], capture_output=True, text=True)
    assert r.returncode != 0 and "unknown ISA 'sse4'" in r.stderr


# Lines of the build log of a real failure: vLLM 0.8.5 built with its AVX-512 path on an AVX-512 machine
# that reaches only package registries (RLWB_V0_ISA=avx512 here; before this fix, every AVX-512 machine).
FAILED_BUILD_LOG = """\
-- Enabling C extension.
CMake Warning at cmake/cpu_extension.cmake:99 (message):
[1/9] Performing download step (git clone) for 'onednn-populate'
Cloning into 'onednn-src'...
fatal: unable to access 'https://github.com/oneapi-src/oneDNN.git/': Could not resolve host: github.com
Had to git clone more than once: 3 times.
CMake Error at onednn-subbuild/onednn-populate-prefix/tmp/onednn-populate-gitclone.cmake:50 (message):
  Failed to clone repository: 'https://github.com/oneapi-src/oneDNN.git'
FAILED: onednn-populate-prefix/src/onednn-populate-stamp/onednn-populate-download
CMake Error at /usr/share/cmake/Modules/FetchContent.cmake:1679 (message):
  Build step for onednn failed: 2
"""


def test_a_build_that_reaches_for_the_network_is_named_in_one_line(tmp_path):
    log = tmp_path / "build.log"
    log.write_text(FAILED_BUILD_LOG)
    r = subprocess.run([*WHEEL, "explain-log", str(log)], capture_output=True, text=True, check=True)
    line = r.stdout.strip()
    assert "\n" not in line
    assert "https://github.com/oneapi-src/oneDNN.git/" in line and "unreachable" in line
    assert "RLWB_V0_ISA" in line  # says what to do
    log.write_text("error: command 'c++' failed: No such file or directory\n")
    r = subprocess.run([*WHEEL, "explain-log", str(log)], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "not a network failure"


def test_engine_from_an_unfinished_env_is_refused(tmp_path):
    from rlwb.engines.presets import PresetError, resolve_preset

    env = tmp_path / "venv"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    (env / ".rlwb-incomplete").touch()
    presets = tmp_path / "presets.yaml"
    presets.write_text(f"broken:\n  backend: vllm\n  python: {env / 'bin' / 'python'}\n")
    preset = resolve_preset("broken", files=[presets])
    with pytest.raises(PresetError, match="did not finish"):
        preset.check_interpreter()
    (env / ".rlwb-incomplete").unlink()
    preset.check_interpreter()


def test_a_missing_engine_env_inside_the_repo_is_named_by_its_repo_path(tmp_path, monkeypatch):
    """Notebook 09 on a machine without vLLM shows this reason in its report: the env's path in the repo, not this
    machine's checkout (a lent GPU's report named /work/main/.venvs/vllm-v1/bin/python). Both forms a preset takes:
    an absolute path into the repo, and `.venvs/...` under the environments' directory with a `setup:` recipe (the
    shipped presets' form, whose hint is `rlwb engines setup`)."""
    import yaml

    from rlwb.engines.presets import PresetError, resolve_preset
    from rlwb.paths import REPO_ROOT

    monkeypatch.setenv("RLWB_ENVS", ".venvs-missing-for-a-test")  # relative: inside the repo, and absent
    presets = tmp_path / "presets.yaml"
    presets.write_text(yaml.safe_dump({
        "gone": {"backend": "vllm", "python": str(REPO_ROOT / ".venvs" / "no-such-env" / "bin" / "python")},
        "unmade": {"backend": "vllm", "python": ".venvs/vllm-v1/bin/python", "setup": {"pip": ["vllm"]}}}))
    for name, shown, hint in (("gone", ".venvs/no-such-env/bin/python", "run `make engines`"),
                              ("unmade", ".venvs-missing-for-a-test/vllm-v1/bin/python", "run `rlwb engines setup")):
        with pytest.raises(PresetError) as e:
            resolve_preset(name, files=[presets]).check_interpreter()
        assert f"interpreter {shown} does not exist ({hint}" in str(e.value)
        assert str(REPO_ROOT) not in str(e.value)


def test_progress_in_a_log_is_a_few_whole_lines():
    """A bar of 2,000 quick updates, stderr a pipe (a log): a handful of lines, not one per redraw."""
    code = ("import time\nfrom rlwb.progress import progress_bar\n"
            "for _ in progress_bar(range(2000), desc='steps'):\n    time.sleep(0.0005)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = r.stderr.splitlines()
    assert 1 <= len(lines) <= 3, lines
    assert "\r" not in r.stderr
    assert "2000/2000" in lines[-1]


def test_progress_postfix_in_a_log_waits_for_the_timed_line():
    """A loop that sets its postfix every step (the GRPO loop's reward) still writes a handful of lines to a log,
    and the last shows the true count with the last postfix (it once wrote a line per step, each at `0/N`)."""
    code = ("import time\nfrom rlwb.progress import progress_bar\n"
            "bar = progress_bar(range(500), desc='grpo')\n"
            "for i in bar:\n    time.sleep(0.001)\n    bar.set_postfix(reward=f'{i}')\n"
            "    bar.set_postfix_str(f'r={i}')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = r.stderr.splitlines()
    assert 1 <= len(lines) <= 3, lines[:5]
    assert "500/500" in lines[-1] and "r=499" in lines[-1], lines[-1]


def _sections(obj: Path) -> set[str]:
    out = subprocess.run(["readelf", "-S", "-W", str(obj)], capture_output=True, text=True, check=True).stdout
    return {w for line in out.splitlines() for w in line.split() if w.startswith(".")}


def test_the_v0_compiler_drops_debug_info_and_keeps_the_code(tmp_path):
    """The compiler the V0 build runs (`scripts/cxx_without_debug_info.sh`, CXX of `vllm_v0_wheel.build`) compiles
    what the build asks for, RelWithDebInfo's `-O2 -g` included, without debug info; the same command through the
    plain compiler (the control) has it, and both give the same machine code."""
    src = tmp_path / "k.cpp"
    src.write_text("float dot(const float* a, const float* b, int n) { float s = 0; "
                   "for (int i = 0; i < n; ++i) s += a[i] * b[i]; return s; }\n")
    objs = {"plain": tmp_path / "plain.o", "launcher": tmp_path / "launcher.o"}
    args = ["-O2", "-g", "-DNDEBUG", "-c", str(src), "-o"]
    subprocess.run(["c++", "-mavx2", *args, str(objs["plain"])], check=True)
    # the wrapped compiler with an argument of its own, as CMake takes CXX="g++ -m64"
    subprocess.run([str(REPO / "scripts" / "cxx_without_debug_info.sh"), *args, str(objs["launcher"])], check=True,
                   env={**os.environ, "RLWB_V0_CXX": "c++ -mavx2"})
    assert ".debug_info" in _sections(objs["plain"])  # the control: -g writes it
    assert ".debug_info" not in _sections(objs["launcher"])
    text = {n: subprocess.run(["objcopy", "-O", "binary", "--only-section=.text", str(o), "/dev/stdout"],
                              capture_output=True, check=True).stdout for n, o in objs.items()}
    assert text["plain"] == text["launcher"] and text["plain"]


def test_the_v0_build_runs_the_wrapped_compiler_and_keys_what_the_caller_adds():
    """What `pip wheel` of the V0 build gets (`vllm_v0_wheel.build_process_env`): CXX is the compiler without debug
    info, wrapping the caller's CXX (never itself, however it is spelled); the benchmark's baseline
    (`debug_info=True`) is vLLM's own build, the caller's compiler as it is. A caller's build variable
    (CMAKE_BUILD_TYPE, CXXFLAGS, ...: they change the wheel) reaches the build and is part of the wheel's key, as is
    a CXX's own argument and the wrapper's bytes; the wrapper refuses to run itself."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import vllm_v0_wheel as w
    finally:
        sys.path.remove(str(REPO / "scripts"))
    wrapper = str(w.CXX_WITHOUT_DEBUG_INFO)
    caller = {"PATH": "/usr/bin", "CXX": "g++-12", "CMAKE_BUILD_TYPE": "Debug", "CXXFLAGS": "-O0", "HOME": "/root"}
    env = w.build_process_env("avx2", caller)
    assert env["CXX"] == wrapper and env["RLWB_V0_CXX"] == "g++-12"
    assert env["CMAKE_BUILD_TYPE"] == "Debug" and env["CXXFLAGS"] == "-O0" and env["HOME"] == "/root"
    assert env["VLLM_CPU_DISABLE_AVX512"] == "true" and env["PATH"].endswith(":/usr/bin")
    assert w.build_process_env("avx2", {})["RLWB_V0_CXX"] == "c++"
    link = REPO / "scripts" / "cxx_without_debug_info.sh"  # the wrapper by a relative spelling, with an argument
    for spelling in (wrapper, f"{wrapper} -m64", os.path.relpath(link)):
        assert w.build_process_env("avx2", {"CXX": spelling})["RLWB_V0_CXX"] == "c++", spelling
    baseline = w.build_process_env("avx2", caller, debug_info=True)
    assert baseline["CXX"] == "g++-12" and "RLWB_V0_CXX" not in baseline
    assert w.caller_build_vars(caller) == {"CMAKE_BUILD_TYPE": "Debug", "CXXFLAGS": "-O0"}
    # the key: the caller's build variables, a CXX's arguments and the wrapper's bytes
    base = {k: v for k, v in os.environ.items() if k not in (*w.CALLER_BUILD_VARS, "CXX")}
    keys = {}
    for name, over in (("plain", {}), ("flags", {"CXXFLAGS": "-march=native"}), ("cxx args", {"CXX": "c++ -mavx2"})):
        r = subprocess.run([*WHEEL, "key", "--sdist-sha256", "abc"], capture_output=True, text=True, check=True,
                           env={**base, **over})
        keys[name] = json.loads(r.stdout)
    assert len({k["key"] for k in keys.values()}) == 3
    plain = keys["plain"]["facts"]
    assert plain["caller_build_vars"] == {} and plain["compiler"].startswith("c++ (")
    assert plain["compiler_wrapper"] == hashlib.sha256(w.CXX_WITHOUT_DEBUG_INFO.read_bytes()).hexdigest()[:16]
    assert keys["flags"]["facts"]["caller_build_vars"] == {"CXXFLAGS": "-march=native"}
    assert keys["cxx args"]["facts"]["compiler"] == f"{plain['compiler']} -mavx2"
    # the wrapper run with itself as the compiler stops at once with one line, not an endless exec
    r = subprocess.run([wrapper, "--version"], capture_output=True, text=True, timeout=10,
                       env={**os.environ, "RLWB_V0_CXX": wrapper})
    assert r.returncode == 2 and "leads back to this file" in r.stderr


@pytest.mark.engines
def test_the_v0_build_that_setup_made_is_this_machines_and_is_reused(tmp_path):
    """The V0 wheel that `make setup` just built (from an empty `RLWB_CACHE` on a fresh machine: `.ci/run`; a warm
    cache holds the one an earlier setup built here) is cached under this machine's key, with the AVX2 kernels and
    its full log on disk; the repo's V0 env has its stamp and runs that wheel; setup run again reuses everything in
    a readable log; and the cache lookup takes this machine's wheel, never a foreign one lying beside it. (The build
    itself is proven by `make setup` from an empty cache, which fails if it fails; building it twice cost 264 s.)"""
    from rlwb.paths import envs_dir

    cache = Path(os.environ.get("RLWB_CACHE", Path.home() / ".cache" / "rlwb")).expanduser()
    venv = envs_dir() / "vllm-v0"
    # the stamp setup.sh writes (setup_v0: what the env was built from); a stale one would make the rerun below
    # rebuild the live env under the other tests' engines: refuse instead
    stamp = subprocess.run(["bash", "scripts/setup.sh", "v0-stamp"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
    assert not (venv / ".rlwb-incomplete").exists()
    assert (venv / ".rlwb-stamp").read_text().strip() == stamp, "the V0 env is out of date: run `make setup` first"
    v0_python = str(venv / "bin" / "python")
    sdist = cache / "sdist" / "vllm-0.8.5.tar.gz"
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    here = subprocess.run([v0_python, "scripts/vllm_v0_wheel.py", "key", "--sdist-sha256", sha], cwd=REPO,
                          capture_output=True, text=True, check=True)
    key = json.loads(here.stdout)["key"]  # this machine, this env's torch, this sdist
    slot = cache / "wheels" / "vllm-0.8.5+cpu" / key
    facts = json.loads((slot / "key.json").read_text())
    assert facts["key"] == key and facts["facts"]["isa"] == os.environ.get("RLWB_V0_ISA", "avx2")
    [wheel] = slot.glob("*.whl")
    assert list((cache / "logs").glob(f"vllm-0.8.5-cpu-{key}-*.log"))  # the full build log is kept on disk
    origin = json.loads(subprocess.run(
        [v0_python, "-c", "import importlib.metadata as m; print(m.distribution('vllm').read_text('direct_url.json'))"],
        capture_output=True, text=True, check=True).stdout)
    assert origin["archive_info"]["hashes"]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    kernels = subprocess.run([v0_python, "-c", "import importlib.metadata as m; "
                              "print(m.distribution('vllm').locate_file('vllm/_C.abi3.so'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert ".debug_info" not in _sections(Path(kernels))  # built with -g0 last (vllm_v0_wheel.build)

    again = subprocess.run(["bash", "scripts/setup.sh", "v0"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "vLLM V0 env is up to date" in again.stderr and "building" not in again.stderr
    assert len(again.stderr.splitlines()) < 40, again.stderr  # a readable log, not the compiler's

    # the lookup that setup.sh makes, against a cache holding this machine's wheel and a foreign one (another
    # machine's key): this machine's is taken, nothing is built
    other = tmp_path / "cache"
    (other / "wheels" / "vllm-0.8.5+cpu").mkdir(parents=True)
    (other / "sdist").symlink_to(cache / "sdist")
    (other / "wheels" / "vllm-0.8.5+cpu" / key).symlink_to(slot)
    foreign = other / "wheels" / "vllm-0.8.5+cpu" / "0123456789abcdef"
    foreign.mkdir()
    (foreign / "vllm-0.8.5+cpu-cp311-cp311-linux_x86_64.whl").write_text("not a wheel")
    (foreign / "key.json").write_text(json.dumps({"key": "0123456789abcdef", "facts": {"isa": "avx512"}}))
    r = subprocess.run([v0_python, "scripts/vllm_v0_wheel.py", "ensure", str(other)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert Path(r.stdout.strip()) == other / "wheels" / "vllm-0.8.5+cpu" / key / wheel.name
    assert "using cached V0 wheel" in r.stderr and "building" not in r.stderr


def test_shown_names_a_path_inside_the_repo_by_its_repo_path_and_keeps_links_unresolved(tmp_path):
    """`paths.shown`, what pages, records and messages print: the repo path inside the repo (a venv's python, a
    link out of the repo, by its name in the repo, not its target), an outside path as given."""
    from rlwb.paths import REPO_ROOT, shown

    outside = tmp_path / "python3"
    outside.write_text("")
    inside = REPO_ROOT / ".venvs" / "no-such-env" / "bin" / "python"
    assert shown(inside) == ".venvs/no-such-env/bin/python"
    assert shown(outside) == str(outside)
    assert shown(REPO_ROOT / "docs" / "runs") == "docs/runs"
