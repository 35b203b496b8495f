"""Shared fixtures. Engines are real worker processes, started once per test session per preset."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RLWB = [sys.executable, "-m", "rlwb.cli"]


@pytest.fixture(scope="session")
def default_model():
    from rlwb.models import build_default_model

    return build_default_model(progress=False)


@pytest.fixture(scope="session")
def scorer(default_model):
    from rlwb.trainer import TrainerScorer

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
    from rlwb import tasks, tokenizer

    return [tokenizer.encode_prompt(p.prompt) for p in tasks.make_problems(8, seed=7)]


def pids_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            # a zombie is dead for our purposes
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    continue
            alive.append(pid)
        except (ProcessLookupError, FileNotFoundError):
            pass
    return alive


def process_group_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().split(")")[-1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out
