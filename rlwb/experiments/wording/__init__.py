"""How rlwb words what it found: the phrases several notebooks' conclusions and one-line answers share (the
one-line answer cut from a conclusion, an interval, the warning for an engine off its float floor); each notebook's
own sentences are in its module here, named as its experiment.

Experiments compute; the sentences that state a verdict are written in this package, so that every notebook says
the same thing the same way. Imports nothing of rlwb above the leaf utilities.
"""

from __future__ import annotations

import numpy as np

from rlwb.formatting import KL_FLOOR, metric


def one_line(markdown: str, limit: int = 320, leads: tuple[str, ...] = ()) -> str:
    """The conclusion's finding as plain text of at most `limit` characters (cut at a word): the first paragraph that
    starts with one of `leads` (a notebook's finding, tried in the order given; Markdown emphasis ignored), else the
    first paragraph that does not describe the setup. Why `leads`: a conclusion states its setup and per-arm detail
    before its verdict (01: each engine before the ladder's floor; 03: skipped arms before the paired gaps), and the
    index's answer column must open with the verdict."""
    import re

    paras = [p.strip() for p in re.split(r"\n\s*\n|\n(?=[-*] )", markdown or "") if p.strip()]
    plain = [re.sub(r"\*\*|__", "", p) for p in paras]
    para = next((p for lead in leads for p, t in zip(paras, plain) if t.startswith(lead)), None)
    if para is None:
        para = next((p for p in paras if not re.match(r"\*\*(Setup|How)\b", p)), paras[0] if paras else "")
    text = re.sub(r"\*\*|__|`|^[-*#>]+\s*", "", para, flags=re.M)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


def ci_text(metrics: dict, group: str, name: str, fmt: str = ".1e") -> str:
    """`[low, high]` of `group/name`'s 95% interval (bounds at the float floor read as such), or "" when the
    metrics have none."""
    lo, hi = metrics.get(f"{group}/{name}_ci_low"), metrics.get(f"{group}/{name}_ci_high")
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return ""
    return f"[{metric(name, lo, fmt)}, {metric(name, hi, fmt)}]"


def floor_lines(metrics: dict) -> list[str]:
    """The report's warning for every `floor_breach_k3` in `metrics`."""
    return [f"**Warning:** `{k.rsplit('/', 1)[0]}` runs fp32 weights and reports processed logprobs, so it should sit "
            f"at the float floor against the fp32 trainer, yet measured per-step k3 up to {v:.1e} (> {KL_FLOOR:g}) in "
            f"this run: its engine did not reproduce its float floor here, and these runs measure other numerics than "
            f"its name says." for k, v in metrics.items() if k.endswith("/floor_breach_k3")]
