"""`rlwb sync-params`, `readme-check`, `bench`: keeping notebooks, params and the README honest; the bench."""

from __future__ import annotations

from pathlib import Path


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
    from rlwb.paths import REPO_ROOT, RUNS_OF_RECORD, outputs_dir

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


def cmd_bench(a) -> int:
    """The bench's table, then its run directory (the last line of stdout, a failed run's too: it is archived as
    failed, its error on stderr, exit 1), as `rlwb run` does."""
    import sys

    from rlwb.bench import throughput as bench
    from rlwb.errors import RunFailed
    from rlwb.paths import outputs_dir

    try:
        out = bench.run(outputs_dir(a.outputs), quick=a.quick)
    except RunFailed as e:
        print(f"rlwb bench: {e.error}", file=sys.stderr)
        print(e.run_dir)
        return 1
    print((out / "bench.md").read_text())
    print(out)
    return 0
