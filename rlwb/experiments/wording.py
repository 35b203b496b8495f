"""How rlwb words what it found, in one place: the phrases the notebooks' conclusions and one-line answers share.

Experiments compute; the sentences that state a verdict (an interval, a warning, a paired gap, the one-line answer
cut from a conclusion) are written here, so that every notebook says the same thing the same way. Imports nothing
of rlwb above the leaf utilities.
"""

from __future__ import annotations

import numpy as np

from rlwb.formatting import KL_FLOOR, metric


def one_line(markdown: str, limit: int = 320) -> str:
    """The first paragraph of `markdown` that does not describe the setup, as plain text of at most `limit`
    characters (cut at a word)."""
    import re

    paras = [p.strip() for p in re.split(r"\n\s*\n|\n(?=[-*] )", markdown or "") if p.strip()]
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


def paired_gap_text(r) -> str:
    """A row's paired gap to its clean twin with its 95% interval, then the same for the trained policy's own greedy
    accuracy (notebook 08's dose and point rows)."""
    return (f"{r.gap:+.3f} [{r.gap_ci_low:+.3f}, {r.gap_ci_high:+.3f}], own greedy accuracy "
            f"{r.heldout_gap:+.3f} [{r.heldout_gap_ci_low:+.3f}, {r.heldout_gap_ci_high:+.3f}]")
