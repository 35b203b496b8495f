"""The package's layers as the tree shows them: core below experiments, no import cycles, one experiment module
per notebook with the same `run` signature, every error type in `rlwb.errors`."""

import ast
import inspect
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "rlwb"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def top_level_imports() -> dict[str, set[str]]:
    """Module -> rlwb modules it imports at module level (`from pkg import submodule` counts as the submodule)."""
    modules = {module_name(f): f for f in PKG.rglob("*.py") if f.name != "server.py" and f.name != "vllm_ext.py"}
    graph = {}
    for name, f in modules.items():
        deps = set()
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlwb"):
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
                deps |= subs or {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("rlwb")}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_no_import_cycles():
    graph, cycles = top_level_imports(), []

    def visit(node, path):
        for dep in graph[node]:
            if dep in path:
                cycles.append(path[path.index(dep):] + [dep])
            elif len(path) < 30:
                visit(dep, path + [dep])

    for m in graph:
        visit(m, [m])
    assert not cycles, cycles[:3]


def test_core_depends_only_on_core_engines_and_leaf_utilities():
    leaf = ("rlwb.core", "rlwb.engines", "rlwb.errors", "rlwb.progress", "rlwb.paths", "rlwb.timing")
    bad = {m: sorted(d for d in deps if not d.startswith(leaf))
           for m, deps in top_level_imports().items() if m.startswith("rlwb.core")}
    assert not {m: d for m, d in bad.items() if d}


def test_every_exception_class_lives_in_errors():
    """Public ones: a private control-flow signal (`runner._Interrupted`) stays where it is raised."""
    stray = [f"{module_name(f)}.{n.name}" for f in PKG.rglob("*.py") if f.name != "errors.py"
             for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ClassDef) and not n.name.startswith("_")
             and any(getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception")) for b in n.bases)]
    assert not stray, stray


@pytest.mark.parametrize("stem", ["00_default_policy", "01_logprob_mismatch", "02_kl_vs_temperature", "03_toy_grpo",
                                  "04_determinism_and_staleness", "05_equivalence_and_stress"])
def test_one_experiment_module_per_notebook_with_one_run_shape(stem):
    from rlwb.experiments import NOTEBOOKS, experiment_for
    from rlwb.experiments.base import Result

    assert (REPO / "notebooks" / f"{stem}.ipynb").exists() and stem in NOTEBOOKS
    mod = experiment_for(stem)
    assert Path(mod.__file__).stem == stem.split("_", 1)[1]
    params = list(inspect.signature(mod.run).parameters.values())
    assert [p.name for p in params[:4]] == ["params", "model_path", "on_start", "progress"]
    assert params[2].kind is params[3].kind is inspect.Parameter.KEYWORD_ONLY
    ret = inspect.signature(mod.run).return_annotation
    result_cls = getattr(mod, ret) if isinstance(ret, str) else ret
    assert issubclass(result_cls, Result)
    for method in ("frames", "summary", "conclusion"):
        assert getattr(result_cls, method) is not getattr(Result, method), f"{result_cls.__name__}.{method}"


def test_unknown_notebook_has_no_experiment():
    from rlwb.errors import ParamError
    from rlwb.experiments import experiment_for

    with pytest.raises(ParamError, match="no experiment"):
        experiment_for("99_nothing")
