"""Parameter validation: every class of bad input is rejected before compute, naming the key."""

import json
import re
from dataclasses import fields
from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml

from rlwb import params
from rlwb.params import ParamError
from rlwb.registry import NOTEBOOKS

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("nb, overrides, pattern", [
    ("01_logprob_mismatch", {"no_such_key": 1}, r"unknown parameter\(s\) \['no_such_key'\]"),
    ("01_logprob_mismatch", {"temprature": 0.7}, r"\['temprature'\] .*did you mean 'temperature'\?"),
    ("01_logprob_mismatch", {1: 0.7}, r"unknown parameter\(s\) \[1\]"),  # a YAML key that is not a string
    ("01_logprob_mismatch", {"temperature": "hot"}, r"'temperature' must be a number"),
    ("01_logprob_mismatch", {"prompts": 2.5}, r"'prompts' must be an int"),
    ("01_logprob_mismatch", {"prompts": True}, r"'prompts' must be an int"),
    # no coercion: a string, a float with an integral value, 1 for true
    ("01_logprob_mismatch", {"prompts": "3"}, r"'prompts' must be an int, got '3' \(str\)"),
    ("01_logprob_mismatch", {"prompts": 2.0}, r"'prompts' must be an int, got 2.0 \(float\)"),
    ("01_logprob_mismatch", {"full_vocab": 1}, r"'full_vocab' must be true or false, got 1"),
    ("01_logprob_mismatch", {"temperature": True}, r"'temperature' must be a number, got True \(bool\)"),
    ("01_logprob_mismatch", {"temperature": "0.7"}, r"'temperature' must be a number, got '0.7' \(str\)"),
    # numpy's scalars (a parameters cell that computes a value): np.float32(0.1) would hash as 0.10000000149011612
    ("01_logprob_mismatch", {"temperature": np.float32(0.7)}, r"'temperature' must be a number, got .*\(float32\)"),
    ("01_logprob_mismatch", {"temperature": np.float64(0.7)}, r"'temperature' must be a number, got .*\(float64\)"),
    ("01_logprob_mismatch", {"prompts": np.int64(3)}, r"'prompts' must be an int, got .*\(int64\)"),
    ("01_logprob_mismatch", {"temperature": float("inf")}, r"'temperature' must be finite, got inf"),
    ("01_logprob_mismatch", {"full_vocab": "yes"}, r"'full_vocab' must be true or false"),
    ("01_logprob_mismatch", {"temperature": 0}, r"'temperature' must be > 0"),
    ("01_logprob_mismatch", {"temperature": -1.0}, r"'temperature' must be > 0"),
    ("01_logprob_mismatch", {"top_p": 1.5}, r"'top_p' must be <= 1"),
    ("01_logprob_mismatch", {"top_p": 0.0}, r"'top_p' must be > 0"),
    ("01_logprob_mismatch", {"prompts": -3}, r"'prompts' must be >= 1"),
    ("01_logprob_mismatch", {"top_k": -1}, r"'top_k' must be >= 0"),
    ("01_logprob_mismatch", {"engines": ["vllm-v2"]},
     r"'engines\[0\]': unknown engine preset 'vllm-v2'; available: \["),
    ("01_logprob_mismatch", {"engines": "vllm-v1"}, r"'engines' must be a list of str"),
    ("01_logprob_mismatch", {"engines": []}, r"'engines' must not be an empty list"),
    ("01_logprob_mismatch", {"engines": ("hf",)}, r"'engines' must be a list of str"),
    # a list setting's items are checked one by one, named by index: their types first, then their rules
    ("01_logprob_mismatch", {"engines": ["hf", 1]}, r"'engines\[1\]' must be a string, got 1 \(int\)"),
    ("02_kl_vs_temperature", {"temperatures": [0.5, 0]}, r"'temperatures\[1\]' must be > 0, got 0.0"),
    ("02_kl_vs_temperature", {"temperatures": [0.5, -1, "x"]}, r"'temperatures\[2\]' must be a number"),
    ("02_kl_vs_temperature", {"top_k_values": [0, 1.5]}, r"'top_k_values\[1\]' must be an int"),
    ("01_logprob_mismatch", {"dtype": "fp8"}, r"'dtype': 'fp8' is not allowed; allowed: \['float32'"),
    ("01_logprob_mismatch", {"model": "/no/such/model"}, r"model path '/no/such/model' does not exist"),
    ("01_logprob_mismatch", {"temperature": float("nan")}, r"'temperature' must be finite"),
    ("00_default_policy", {"eval_prompts": 0}, r"'eval_prompts' must be >= 1"),
    # a tolerance that cannot fail on anything short of raw-vs-processed logprobs is refused
    ("05_equivalence_and_stress", {"validate_tolerance": 0.5}, r"'validate_tolerance' must be <= 0.05"),
])
def test_bad_values_name_the_key(nb, overrides, pattern):
    with pytest.raises(ParamError, match=pattern) as e:
        params.load(nb, overrides=overrides)
    assert "\n" not in str(e.value)  # one line


