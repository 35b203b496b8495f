"""The package's layers as the tree shows them, checked on every import (function-level ones included): engines
below core, core below experiments and figures, infrastructure on top; no import cycles; one record per notebook
(`rlwb.registry`) and the notebooks, experiments, figures and params on disk naming the same stems, and no other
list of notebooks in the package, the scripts or the Makefile; every public error type in `rlwb.errors`; the "How
to add" recipes of docs/architecture.md listing files that exist, the notebook recipe every table of notebooks."""

import ast
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "rlwb"
# engine-side code runs in the engines' own interpreters and imports nothing of rlwb's kernel side
ENGINE_SIDE = {"server.py", "vllm_backend.py", "hf_backend.py", "vllm_ext.py", "fork_server.py"}
LEAF = ("rlwb.errors", "rlwb.jsonfile", "rlwb.paths", "rlwb.progress", "rlwb.timing", "rlwb.formatting",
        "rlwb.run_record", "rlwb.host")
# layer -> the layers its modules may import (leaf utilities are importable from everywhere). core is split by
# domain; each of its subpackages names the core subpackages below it (docs/architecture.md draws the same map).
ALLOWED = {
    "rlwb.engines": ("rlwb.engines",),
    "rlwb.core.checked_fields": (),
    "rlwb.core.data": ("rlwb.core.data",),
    "rlwb.core.measure": ("rlwb.core.measure",),
    "rlwb.core.models": ("rlwb.core.models", "rlwb.core.data"),
    "rlwb.core.prompts": ("rlwb.core.prompts", "rlwb.core.models", "rlwb.core.data"),
    "rlwb.core.scoring": ("rlwb.core.scoring", "rlwb.core.measure", "rlwb.core.data", "rlwb.core.checked_fields",
                          "rlwb.engines"),
    "rlwb.core.rl": ("rlwb.core.rl", "rlwb.core.scoring", "rlwb.core.measure", "rlwb.core.data",
                     "rlwb.core.checked_fields", "rlwb.engines"),
    "rlwb.core": (),  # the package's docstring only: every module lives in a domain
    "rlwb.experiments": ("rlwb.experiments", "rlwb.core", "rlwb.engines"),
    # the sentences: plain values in, Markdown out; the experiments decide, nothing here computes or measures
    "rlwb.experiments.wording": ("rlwb.experiments.wording",),
    "rlwb.plots": ("rlwb.plots", "rlwb.core"),
}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def modules() -> dict[str, Path]:
    return {module_name(f): f for f in PKG.rglob("*.py")}


def imports(tree: ast.AST, known: set[str], top_level_only: bool) -> set[str]:
    """rlwb modules imported by `tree` (`from pkg import submodule` counts as the submodule)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    deps = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlwb"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            deps |= subs or {node.module}
        elif isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name.startswith("rlwb")}
    return deps


def import_graph(top_level_only: bool) -> dict[str, set[str]]:
    mods = {m: f for m, f in modules().items() if f.name not in ENGINE_SIDE}
    return {m: {d for d in imports(ast.parse(f.read_text()), set(mods), top_level_only) if d in mods and d != m}
            for m, f in mods.items()}


def layer(module: str) -> str:
    """The most specific layer `module` is in (`rlwb.core.rl.grpo` -> `rlwb.core.rl`)."""
    inside = [lay for lay in ALLOWED if module == lay or module.startswith(lay + ".")]
    return max(inside, key=len) if inside else "infrastructure"


def allowed(importer: str, dep: str) -> bool:
    return dep.startswith(LEAF) or any(dep == a or dep.startswith(a + ".") for a in ALLOWED[layer(importer)])


def test_no_import_cycles_function_level_imports_included():
    """A deferred import is still a dependency: the model builds and the MoE recipe (now `models.store`, `models.moe`)
    was a circle of function-level imports until the MoE build took its base model from the caller."""
    graph, cycles = import_graph(top_level_only=False), []

    def visit(node, path):
        for dep in graph[node]:
            if dep in path:
                cycles.append(path[path.index(dep):] + [dep])
            elif len(path) < 30:
                visit(dep, path + [dep])

    for m in graph:
        visit(m, [m])
    assert not cycles, cycles[:3]


def test_layers_import_only_downwards_function_level_imports_included():
    bad = {}
    for m, deps in import_graph(top_level_only=False).items():
        lay = layer(m)
        if lay == "infrastructure":
            continue
        wrong = sorted(d for d in deps if not allowed(m, d))
        if wrong:
            bad[m] = wrong
    assert not bad, bad


def test_a_notebooks_experiment_imports_no_other_notebooks_experiment():
    """What notebooks share lives in shared experiment modules (`base`, `grpo_grid`), not in another notebook's
    module: 07 and 08 once imported notebook 03's grid from `toy_grpo`."""
    from rlwb.registry import NOTEBOOKS

    per_notebook = {f"rlwb.experiments.{n.name}" for n in NOTEBOOKS.values()}
    graph = import_graph(top_level_only=False)
    bad = {m: sorted(graph[m] & per_notebook) for m in per_notebook if graph[m] & per_notebook}
    assert not bad, bad


