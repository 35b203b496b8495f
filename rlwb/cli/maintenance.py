"""`rlwb sync-params`, `rlwb readme-check`: keeping the notebooks' parameters cells, the params files and the
numbers README.md and docs/ quote true to their sources."""

from __future__ import annotations

from pathlib import Path

from rlwb.paths import REPO_ROOT


def add_sync_params(sub) -> None:
    r = sub.add_parser("sync-params", help="write every notebook's parameters cell and params/<stem>/default.yaml "
                                           "from the schemas (rlwb/params/schemas/)")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    r.set_defaults(fn=cmd_sync_params)


def add_readme_check(sub) -> None:
    r = sub.add_parser("readme-check", help="recompute README.md's and docs/'s quoted numbers from the runs they cite: "
                                            "match / mismatch / stale / missing (exit 1 on a mismatch)")
    r.add_argument("--readme", help="one Markdown file (default: the repository's README.md and every docs/**/*.md)")
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs; then docs/runs)")
    r.add_argument("--clean-clone", nargs="?", const=str(REPO_ROOT), metavar="REPO",
                   help="check a fresh git clone of REPO (default: this repository's committed HEAD) against its runs "
                        "of record alone; exit 1 unless every number matches")
    r.set_defaults(fn=cmd_readme_check)


def cmd_sync_params(a) -> int:
    from rlwb.params.cells import sync

    changed = sync(write=not a.check)
    for path in changed:
        print(f"{'out of date' if a.check else 'wrote'}: {path}")
    if not changed:
        print("parameters cells and default.yaml files match the schemas")
    return 1 if (a.check and changed) else 0


def cmd_readme_check(a) -> int:
    from rlwb import readme_check
    from rlwb.paths import RUNS_OF_RECORD, outputs_dir

    if a.clean_clone:  # what a reader with a clone can check: every number must match a shipped run
        verdicts = readme_check.check_clean_clone(Path(a.clean_clone))
        print(readme_check.report(verdicts))
        return 1 if any(v.status in ("mismatch", "missing") for v in verdicts) else 0
    roots = [outputs_dir(a.outputs), RUNS_OF_RECORD]  # the archive here, then the runs of record
    if a.readme:  # one file, as named
        readme = Path(a.readme)
        verdicts = readme_check.check(readme, roots)
        print(readme_check.report(verdicts, readme.name))
    else:  # README.md and every docs/**/*.md, each line naming its file
        verdicts = readme_check.check_all(REPO_ROOT, roots)
        print(readme_check.report(verdicts))
    return 1 if any(v.status == "mismatch" for v in verdicts) else 0
