"""`rlwb rerun`: which archived run a notebook is rerun from and compared with."""

from __future__ import annotations

from pathlib import Path

from rlwb import archive
from rlwb.errors import ParamError


def latest_ok_run(root: Path, notebook: str) -> Path | None:
    runs = [r for r in archive.list_runs(root) if r["notebook"] == notebook and r.get("status") == "ok"]
    return Path(runs[0]["dir"]) if runs else None


def reference_run(run_dir: Path, notebooks: list[str]) -> Path:
    """`rerun --compare-to RUN_DIR`: a successful archived run of the one notebook being rerun."""
    from rlwb.archive import RECORD, read_record

    info = read_record(run_dir)
    if info is None:
        raise ParamError(f"--compare-to {run_dir}: not an archived run (no {RECORD})")
    if len(notebooks) != 1 or info.get("notebook") != notebooks[0]:
        raise ParamError(f"--compare-to {run_dir} is a run of {info.get('notebook')!r}: rerun exactly that notebook "
                         f"(got {notebooks})")
    if info.get("status") != "ok":
        raise ParamError(f"--compare-to {run_dir}: its status is {info.get('status')!r}, not ok")
    return run_dir.resolve()
