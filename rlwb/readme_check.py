"""`rlwb readme-check`: the numbers the README and docs/ quote, recomputed from the archived runs they cite.

Why: a README number outlives the run it came from. Each table or paragraph that quotes measured numbers names
its run in an HTML comment (invisible when the Markdown is rendered), and each quoted number names the metric it
is, right after it:

    <!-- rlwb:run 06_engine_knobs/20261123-092336 build a62e40a6ea9f6d69 -->
    | `bf16` | 3.7e-05<!--=bf16/k3_mean--> [...] | 77%<!--=bf16/same_tokens_frac--> | ...

`<stem>/<run id>` is an archived run, `outputs/<stem>/<run id>*` (the id is the directory's time stamp, its
params hash may follow); `bench/<run id>` is an `rlwb bench` run (`outputs/bench/<run id>/bench.json`; published
as a run of record like a notebook run, `docs/runs/bench/<run id>/`). `build`
(optional) is the weights checksum of the model the run must have used. A run declaration holds for the annotated
numbers after it until the next one; `<!-- rlwb:run none -->` ends it. The metric is a key of the run's
`metrics.json` (or `bench.json`); a number ending in `%` quotes the metric times 100. Code (inline `...` and
fenced blocks) is not read, so the README can show the format.

A quoted number matches when the metric rounds to it at the precision it is quoted with (3.7e-05 stands for
anything in [3.65e-05, 3.75e-05]). Per number: `match`; `mismatch` (the run is here and says otherwise, or lacks
the metric, failed, or used another model build); `missing` (the run is not archived on this machine: nothing to
check against); `stale` (it matches its run, but the newest run of that notebook here says otherwise; for a run of
record, the newest run of record of the same params hash: runs of record with other params answer other
questions). The exit code is 1 only for a mismatch; a README annotation that names no run is bad input
(ValueError: exit 2).

By default the command reads `README.md` and every `docs/**/*.md` (`documents`): the README is a front page and
the numbers live in `docs/results/`, so each page is read on its own (a run declared in one file does not hold in
the next) and each verdict names its file. A cited run is looked for in the archive, then in the runs of record
(`docs/runs/`, tracked: `rlwb publish`).

`--clean-clone` (`check_clean_clone`) is what a reader with nothing but the repository gets: a `git clone` of the
committed tree, its documents checked against the runs of record in that clone alone, and any number that is not a
match (a mismatch, or a run that is not shipped) fails. That is what the suite asserts, so a number that no longer
matches its run, or a citation of a run not published, fails CI.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlwb import archive

RUN = re.compile(r"<!--\s*rlwb:run\s+(?P<run>\S+)(?:\s+build\s+(?P<build>[0-9a-f]+))?\s*-->")
# a number (sign, thousands separators, decimals, exponent), an optional unit, optional bold, then <!--=metric-->
# a metric key may hold spaces (notebook 08's `contrast/one-sided vs symmetric/...`), not `<`, `>` or a line break
QUOTE = re.compile(r"(?P<num>[−+-]?\d[\d,]*(?:\.\d+)?(?:e[+−-]?\d+)?)(?P<unit>%|×|\s?s)?\**"
                   r"<!--=(?P<key>[^\s<>](?:[^<>\n]*[^\s<>])?)-->")


@dataclass(frozen=True)
class Quote:
    line: int  # 1-based line of the README
    run: str  # "<stem>/<run id>" or "bench/<run id>"
    build: str | None
    key: str
    text: str  # the number as quoted, unit included
    value: float  # what it says the metric is (a percentage already divided by 100)
    half_unit: float  # half a unit in its last quoted digit (the same scale as `value`)
    file: str | None = None  # the file it is quoted in, repository-relative (None: the one file checked)


@dataclass(frozen=True)
class Verdict:
    quote: Quote
    status: str  # match | mismatch | missing | stale
    detail: str


CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def _without_code(text: str) -> str:
    """`text` with its code spans and blocks blanked out, lines and offsets kept."""
    return CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def parse(text: str, name: str | None = None) -> list[Quote]:
    """Every annotated number of `text` (outside code) with the run declared before it; `name` is the file's, for
    the quotes and the error of a number whose run is not declared."""
    text = _without_code(text)
    events = sorted([(m.start(), "run", m) for m in RUN.finditer(text)]
                    + [(m.start(), "quote", m) for m in QUOTE.finditer(text)], key=lambda e: e[0])
    quotes, run, build = [], None, None
    for pos, kind, m in events:
        if kind == "run":
            run, build = (None, None) if m["run"] == "none" else (m["run"], m["build"])
            continue
        line = text.count("\n", 0, pos) + 1
        if run is None:
            raise ValueError(f"{name or 'README'} line {line}: {m.group(0)!r} quotes a metric but no "
                             f"`<!-- rlwb:run ... -->` declares the run it came from")
        num = m["num"].replace(",", "").replace("−", "-")
        mantissa, _, exp = num.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        scale = 100.0 if m["unit"] == "%" else 1.0
        half = 0.5 * 10.0 ** (int(exp or 0) - decimals) / scale
        quotes.append(Quote(line, run, build, m["key"], m.group(0).split("<!--")[0].strip("*"),
                            float(num) / scale, half, name))
    return quotes


def _roots(outputs: Path | Sequence[Path]) -> list[Path]:
    return [Path(outputs)] if isinstance(outputs, (str, Path)) else [Path(o) for o in outputs]


def _run_dir(outputs: Path | Sequence[Path], run: str) -> Path | None:
    """The cited run's directory in the first of `outputs` (archive roots, in order) that has it."""
    stem, _, run_id = run.partition("/")
    if not run_id:
        raise ValueError(f"README cites run {run!r}: write it as <notebook stem>/<run id> or bench/<run id>")
    for root in _roots(outputs):
        found = sorted(d for d in (root / stem).glob(f"{run_id}*") if d.is_dir()
                       and (d.name == run_id or d.name.startswith(f"{run_id}-")))
        if found:
            return found[-1]
    return None