def test_values_keep_their_declared_type():
    """An int given for a float setting is a float (its params hash is the same as 1.0's); an int is never widened
    to a float in a list of ints, and a huge int stays exact."""
    p = params.load("02_kl_vs_temperature", overrides={"temperatures": [1, 2], "top_k_values": [0, 10**20]})
    assert p.temperatures == [1.0, 2.0] and all(type(t) is float for t in p.temperatures)
    assert p.top_k_values == [0, 10**20] and all(type(k) is int for k in p.top_k_values)
    assert p.hash() == params.load("02_kl_vs_temperature", overrides={"temperatures": [1.0, 2.0],
                                                                       "top_k_values": [0, 10**20]}).hash()


def test_model_directory_that_is_not_a_causal_lm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    with pytest.raises(ParamError, match="is not a causal LM"):
        params.load("01_logprob_mismatch", overrides={"model": str(tmp_path)})
    with pytest.raises(ParamError, match="has no config.json"):
        params.load("01_logprob_mismatch", overrides={"model": str(tmp_path / "..")})


def test_hub_ids_pass_validation():
    p = params.load("01_logprob_mismatch", overrides={"model": "Qwen/Qwen2.5-0.5B-Instruct"})
    assert p.model == "Qwen/Qwen2.5-0.5B-Instruct"


