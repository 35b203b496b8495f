"""Where things live: the repo, the model cache and the outputs archive.

Kept in one place so the CLI, the notebooks and the tests agree. Environment variables win over
defaults so CI and fresh clones can share a cache (`RLWB_CACHE`) and archive elsewhere (`RLWB_OUTPUTS`).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
PARAMS_DIR = REPO_ROOT / "params"
RUNS_OF_RECORD = REPO_ROOT / "docs" / "runs"  # tracked: the runs the README and docs/ cite (`rlwb publish`)


def cache_dir() -> Path:
    """Model cache: built default policies keyed by recipe hash. Shared across clones."""
    return Path(os.environ.get("RLWB_CACHE", Path.home() / ".cache" / "rlwb")).expanduser()


def envs_dir() -> Path:
    """Environments beside the kernel (`scripts/setup.sh`): engines and the peer oracles. `RLWB_ENVS` wins;
    a relative value is relative to the repo, as setup.sh reads it."""
    p = Path(os.environ.get("RLWB_ENVS", ".venvs")).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def outputs_dir(override: str | os.PathLike | None = None) -> Path:
    """Archive root: `--outputs` beats `RLWB_OUTPUTS` beats `<repo>/outputs`."""
    if override:
        return Path(override).expanduser().resolve()
    env = os.environ.get("RLWB_OUTPUTS")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "outputs"


def shown(path: str | os.PathLike) -> str:
    """A path as pages, records and messages name it: relative to the repo root inside the repo (the same in any
    checkout: a committed page must not name one machine's path), else as given. Not resolved: a venv's
    `bin/python` links out of the repo, and its name in the repo is the one to show (callers resolve first where
    the real file is meant)."""
    p = Path(path)
    return p.relative_to(REPO_ROOT).as_posix() if p.is_relative_to(REPO_ROOT) else str(p)


def repo_path(value: str | os.PathLike) -> Path:
    """A path given in params (a prompts file, an archived run): absolute as it is, relative from the repo root
    (the notebook's kernel runs in `notebooks/`, so the invoking directory is gone by then; `rlwb audit` and
    `rlwb rescore` make the paths a user types absolute first)."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p
