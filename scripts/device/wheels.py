"""The wheels `scripts/gpu_runs.sh` carries to the GPU machine: what running and archiving a notebook needs
(papermill, nbconvert, ipykernel, pydantic, ...) that the device image lacks (`image_packages.txt`), with every
requirement of theirs the image does not hold, at the versions the kernel's .venv had when the list was written (the
ones the rehearsal installs and tests; another machine's .venv may resolve other versions, which must admit these).

    python scripts/device/wheels.py list                 # the names and versions, from .venv (what wheels.txt holds)
    python scripts/device/wheels.py write                # rewrite wheels.txt from `list` (after an upgrade)
    python scripts/device/wheels.py download DIR [--python 3.12]   # fetch them from PyPI for that CPython
                                                                     # (3.12: the device; the rehearsal: this one)
    python scripts/device/wheels.py pinned DIR           # the pinned wheels in DIR (exit 1 naming any missing)

The list is computed, not hand-kept: tests/test_gpu_runs.py checks wheels.txt's names against `list` and its
versions against the env's requirements (`excluded`), and the CPU rehearsal installs exactly these into a view of
the image (`image_venv.py`) and runs the whole script there. The kernel env itself is installed under these pins
(scripts/setup.sh: `pip install -e . -c wheels.txt`), so another machine's index cannot resolve other versions of
them (CI's once resolved platformdirs 4.4.0 where the pin was 4.14.8); to upgrade one, edit its pin, run `make
setup` and `wheels.py write`.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import image_venv  # noqa: E402

HERE = Path(__file__).resolve().parent
WHEELS_TXT = HERE / "wheels.txt"
# what a run needs beyond the image: the notebook runner and its kernel, the HTML report, params validation
ROOTS = {"papermill", "nbconvert", "nbformat", "nbclient", "ipykernel", "pydantic", "filelock"}
# requirements a run does not need, left behind to keep the carried tree under the device's 64 MiB (the tracked
# tree, runs of record included, is ~52 MB): ipykernel runs without its debugger (`_is_debugpy_available` False)
# and IPython without jedi's completion (`JEDI_INSTALLED` False); the rehearsal runs the kernel without them
LEFT_OUT = {"debugpy": "ipykernel's debugger", "jedi": "IPython's tab completion", "parso": "jedi's parser"}
HEADER = ("# Written by `python scripts/device/wheels.py write` (tests/test_gpu_runs.py checks it): the wheels the\n"
          "# GPU machine needs beyond its image (image_packages.txt), at the kernel .venv's versions; left out on\n"
          "# purpose: debugpy, jedi, parso (wheels.py LEFT_OUT).\n")
# what the pinned cp312 wheels weigh (`make gpu-wheels` fetched them: 44 files, 2026-11-27); the device carries them
# beside the tracked tree, 64 MiB in all (tests/test_gpu_runs.py keeps the two under it)
WHEELS_BYTES_CP312 = 8_176_118
DEVICE_TREE_LIMIT = 64 * 2**20
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_26_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64"]


def needed() -> dict[str, str]:
    """{name: version} of the wheels to carry, from the installed distributions of this interpreter (.venv)."""
    installed = {image_venv.norm(d.metadata["Name"]): d for d in md.distributions()}
    image = image_venv.image_packages()
    on_device = image_venv.with_dependencies(image, installed,
                                             image_venv.requirement_names(installed["rlwb"]) - image)
    names = image_venv.with_dependencies(ROOTS, installed, set(LEFT_OUT)) - on_device
    return {n: installed[n].version for n in sorted(names)}


def excluded(pins: dict[str, str]) -> list[str]:
    """The pins that a requirement of the kernel env's distributions excludes ("pkg==v: req (of dist)"). The names
    carried are fixed by the env's requirements; the versions are the ones wheels.txt pins and the rehearsal tests,
    and a machine whose index offers other versions (CI's mirror resolved platformdirs 4.4.0 where this one has
    4.14.8) installs others into .venv: a pin stays good while every requirement on it admits it."""
    from packaging.requirements import Requirement

    out = []
    for dist in md.distributions():
        for line in dist.requires or []:
            req = Requirement(line)
            name = image_venv.norm(req.name)
            if (name in pins and not req.specifier.contains(pins[name], prereleases=True)
                    and (req.marker is None or req.marker.evaluate({"extra": ""}))):
                out.append(f"{name}=={pins[name]}: {req} (of {dist.metadata['Name']} {dist.version})")
    return sorted(out)


def listed(path: Path = WHEELS_TXT) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[image_venv.norm(name)] = version
    return out


def pinned(folder: Path) -> tuple[list[Path], list[str]]:
    """(the wheels in `folder` that wheels.txt pins, the pins with no wheel there): what scripts/gpu_runs.sh installs
    (a folder left from an older list may hold two versions of one package) and what it must refuse to start without."""
    pins = listed()
    have = {(image_venv.norm(w.name.split("-")[0]), w.name.split("-")[1]): w for w in sorted(folder.glob("*.whl"))}
    return ([w for (n, v), w in have.items() if pins.get(n) == v],
            [f"{n}=={v}" for n, v in pins.items() if (n, v) not in have])


def download(dest: Path, python: str) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{n}=={v}" for n, v in listed().items()]
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest),
            "--python-version", python, "--implementation", "cp"]
    for p in PLATFORMS:
        args += ["--platform", p]
    subprocess.run(args + pins, check=True)
    return sorted(dest.glob("*.whl"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    sub.add_parser("write")
    d = sub.add_parser("download")
    d.add_argument("dest", type=Path)
    d.add_argument("--python", default="3.12", help="CPython version the wheels are for (device: 3.12)")
    pn = sub.add_parser("pinned", help="print the pinned wheels in DIR; exit 2 naming any pin without one")
    pn.add_argument("dir", type=Path)
    a = ap.parse_args()
    if a.cmd == "list":
        for n, v in needed().items():
            print(f"{n}=={v}")
    elif a.cmd == "pinned":
        found, missing = pinned(a.dir)
        if missing:
            sys.exit(f"wheels missing from {a.dir}/ (make gpu-wheels fetches them): {' '.join(missing)}")
        print(" ".join(map(str, found)))
    elif a.cmd == "write":
        pins = needed()
        WHEELS_TXT.write_text(HEADER + "".join(f"{n}=={v}\n" for n, v in pins.items()))
        print(f"{WHEELS_TXT}: {len(pins)} wheels")
    else:
        wheels = download(a.dest, a.python)
        size = sum(w.stat().st_size for w in wheels)
        print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {a.dest}")


if __name__ == "__main__":
    main()
