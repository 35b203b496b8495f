"""`rlwb figures`: a run's figures redrawn from its data/ alone."""

from __future__ import annotations


def add_figures(sub) -> None:
    r = sub.add_parser("figures", help="regenerate a run's figures from its data/ alone")
    r.add_argument("run_dir")
    r.add_argument("--style", choices=["notebook", "paper", "blog"], default="notebook",
                   help="notebook: overwrite figures/ as the notebook made them; paper/blog: figures/<style>/")
    r.set_defaults(fn=cmd_figures)


def cmd_figures(a) -> int:
    from rlwb.reports.figures import regenerate_figures

    for path in regenerate_figures(a.run_dir, a.style):
        print(path)
    return 0
