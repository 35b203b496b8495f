"""The suite's own machinery: the pytest-xdist groups that keep each session engine, server and shared run on one
worker (tests/conftest.py `XDIST_GROUPS`). A group that names no fixture would leave its tests spread over both
workers, each making its own engines (memory) and shared runs (time), with no test failing: these tests fail
instead."""

import ast
from pathlib import Path

import pytest

from tests import conftest
from tests.test_notebooks import SHARED_SMOKE, SMOKE


def shared_fixtures() -> set[str]:
    """The names of the session- and module-scoped fixtures tests/conftest.py defines."""
    tree = ast.parse(Path(conftest.__file__).read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and ast.unparse(dec.func) == "pytest.fixture"
                        and any(k.arg == "scope" and ast.literal_eval(k.value) in ("session", "module")
                                for k in dec.keywords)):
                    out.add(node.name)
    return out


def test_every_group_is_named_after_a_shared_fixture():
    assert set(conftest.XDIST_GROUPS) <= shared_fixtures()
    # notebook 00's and 10's smoke tests ask for their shared run by name (pytest cannot see it) and take the
    # fixture's group explicitly
    assert set(SHARED_SMOKE.values()) <= set(conftest.XDIST_GROUPS)
    marked = {p.values[0]: [m.args[0] for m in p.marks if m.name == "xdist_group"] for p in SMOKE}
    assert {stem: groups for stem, groups in marked.items() if groups} == {
        stem: [conftest.XDIST_GROUPS[fixture]] for stem, fixture in SHARED_SMOKE.items()}


def test_a_test_that_asks_for_the_session_engines_runs_in_their_group(engine, request):
    # asking for `engine` starts no engine (it is a factory): this test only reads the mark collection gave it
    assert request.node.get_closest_marker("xdist_group").args[0] == conftest.XDIST_GROUPS["engine"] == "engines"


@pytest.fixture
def through_a_fixture(engine):
    return engine


def test_a_test_that_asks_for_them_through_another_fixture_runs_in_their_group_too(through_a_fixture, request):
    assert request.node.get_closest_marker("xdist_group").args[0] == "engines"


def test_a_test_that_asks_for_none_of_them_is_in_no_group(request):
    assert request.node.get_closest_marker("xdist_group") is None


def test_xdist_runs_each_group_whole_on_one_worker():
    """The groups work only if pytest-xdist sees them: it appends `@group` to a grouped test's id and deals out a
    group as one unit. pytest 9.2 broke that silently (pytest-xdist issue #1386: the suffix is lost, grouped tests
    are dealt out one by one, and each worker starts its own engines); pyproject.toml keeps pytest below 9.2 until
    xdist mends it. This runs this module's other tests on two workers and reads where they ran."""
    import re
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:randomly",
                        "-p", "no:cacheprovider", "-o", "addopts=", "-v", "tests/test_suite_groups.py",
                        "-k", "not test_xdist_runs"], cwd=conftest.REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    passed = r"\[(gw\d)\] \[ *\d+%\] PASSED tests/test_suite_groups\.py::(\S+)"
    ran = {test: worker for worker, test in re.findall(passed, r.stdout)}
    grouped = {t: w for t, w in ran.items() if "in_their_group" in t}
    assert len(grouped) == 2 and all(t.endswith("@engines") for t in grouped), r.stdout[-3000:]
    assert len(set(grouped.values())) == 1, grouped
