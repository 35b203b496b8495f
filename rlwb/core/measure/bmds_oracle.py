"""EPA's own BMDS engine (pybmds) as the oracle `benchmark_dose` is checked against: it pins pandas < 3, the
kernel env has pandas 3, so it runs in its own environment (`.venvs/bmds`, `scripts/setup.sh bmds`) as a
subprocess, JSON in and out (`_bmds_worker.py`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from rlwb.errors import BMDSUnavailable

BMDS_NAMES = {"linear": "Linear", "power": "Power", "exp3": "Exponential 3", "exp5": "Exponential 5",
              "hill": "Hill"}

BMDS_ENV = "bmds"  # .venvs/bmds: pybmds (pins pandas < 3, so not the kernel env), `scripts/setup.sh bmds`
_WORKER = Path(__file__).with_name("_bmds_worker.py")


def bmds_python(envs: str | Path | None = None) -> Path:
    """The interpreter of the pybmds environment (`$RLWB_ENVS`/bmds, default .venvs/bmds beside the repository);
    `BMDSUnavailable` if it is missing or its setup did not finish."""
    from rlwb.paths import envs_dir

    env = Path(envs or envs_dir()) / BMDS_ENV
    py = env / "bin" / "python"
    if not py.exists() or (env / ".rlwb-incomplete").exists() or not (env / ".rlwb-stamp").exists():
        raise BMDSUnavailable(f"no complete pybmds environment at {env}: run  make bmds  (scripts/setup.sh bmds)")
    return py


def bmds_fit(groups: dict | list[dict], *, bmr: float = 0.25, bmr_type: str = "relative",
             models=tuple(BMDS_NAMES), timeout: float = 300.0, envs=None) -> list[dict]:
    """Run EPA's BMDS engine (pybmds, in its own environment, as a subprocess: JSON in, JSON out) on one or more
    summary data sets (`Study.group_stats()`: doses with 0 first, ns, means, sds), a decreasing curve, constant
    variance, the given models with BMDS's default (restricted) settings. Per data set: {"models": {name: {bmd,
    bmdl, bmdu, aic, loglik, gof_p, params}}, "recommended": name or None}. The engine's optimizer prints to stderr;
    that is swallowed, and returned in the error if the run fails."""
    py = bmds_python(envs)
    many = isinstance(groups, list)
    req = {"datasets": groups if many else [groups], "bmr": bmr, "bmr_type": bmr_type,
           "models": [BMDS_NAMES[m] for m in models if m in BMDS_NAMES]}
    p = subprocess.run([str(py), str(_WORKER)], input=json.dumps(req), capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if p.returncode != 0:
        raise RuntimeError(f"pybmds failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError) as e:
        raise RuntimeError(f"pybmds gave no JSON ({e}); stdout tail {p.stdout[-500:]!r}; stderr tail "
                           f"{p.stderr[-2000:]}") from e
    names = {v: k for k, v in BMDS_NAMES.items()}
    for r in out:
        r["models"] = {names.get(k, k): v for k, v in r["models"].items()}
        r["recommended"] = names.get(r["recommended"], r["recommended"])
    return out if many else out[0]