def _values(run_dir: Path) -> dict:
    bench = run_dir / "bench.json"
    return archive.read_json(bench if bench.exists() else run_dir / "metrics.json", {})


def _build(run_dir: Path) -> str | None:
    info = archive.read_record(run_dir, {})
    return (info.get("model") or {}).get("weights_sha256_16") or (_values(run_dir).get("model") or {}).get(
        "weights_sha256_16")


def _newest(run: str, cited: Path) -> Path | None:
    """The newest finished run of the same notebook on the same model build as the cited one (a run of another
    model answers another question: it cannot make a number stale); for the bench, its newest directory."""
    info = archive.read_record(cited, {}) or {}
    # a run of record is superseded only by a newer run of record of the same computation (same params hash): two of
    # one notebook with other params answer two questions (08's study and its one-sided follow-up)
    same = info.get("params_hash") if "published" in info else None
    stem, outputs = run.partition("/")[0], cited.parent.parent  # the archive the cited run is in
    if stem == archive.BENCH:  # a finished bench (one from before benches had a run.json: no status)
        runs = sorted(d for d in (outputs / stem).iterdir() if (d / "bench.json").exists()
                      and archive.read_record(d, {}).get("status") in (None, "ok"))
    else:
        build = _build(cited)
        runs = sorted(d for d in (outputs / stem).iterdir() if d.is_dir() and not d.name.startswith(".")
                      and (r := archive.read_record(d, {}) or {}).get("status") == "ok"
                      and _build(d) == build and (same is None or r.get("params_hash") == same))
    newest = runs[-1] if runs else None
    return None if newest is None or newest.resolve() == cited.resolve() else newest


def _agrees(q: Quote, v) -> bool:
    return isinstance(v, (int, float)) and abs(float(v) - q.value) <= q.half_unit * (1 + 1e-9) + 1e-300


