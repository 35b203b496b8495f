"""`rlwb bench`: throughput and overhead ratios, archived as a run."""

from __future__ import annotations

import sys

from rlwb.errors import RunFailed


def add_bench(sub) -> None:
    r = sub.add_parser("bench", help="throughput and overhead ratios, archived with a run's provenance "
                                     "(outputs/bench/<UTC start>/: publishable with `rlwb publish`)")
    r.add_argument("--quick", action="store_true", help="fewer batch sizes and repeats (a few minutes)")
    r.add_argument("--outputs")
    r.set_defaults(fn=cmd_bench)


def cmd_bench(a) -> int:
    """The bench's table, then its run directory (the last line of stdout, a failed run's too: it is archived as
    failed, its error on stderr, exit 1), as `rlwb run` does."""
    from rlwb.bench import throughput as bench
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
