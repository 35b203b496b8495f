"""A virtual environment that sees only what the GPU machine's image holds: the packages of
`image_packages.txt`, linked from the interpreter that runs this script (the kernel's .venv), nothing else.

Why: the device has no package registry, so whatever `scripts/gpu_runs.sh` needs beyond its image must travel as a
wheel (`wheels.txt`). Running the script's CPU rehearsal in this view proves the list complete before a GPU is lent:
an import the image lacks fails here as it would there. The versions are the kernel's (torch 2.13 here against the
image's 2.11; Python 3.11 against 3.12), so it checks names, not versions.

    .venv/bin/python scripts/device/image_venv.py .venvs/device-image [--tree .venvs/device-tree]

`--tree` also copies the working tree as the device gets it (tracked and untracked-not-ignored files, so no .venv,
.venvs or outputs; docs/runs left out, which nothing there reads): a run from that copy cannot find the kernel
env or an engine env by a repo path, as on the device (the first lent run found an engine preset naming
.venv/bin/python that way).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = HERE / "image_packages.txt") -> set[str]:
    return {norm(line.strip()) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def requirements(dist: md.Distribution, extras: frozenset[str] = frozenset(), python: str = "3.12"
                 ) -> set[tuple[str, frozenset[str]]]:
    """(name, extras) a distribution requires on Linux under CPython `python` (the device's 3.12), with the
    requirements of the `extras` asked of it (nbconvert asks for `bleach[css]`, which brings tinycss2)."""
    from packaging.requirements import Requirement

    env = {"python_version": ".".join(python.split(".")[:2]), "python_full_version": python,
           "sys_platform": "linux", "platform_system": "Linux", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "platform_machine": "x86_64", "os_name": "posix"}
    out = set()
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in {"", *extras}):
            out.add((norm(req.name), frozenset(req.extras)))
    return out


def requirement_names(dist: md.Distribution) -> set[str]:
    return {name for name, _ in requirements(dist)}


def with_dependencies(names: set[str], installed: dict[str, md.Distribution], never: set[str]) -> set[str]:
    """`names` and, transitively, what their installed versions require: on the device pip installed the image's
    packages with their own requirements, so those are there, whatever their names in these versions. `never`
    (rlwb's own requirements the image does not name) stays out: KINDS.md's list is the image's whole `pip list`,
    so those are absent there even where a newer version of an image package here requires one (typer, pydantic)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(n, frozenset()) for n in names if n in installed]
    while todo:
        item = todo.pop()
        if item in seen:
            continue
        seen.add(item)
        todo += [r for r in requirements(installed[item[0]], item[1])
                 if r[0] in installed and r[0] not in never and r not in seen]
    return {n for n, _ in seen}


def top_level_entries(dist: md.Distribution) -> set[str]:
    """The site-packages entries a distribution owns (its packages, modules and .dist-info), not its scripts."""
    out = set()
    for f in dist.files or []:
        parts = Path(str(f)).parts
        if parts and parts[0] != ".." and parts[0] != "__pycache__":
            out.add(parts[0])
    return out


def _replace(target: Path) -> None:
    """Remove `target` to rebuild it, refusing anything that holds a git repository (a mistyped path)."""
    if target.exists():
        if (target / ".git").exists() or any(p.name == ".git" for p in target.iterdir()):
            raise SystemExit(f"{target} holds a git repository: not removing it")
        shutil.rmtree(target)


def build(target: Path) -> Path:
    _replace(target)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = next((target / "lib").glob("python3*/site-packages"))
    installed = {norm(d.metadata["Name"]): d for d in md.distributions()}
    image = image_packages()
    wanted = with_dependencies(image, installed, requirement_names(installed["rlwb"]) - image)
    linked = set()
    for name in sorted(wanted):
        dist = installed[name]
        root = Path(dist.locate_file(""))
        for entry in top_level_entries(dist):
            src, dst = root / entry, site / entry
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
        linked.add(norm(dist.metadata["Name"]))
    print(f"{target}: {len(image & linked)} of the image's {len(image)} packages found in {sys.prefix} and linked, "
          f"with {len(linked - image)} they require")
    return target


def device_tree(dest: Path, repo: Path = HERE.parent.parent) -> Path:
    """The working tree the device gets, copied to `dest` (docs/runs, the shipped runs, left out)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=repo, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    _replace(dest)
    for f in files:
        src = repo / f
        if not f or f.startswith("docs/runs/") or not src.is_file():
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / f)
    return dest


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("venv", nargs="?", default=".venvs/device-image", type=Path)
    ap.add_argument("--tree", type=Path, help="also copy the working tree as the device gets it here")
    a = ap.parse_args()
    build(a.venv)
    if a.tree:
        print(f"{device_tree(a.tree)}: the working tree as the device gets it")