def test_the_layer_check_catches_an_upward_import():
    """The check above on a module written to break it: core importing the archive inside a function."""
    tree = ast.parse("def f():\n    from rlwb.archive import Run\n    return Run\n")
    deps = imports(tree, set(modules()), top_level_only=False)
    assert deps == {"rlwb.archive"} and not allowed("rlwb.core.rl.grpo", "rlwb.archive")


def test_core_subpackages_import_only_the_domains_below_them():
    """The check above applies per core subpackage: data and measure import no other part of core, models no
    scoring, scoring no rl; engines no core at all; the experiments' wording nothing but itself (and the leaf
    utilities)."""
    assert allowed("rlwb.core.rl.grpo", "rlwb.core.scoring.trainer")
    assert not allowed("rlwb.core.scoring.trainer", "rlwb.core.rl.grpo")
    assert not allowed("rlwb.core.data.tasks", "rlwb.core.models.store")
    assert not allowed("rlwb.core.measure.metrics", "rlwb.core.rl.mismatch_doses")
    assert not allowed("rlwb.engines.worker", "rlwb.core.scoring.trainer")
    assert allowed("rlwb.experiments.audit", "rlwb.core.scoring.external")
    assert allowed("rlwb.experiments.toy_grpo", "rlwb.experiments.wording.toy_grpo")
    assert not allowed("rlwb.experiments.wording.toy_grpo", "rlwb.core.rl.correction_catalog")
    assert not allowed("rlwb.experiments.wording.engine_knobs", "rlwb.experiments.engine_knobs")
    core = {m for m in modules() if m.startswith("rlwb.core.")}
    assert core and all(layer(m) != "rlwb.core" for m in core), sorted(m for m in core if layer(m) == "rlwb.core")


def test_nothing_in_the_package_imports_the_tests():
    """Test oracles (tests/peers.py) and fixtures stay out of the shipped package."""
    bad = sorted(module_name(f) for f in PKG.rglob("*.py") for n in ast.walk(ast.parse(f.read_text()))
                 if (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ("tests", "conftest"))
                 or (isinstance(n, ast.Import) and any(a.name.split(".")[0] in ("tests", "conftest") for a in n.names)))
    assert not bad, bad


def test_the_architecture_page_names_every_module():
    """docs/architecture.md is the map: each module of rlwb (but per-notebook experiments, figures and schemas, named
    by the `<name>.py` rule, and package docstrings) appears on it by file name."""
    from rlwb.registry import NOTEBOOKS

    per_notebook = {n.name for n in NOTEBOOKS.values()}
    page = (REPO / "docs" / "architecture.md").read_text()
    missing = sorted(module_name(f) for f in PKG.rglob("*.py") if f.name != "__init__.py"
                     and not (f.parent.name in ("experiments", "plots", "schemas") and f.stem in per_notebook)
                     and f.name not in page)
    assert not missing, missing