def test_merge_order_defaults_files_overrides(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("prompts: 5\nmax_tokens: 9\n")
    b.write_text("prompts: 6\n")
    p = params.load("01_logprob_mismatch", [a, b], {"max_tokens": 11})
    assert (p.prompts, p.max_tokens, p.temperature) == (6, 11, 0.7)
    assert isinstance(params.load("01_logprob_mismatch", overrides={"temperature": 1}).temperature, float)


def test_malformed_yaml_names_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("prompts: 5\nengines: [hf, vllm-v0\nseed: 1\n")
    with pytest.raises(ParamError, match=r"bad\.yaml:\d+:\d+: malformed YAML"):
        params.load("01_logprob_mismatch", [f])
    f.write_text("- just\n- a list\n")
    with pytest.raises(ParamError, match="must hold a mapping"):
        params.load("01_logprob_mismatch", [f])
    with pytest.raises(ParamError, match="does not exist"):
        params.load("01_logprob_mismatch", [tmp_path / "missing.yaml"])


def test_override_values_are_yaml():
    assert params.parse_override("temperatures", "[0.6, 1.0]") == [0.6, 1.0]
    assert params.parse_override("seed", "7") == 7
    assert params.parse_override("full_vocab", "false") is False


def test_params_hash_is_stable_and_sensitive():
    a = params.load("01_logprob_mismatch")
    assert a.hash() == params.load("01_logprob_mismatch").hash()
    assert a.hash() != params.load("01_logprob_mismatch", overrides={"seed": 1}).hash()
    assert len(a.hash()) == 8


@pytest.mark.parametrize("stem", sorted(NOTEBOOKS))
def test_notebook_parameters_cell_and_default_yaml_match_the_schema(stem):
    from rlwb.params.cells import defaults_yaml, out_of_date, parameters_cell

    schema = NOTEBOOKS[stem].schema
    nb = nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "exactly one cell tagged `parameters`"
    stale = [str(f.relative_to(REPO)) for f in out_of_date() if stem in f.as_posix()]
    assert not stale, f"{stale} differ from rlwb/params/schemas/: run `rlwb sync-params`"
    assert cells[0].source == parameters_cell(schema)
    assert (REPO / "params" / stem / "default.yaml").read_text() == defaults_yaml(schema)
    for name in ("default", "smoke"):
        params.load(stem, [REPO / "params" / stem / f"{name}.yaml"])  # validates
    # the validation cell follows the parameters cell and calls rlwb
    i = nb.cells.index(cells[0])
    assert f'rlwb.notebook.start("{stem}", globals())' in nb.cells[i + 1].source
    defaults = yaml.safe_load((REPO / "params" / stem / "default.yaml").read_text())
    assert {f.name for f in fields(schema)} == set(defaults)


def test_sync_params_writes_what_the_schemas_say(tmp_path):
    """`rlwb sync-params` on a copy with a stale cell and a stale default.yaml rewrites exactly those two."""
    import shutil

    from rlwb.params.cells import parameters_cell, sync

    nbs, prm = tmp_path / "notebooks", tmp_path / "params"
    shutil.copytree(REPO / "notebooks", nbs)
    shutil.copytree(REPO / "params", prm)
    nb = nbformat.read(nbs / "01_logprob_mismatch.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = cell.source.replace("seed: int = 0", "seed: int = 5")
    nbformat.write(nb, nbs / "01_logprob_mismatch.ipynb")
    (prm / "03_toy_grpo" / "default.yaml").write_text("seed: 0\n")
    assert sorted(p.name for p in sync(nbs, prm, write=False)) == ["01_logprob_mismatch.ipynb", "default.yaml"]
    assert len(sync(nbs, prm)) == 2 and sync(nbs, prm) == []
    nb = nbformat.read(nbs / "01_logprob_mismatch.ipynb", as_version=4)
    assert next(c for c in nb.cells if "parameters" in c.metadata.get("tags", [])).source == parameters_cell(
        NOTEBOOKS["01_logprob_mismatch"].schema)
    assert yaml.safe_load((prm / "03_toy_grpo" / "default.yaml").read_text())["steps"] == 50


def test_grpo_settings_have_one_source():
    """GRPOParams inherits the loop's settings; the run config is built from them, field by field."""
    from dataclasses import fields as dc_fields

    from rlwb.core.rl.grpo_config import GRPOConfig, GRPOSettings
    from rlwb.params.schemas.toy_grpo import GRPOParams

    assert issubclass(GRPOParams, GRPOSettings)
    p = params.load("03_toy_grpo", overrides={"lr": 3e-4, "micro_batch": 4, "temperature": 0.9})
    cfg = GRPOConfig.from_settings(p, correction="tis", seed=7)
    for f in dc_fields(GRPOSettings):
        assert getattr(cfg, f.name) == getattr(p, f.name), f.name
    assert (cfg.correction, cfg.seed) == ("tis", 7)


def test_weighting_corrections_are_refused_where_the_ppo_ratio_already_holds_them():
    """With behaviour logprobs from the engine the PPO ratio is pi_theta/pi_engine: a TIS weight pi_trainer/
    pi_engine on top would apply the ratio twice (verl's bypass mode turns IS weights off). Such corrections are
    refused before any compute, naming the problem; rejection-only ones are defined in both modes."""
    from rlwb.core.rl.correction_catalog import CATALOG, modes

    for nb in ("03_toy_grpo", "07_which_correction"):
        with pytest.raises(ParamError, match="tis.*twice.*old_logprobs: trainer"):
            params.load(nb, overrides={"corrections": ["none", "tis"], "old_logprobs": "engine"})
        assert params.load(nb, overrides={"corrections": ["none", "tis"], "old_logprobs": "trainer"})
        assert params.load(nb, overrides={"corrections": ["none", "verl.geo_rs", "mis"], "old_logprobs": "engine"})
    with pytest.raises(ParamError, match="icepop"):  # a band whose survivors keep their ratio as weight
        params.load("07_which_correction", overrides={"old_logprobs": "engine"})
    assert modes("verl.k3_rs") == ("trainer", "engine") and modes("trl.sequence_mask") == ("trainer",)
    assert {n for n, e in CATALOG.items() if not e.weighs_tokens} >= {"none", "mis", "seq_mask", "verl.geo_rs",
                                                                       "skyrl.geo_mask", "trl.opsm"}


def test_injected_unknown_names_are_caught_inside_the_notebook():
    """Plain papermill only warns about unknown parameters; the validation cell must reject them."""
    ns = {"In": ["", "seed: int = 0", "# Parameters\nseed = 1\nno_such_key = 3\n"], "seed": 1, "eval_prompts": 5,
          "sample_rows": 2, "rebuild": False, "model": "default"}
    with pytest.raises(ParamError, match="no_such_key"):
        params.from_namespace("00_default_policy", ns)
    ns["In"] = ["", "# Parameters\nseed = 1\n"]
    assert params.from_namespace("00_default_policy", ns).seed == 1


def test_preset_with_missing_interpreter_is_rejected_before_compute(tmp_path, monkeypatch):
    extra = tmp_path / "mine.yaml"
    extra.write_text("mine:\n  extends: vllm-v1\n  python: /nonexistent/bin/python\n")
    monkeypatch.setenv("RLWB_ENGINE_PRESETS", str(extra))
    with pytest.raises(ParamError, match=r"'engines\[0\]'.*interpreter /nonexistent/bin/python does not exist"):
        params.load("01_logprob_mismatch", overrides={"engines": ["mine"]})


def test_a_parameter_doc_with_an_equals_sign_is_refused():
    """papermill skips a parameters-cell line with two `=` (`x: int = 1  # 1 = off`): the parameter would vanish
    from `papermill --help-notebook` without an error."""
    from rlwb.core.checked_fields import param

    with pytest.raises(ValueError, match="contains '='"):
        param(1, "runs at once; 1 = one at a time")
    assert param(1, "runs at once; 1 means one at a time").metadata["doc"].endswith("one at a time")


def unique_lists() -> list:
    """(notebook, parameter, its default's first entry listed twice) for every list setting declared `unique`."""
    out = []
    for stem in NOTEBOOKS:
        for f in fields(params.schema_for(stem)):
            default = f.default_factory() if callable(f.default_factory) else None
            if f.metadata.get("unique") and default:
                out.append(pytest.param(stem, f.name, [default[0], default[0]], id=f"{stem}.{f.name}"))
    return out


@pytest.mark.parametrize(("notebook", "name", "value"), unique_lists())
def test_a_list_that_must_not_repeat_refuses_a_repeat(notebook, name, value):
    """A grid axis or a set of engines listed twice would run (or count) the same thing twice: `param(unique=True)`
    refuses it at validation, with the list in the message; the same list without the repeat passes."""
    from rlwb.params.validation import load

    with pytest.raises(ParamError, match=re.escape(f"parameter {name!r} lists an entry twice: {value}")):
        load(notebook, overrides={name: value})
    load(notebook, overrides={name: list(dict.fromkeys(value))})