def documents(root: Path) -> list[Path]:
    """The files `rlwb readme-check` reads by default: `README.md` first, then every `docs/**/*.md`, sorted."""
    return [root / "README.md"] + sorted((root / "docs").glob("**/*.md"))


def check(readme: Path, outputs: Path | Sequence[Path], name: str | None = None) -> list[Verdict]:
    """A verdict for every annotated number of `readme`, against the runs under `outputs` (one archive root, or
    several searched in order); `name` (the file's repository-relative path) goes into each quote and into the error
    of a malformed annotation."""
    out = []
    for q in parse(readme.read_text(), name):
        try:
            d = _run_dir(outputs, q.run)
        except ValueError as e:
            raise ValueError(f"{q.file or 'README'} line {q.line}: {e}") from None
        if d is None:
            out.append(Verdict(q, "missing", f"{q.run} is not archived under "
                                             f"{' or '.join(str(r) for r in _roots(outputs))}"))
            continue
        info = archive.read_record(d, {})
        got = _values(d).get(q.key)
        problem = None
        if info and info.get("status") not in (None, "ok"):
            problem = f"the run's status is {info.get('status')!r}"
        elif q.build and (built := _build(d)) != q.build:
            problem = f"the run used model build {built}, the README says {q.build}"
        elif got is None:
            problem = f"{q.key} is not in the run"
        elif not _agrees(q, got):
            problem = f"the run says {got:.6g}"
        if problem:
            out.append(Verdict(q, "mismatch", problem))
            continue
        newer = _newest(q.run, d)
        now = _values(newer).get(q.key) if newer is not None else None
        if now is not None and not _agrees(q, now):
            out.append(Verdict(q, "stale", f"matches its run ({got:.6g}); the newest run here, {newer.name}, says "
                                            f"{now:.6g}"))
        else:
            out.append(Verdict(q, "match", f"{got:.6g}"))
    return out


def check_all(root: Path, outputs: Path | Sequence[Path]) -> list[Verdict]:
    """The verdicts of every file of `documents(root)`, in that order, each quote naming its file."""
    return [v for path in documents(root) for v in check(path, outputs, path.relative_to(root).as_posix())]


def check_clean_clone(repo: Path, runs_of_record: str = "docs/runs") -> list[Verdict]:
    """`check_all` on a fresh `git clone` of `repo` (its committed HEAD: what a reader gets), against the runs of
    record in the clone (`runs_of_record`, relative to its root) and nothing else. The clone is removed after."""
    with tempfile.TemporaryDirectory(prefix="rlwb-clean-clone-") as tmp:
        clone = Path(tmp) / "clone"
        r = subprocess.run(["git", "clone", "--quiet", str(repo), str(clone)], capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0:
            raise ValueError(f"cannot clone {repo}: {r.stderr.strip()}")
        verdicts = check_all(clone, [clone / runs_of_record])
        # the details name the temporary clone's paths: say the repository's instead
        return [Verdict(v.quote, v.status, v.detail.replace(str(clone), "<clone>")) for v in verdicts]


def report(verdicts: list[Verdict], readme_name: str = "README.md") -> str:
    """One line per quoted number (prefixed with its file, `readme_name` where the quote names none), then the
    counts and the runs this machine does not have."""
    lines = [f"{v.quote.file or readme_name}:{v.quote.line}  {v.status:<8}  {v.quote.run}  {v.quote.key} = "
             f"{v.quote.text}  ({v.detail})" for v in verdicts]
    counts = {s: sum(v.status == s for v in verdicts) for s in ("match", "mismatch", "stale", "missing")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(verdicts)} quoted numbers")
    absent = sorted({v.quote.run for v in verdicts if v.status == "missing"})
    if absent:
        lines.append("not archived here (regenerate to check): " + ", ".join(absent))
    return "\n".join(lines)