def code_string_nodes(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of `tree` but docstrings (what the code uses, not what it says of itself)."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def code_strings(tree: ast.AST) -> list[str]:
    return [n.value for n in code_string_nodes(tree)]


def test_a_runs_record_has_one_owner():
    """run.json is named, read and written in `rlwb.run_record` alone, and written only by the archive (`archive.py`,
    which the runner, `rlwb publish`, `rlwb figures` and the bench call): no module reaches it by path arithmetic
    (`jobs_dir.parent.parent / "run.json"`), where no check here would see who writes a run's record."""
    named = sorted(module_name(f) for f in PKG.rglob("*.py") if f.name != "run_record.py"
                   and any("run.json" in s for s in code_strings(ast.parse(f.read_text()))))
    assert not named, named
    writers = {"write_record", "update_record"}
    bad = sorted(module_name(f) for f in PKG.rglob("*.py") if f.name not in ("run_record.py", "archive.py")
                 for n in ast.walk(ast.parse(f.read_text()))
                 if isinstance(n, ast.ImportFrom) and n.module == "rlwb.run_record"
                 and writers & {a.name for a in n.names})
    assert not bad, bad


def test_the_record_check_sees_path_arithmetic_and_skips_docstrings():
    tree = ast.parse('"""Writes run.json."""\ndef f(d):\n    """its run.json"""\n    return d.parent / "run.json"\n')
    assert code_strings(tree) == ["run.json"]


def test_engine_side_code_imports_nothing_kernel_side():
    """server.py, its backends, vllm_ext.py and fork_server.py run under the engines' interpreters (vLLM's torch and
    transformers), where only rlwb.engines' own engine-side files are on the path."""
    for f in (PKG / "engines").glob("*.py"):
        if f.name in ENGINE_SIDE:
            deps = imports(ast.parse(f.read_text()), set(modules()), top_level_only=False)
            assert all(d.split(".")[-1] in {n.removesuffix(".py") for n in ENGINE_SIDE} for d in deps), (f.name, deps)


def test_every_exception_class_lives_in_errors():
    """Public ones: a private control-flow signal (`runner._Interrupted`) stays where it is raised."""
    stray = [f"{module_name(f)}.{n.name}" for f in PKG.rglob("*.py") if f.name != "errors.py"
             for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ClassDef) and not n.name.startswith("_")
             and any(getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in n.bases)]
    assert not stray, stray


def test_notebooks_records_experiments_figures_and_params_name_the_same_stems():
    from rlwb.registry import NOTEBOOKS

    on_disk = {p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    experiments = {p.stem for p in (PKG / "experiments").glob("*.py")}
    figures = {p.stem for p in (PKG / "plots").glob("*.py")}
    params_dirs = {p.name for p in (REPO / "params").iterdir() if p.is_dir() and p.name[:2].isdigit()}
    assert set(NOTEBOOKS) == on_disk == params_dirs
    names = {r.name for r in NOTEBOOKS.values()}
    assert names <= experiments and names <= figures
    assert len(names) == len(NOTEBOOKS)  # no two notebooks share a module name
    for r in NOTEBOOKS.values():
        assert r.schema.__module__ == f"rlwb.params.schemas.{r.name}", (r.stem, r.schema.__module__)
        assert r.path.exists() and (r.params_dir / "default.yaml").exists() and (r.params_dir / "smoke.yaml").exists()


@pytest.mark.parametrize("stem", sorted(p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")))
def test_one_experiment_module_per_notebook_with_one_run_shape(stem):
    from rlwb.experiments.base import Result
    from rlwb.registry import notebook

    record = notebook(stem)
    mod = record.experiment()
    assert Path(mod.__file__).stem == stem.split("_", 1)[1]
    params = list(inspect.signature(mod.run).parameters.values())
    assert [p.name for p in params[:4]] == ["params", "model_path", "on_start", "progress"]
    assert params[2].kind is params[3].kind is inspect.Parameter.KEYWORD_ONLY
    ret = inspect.signature(mod.run).return_annotation
    result_cls = getattr(mod, ret) if isinstance(ret, str) else ret
    assert issubclass(result_cls, Result)
    for method in ("frames", "summary", "conclusion"):
        assert getattr(result_cls, method) is not getattr(Result, method), f"{result_cls.__name__}.{method}"
    figures = record.figures()
    assert figures and all(callable(fn) and isinstance(table, str) for table, fn in figures.values())


def test_every_figure_the_notebook_saves_has_a_recipe():
    """`rlwb figures` rebuilds exactly the figures a notebook saves: each `run.save_figure(..., "name")` in a
    notebook names a figure of its `FIGURES`."""
    import json
    import re

    from rlwb.registry import NOTEBOOKS

    for stem, record in NOTEBOOKS.items():
        cells = json.loads(record.path.read_text())["cells"]
        src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        saved = set(re.findall(r'save_figure\([^\n]*,\s*"([a-z0-9_]+)"\)', src))
        assert saved and saved <= set(record.figures()), (stem, saved - set(record.figures()))


def test_unknown_notebook_is_refused():
    from rlwb.errors import ParamError
    from rlwb.registry import notebook

    with pytest.raises(ParamError, match="unknown notebook '99_nothing'"):
        notebook("99_nothing")


def stems_listed(source: str, stems) -> list[tuple[int, list[str]]]:
    """(line, stems) of each list, tuple, set or dict literal in Python `source` whose strings name two or more
    notebook stems (`"03_toy_grpo"`, `"params/03_toy_grpo/smoke.yaml"`): a table of notebooks."""
    named = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, stems)) + r")(?![A-Za-z0-9_])")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            items = [*node.keys, *node.values] if isinstance(node, ast.Dict) else node.elts
            hits = {m for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)
                    for m in named.findall(i.value)}
            if len(hits) >= 2:
                found.append((node.lineno, sorted(hits)))
    return found


