"""The README is a front page and the rest lives in docs/: every relative link and image of README.md and
docs/**/*.md resolves to a file of the repository (anchors stripped; web and mail links not followed), the README
stays a front page (at most 250 lines), and its table of notebooks is the registry's (`rlwb.registry.NOTEBOOKS`:
each notebook's question, its results page and its command). Fast: no notebook, no engine."""

import re
from pathlib import Path

import pytest

from rlwb import readme_check
from rlwb.registry import NOTEBOOKS

REPO = Path(__file__).resolve().parent.parent
PAGES = readme_check.documents(REPO)
# [text](target) and ![alt](target), with an optional "title"; <img src="target">; reference definitions [x]: target
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG = re.compile(r"<img\b[^>]*\bsrc=[\"']([^\"']+)[\"']", re.I)
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s.*)?$", re.M)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def targets(text: str) -> list[str]:
    """The link and image targets of a Markdown text, outside code."""
    text = CODE.sub("", text)
    return [m.group(1) for rx in (INLINE, IMG, REFDEF) for m in rx.finditer(text)]


def relative(target: str) -> str | None:
    """The path part of a relative target; None for a web, mail or in-page link."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
        return None
    return target.split("#", 1)[0].split("?", 1)[0] or None


def test_the_pages_read_are_the_readme_then_every_docs_page():
    assert PAGES[0] == REPO / "README.md"
    assert PAGES[1:] == sorted((REPO / "docs").glob("**/*.md"))
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"docs/architecture.md", "docs/setup.md", "docs/testing.md"} <= names
    assert {f"docs/results/{stem}.md" for stem in NOTEBOOKS} <= names  # one results page per notebook


def test_the_link_finder_finds_links_images_and_skips_code_and_the_web():
    text = ('[a](x.md#part) ![b](img/y.png "title") <img src="z.png" width=3> [c](https://e.org/q) [d](#top)\n'
            '[ref]: docs/w.md\n`[not](code.md)`\n```\n![nor](block.png)\n```\n[e](mailto:a@b.c)')
    assert [relative(t) for t in targets(text) if relative(t)] == ["x.md", "img/y.png", "z.png", "docs/w.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_image_resolves(page):
    broken = [t for t in targets(page.read_text()) if (rel := relative(t)) and not (page.parent / rel).exists()]
    assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"


def test_the_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_the_readme_lists_every_notebook_as_the_registry_declares_it():
    """One line per notebook: its question (the registry's words), its results page, its command."""
    readme = (REPO / "README.md").read_text()
    for stem, nb in NOTEBOOKS.items():
        rows = [ln for ln in readme.splitlines() if ln.startswith(f"| [`{stem}`](docs/results/{stem}.md) |")]
        assert len(rows) == 1, f"README: one row for {stem}, found {len(rows)}"
        assert f"| {nb.question} |" in rows[0], f"README's question for {stem} is not the registry's"
        assert f"`.venv/bin/rlwb run notebooks/{stem}.ipynb -f params/{stem}/default.yaml`" in rows[0]
    listed = re.findall(r"^\| \[`(\d\d_[a-z0-9_]+)`\]", readme, re.M)
    assert listed == list(NOTEBOOKS), "README's notebooks are the registry's, in its order"
