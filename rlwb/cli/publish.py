"""`rlwb publish RUN`: an archived run into the repository's runs of record (rlwb/publish.py says what is refused),
then the folder's index page rebuilt (`rlwb index` over it: every run of record's report one click away)."""

from __future__ import annotations

from pathlib import Path


def add_publish(sub) -> None:
    r = sub.add_parser("publish", help="copy an archived run into the repository's runs of record (docs/runs/); "
                                       "refuses a failed run, a dirty tree, a model build without a published "
                                       "checksum, a run over 5 MB")
    r.add_argument("run_dir", help="an archived run, e.g. outputs/00_default_policy/20261125-221500-ab12cd34 or "
                                   "outputs/bench/20261126-090000")
    r.add_argument("--to", help="the runs-of-record folder (default: docs/runs)")
    r.set_defaults(fn=cmd_publish)


def cmd_publish(a) -> int:
    from rlwb import archive
    from rlwb.publish import PUBLISHED_RUNS, publish, tree_bytes
    from rlwb.reports.index import build_index

    root = Path(a.to) if a.to else PUBLISHED_RUNS
    target = publish(a.run_dir, root)
    index = build_index(root)
    left = (archive.read_record(target, {}).get("published") or {}).get("left_out") or []
    for c in left:
        print(f"left out {c['path']} ({c['bytes'] / 1e3:.0f} kB): {c['why']}")
    print(f"published: {tree_bytes(target) / 1e6:.2f} MB; {root}: {tree_bytes(root) / 1e6:.2f} MB in all; "
          f"index: {index}")
    print(target)
    return 0