def test_no_module_but_the_registry_lists_notebooks():
    """A notebook is declared once (`rlwb.registry`); every other table of notebooks derives from its records, so a
    new notebook is one record, not a hunt for lists. Python: no collection literal naming two stems; the Makefile
    and shell scripts: no line naming two. One stem (a module about that one notebook) is fine."""
    from rlwb.registry import NOTEBOOKS

    named = re.compile("|".join(map(re.escape, NOTEBOOKS)))
    code = [f for f in [*PKG.rglob("*.py"), *(REPO / "scripts").rglob("*.py")] if f != PKG / "registry.py"]
    bad = {str(f.relative_to(REPO)): hits for f in code if (hits := stems_listed(f.read_text(), NOTEBOOKS))}
    for f in [REPO / "Makefile", *(REPO / "scripts").glob("*.sh"), *(REPO / ".ci").glob("*")]:
        lines = [(n, sorted(set(named.findall(line)))) for n, line in enumerate(f.read_text().splitlines(), 1)]
        if hits := [(n, stems) for n, stems in lines if len(stems) >= 2]:
            bad[str(f.relative_to(REPO))] = hits
    assert not bad, bad


def test_the_notebook_list_check_catches_a_table_of_stems():
    """The check above on code written to break it, and on code it must let pass."""
    stems = ["01_logprob_mismatch", "03_toy_grpo"]
    assert stems_listed('for nb in ("01_logprob_mismatch", "03_toy_grpo"):\n    pass\n', stems) == [(1, stems)]
    assert stems_listed('F = {"params/01_logprob_mismatch/gpu.yaml": 1, "03_toy_grpo": 2}\n', stems) == [(1, stems)]
    assert stems_listed('AUDIT = "01_logprob_mismatch"\nf(["03_toy_grpo", "x"])\n', stems) == []


