"""environment.yml (conda) and pyproject.toml (pip) must list the same kernel dependencies."""

import re
from pathlib import Path

import tomllib
import yaml

REPO = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def test_conda_and_pip_lists_agree():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_reqs = [r for r in pip_section if not r.startswith("-e")]
    assert sorted(map(str.strip, conda_reqs)) == sorted(map(str.strip, deps))
    assert {_name(r) for r in conda_reqs} == {_name(r) for r in deps}
    assert "python=3.11" in env["dependencies"]