def recipes() -> dict[str, list[tuple[str, bool]]]:
    """docs/architecture.md's "How to add": recipe title -> (path, optional) for each line of its ```files block."""
    page = (REPO / "docs" / "architecture.md").read_text()
    section = page.split("\n## How to add\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for recipe in section.split("\n### ")[1:]:
        title, body = recipe.split("\n", 1)
        blocks = re.findall(r"^```files\n(.*?)^```$", body, flags=re.M | re.S)
        assert len(blocks) == 1, f"recipe {title!r}: one ```files block, got {len(blocks)}"
        lines = [line.split("#", 1) for line in blocks[0].splitlines() if line.strip()]
        out[title] = [(path.strip(), bool(note) and note[0].strip().startswith("optional")) for path, *note in lines]
    return out


def test_each_how_to_add_recipe_lists_files_that_exist():
    """A recipe's files are real paths; one naming a notebook's `<stem>` / `<name>` exists for every notebook (for
    at least one where it is optional)."""
    from rlwb.registry import NOTEBOOKS

    found = recipes()
    assert {"A parameter", "A notebook", "A correction", "A kind of mismatch dose"} <= set(found)
    for title, files in found.items():
        assert files, title
        for path, optional in files:
            paths = {REPO / path.replace("<stem>", r.stem).replace("<name>", r.name) for r in NOTEBOOKS.values()}
            missing = sorted({str(p) for p in paths if not p.is_file()})
            assert len(missing) < len(paths) if optional else not missing, (title, path, missing)


def test_the_notebook_recipe_names_every_table_of_notebooks():
    """Adding a notebook is a hunt for lists unless the recipe names them: every file (package, scripts, tests) with
    a collection literal naming half the notebooks or more is in the notebook recipe."""
    from rlwb.registry import NOTEBOOKS

    listed = {path for path, _ in recipes()["A notebook"]}
    tables = {str(f.relative_to(REPO)) for f in [*PKG.rglob("*.py"), *(REPO / "scripts").rglob("*.py"),
                                                 *(REPO / "tests").glob("*.py")]
              if any(2 * len(stems) >= len(NOTEBOOKS) for _, stems in stems_listed(f.read_text(), NOTEBOOKS))}
    assert tables, "the check finds the tables the tests keep per notebook"
    assert tables <= listed, sorted(tables - listed)


def kinds_named(source: str, kinds) -> list[tuple[int, str, bool]]:
    """(line, string, False) of each code string of Python `source` (docstrings aside) that names a kind of dose: the
    kind itself (`"ratio"`), one of its rows (`"ratio@0.01"`) or metric keys (`"ratio/none@engine/..."`), or its
    parameter (`"ratio_k3"`); (line, the kinds, True) of each collection literal naming two kinds or more (a table of
    kinds)."""
    names = {k.name for k in kinds}
    words = names | {k.param for k in kinds}
    tree = ast.parse(source)
    found = [(n.lineno, n.value, False) for n in code_string_nodes(tree)
             if n.value in words or n.value.partition("@")[0] in names or n.value.partition("/")[0] in names]
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            items = [*node.keys, *node.values] if isinstance(node, ast.Dict) else node.elts
            hits = sorted({i.value for i in items if isinstance(i, ast.Constant) and i.value in names})
            if len(hits) >= 2:
                found.append((node.lineno, ", ".join(hits), True))
    return found


def test_only_the_dose_kind_recipe_names_a_kind_of_dose():
    """A kind of dose is declared once, in its registration (`mismatch_doses.DOSE_KINDS`): the schema, the study's
    grammar, the loop, the analysis, the figures, the wording, the benchmark reader and the audit iterate over the
    registry, so a new kind is the files of its recipe. Every module that reads the registry names no kind itself,
    and no module of the package or the scripts holds a table of kinds, but those the recipe lists."""
    from rlwb.core.rl.mismatch_doses import dose_kinds

    listed = {path for path, _ in recipes()["A kind of mismatch dose"]}
    kinds = dose_kinds()
    assert kinds and "rlwb/core/rl/mismatch_doses.py" in listed
    code = [*PKG.rglob("*.py"), *(REPO / "scripts").rglob("*.py")]
    readers = {f for f in code if "mismatch_doses" in f.read_text()}
    assert len(readers) >= 8, sorted(map(str, readers))  # the check sees the modules that iterate over the kinds
    bad = {}
    for f in code:
        source = f.read_text()
        hits = kinds_named(source, kinds)
        if f not in readers:  # a module that never reads the registry may use the words otherwise ("stale" cache)
            hits = [h for h in hits if h[2]]
        if hits and str(f.relative_to(REPO)) not in listed:
            bad[str(f.relative_to(REPO))] = hits
    assert not bad, bad


def test_the_dose_kind_check_catches_a_kind_named_in_code():
    """The check above on code written to break it, and on code it must let pass."""
    from types import SimpleNamespace

    kinds = [SimpleNamespace(name="ratio", param="ratio_k3"), SimpleNamespace(name="stale", param="stale_steps")]
    src = ('"""ratio and stale in a docstring."""\nif kind == "ratio":\n    key = "stale/none@engine/gap"\n'
           'rows = ("ratio", "stale")\nx = p["ratio_k3"]\nlabel = "ratio@0.01"\n')
    assert sorted(kinds_named(src, kinds)) == [(2, "ratio", False), (3, "stale/none@engine/gap", False),
                                               (4, "ratio", False), (4, "ratio, stale", True), (4, "stale", False),
                                               (5, "ratio_k3", False), (6, "ratio@0.01", False)]
    assert kinds_named('"""ratio."""\nf"{kind}@{dose:g}"\nwhat = "the ratio error"\n', kinds) == []


def test_each_cli_command_is_registered_once_beside_its_handler():
    """`rlwb.cli.COMMANDS` registers every `add_*` of the command modules exactly once, and each command's handler
    lives in the module that builds its parser (the module named after what it holds)."""
    import argparse

    from rlwb import cli

    defined = {f"{m.__name__}.{n}" for m in (getattr(cli, f.stem) for f in (PKG / "cli").glob("*.py")
                                             if not f.stem.startswith("__")) for n in vars(m) if n.startswith("add_")}
    registered = [f"{add.__module__}.{add.__name__}" for add in cli.COMMANDS]
    assert sorted(registered) == sorted(defined)
    for add in cli.COMMANDS:
        sub = argparse.ArgumentParser().add_subparsers()
        add(sub)
        parsers = list(sub.choices.values())
        parsers += [q for p in parsers for a in p._actions if isinstance(a, argparse._SubParsersAction)
                    for q in a.choices.values()]
        handlers = [p.get_default("fn") for p in parsers if p.get_default("fn")]
        assert handlers and all(fn.__module__ == add.__module__ for fn in handlers), add.__name__
