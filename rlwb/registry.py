"""Every notebook, declared once: every table of notebooks derives from these records.

A notebook is `notebooks/<stem>.ipynb`; its record here names its parameters (the schema, whose `NOTEBOOK` is the
stem), the question its report answers, what a run holds on a GPU and the data tables its runs of record keep.
Everything else about it is found from the stem by one rule: its experiment is `rlwb/experiments/<name>.py`, its
figures `rlwb/plots/<name>.py` (`<name>` = the stem without its number), its parameter files `params/<stem>/`.

Code that needs the notebooks iterates `NOTEBOOKS` or asks `notebook(stem)`: the params lookup, the notebook's
memory plan, `rlwb figures`, `rlwb rerun`, `rlwb publish`, `rlwb sync-params`, the index, `rlwb runs`'s headline
and scripts/gpu_memory_check.py (the Makefile's `make reports` finds `notebooks/*.ipynb` by the rule above). A
module that works with one other notebook names that stem (`rlwb audit` runs `10_audit`); none spells out a list of
them. `tests/test_layout.py` checks both: that the notebooks on disk, these
records, the experiments, the figure modules and the params folders name the same stems, and that no module or
script but this one lists stems; `tests/test_docs.py` that README's table of notebooks is this one.

To add a notebook: docs/architecture.md, "How to add".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from rlwb.errors import ParamError
from rlwb.memory_plan import Needs
from rlwb.params.schemas.audit import AuditParams
from rlwb.params.schemas.base import Params
from rlwb.params.schemas.default_policy import DefaultPolicyParams
from rlwb.params.schemas.determinism_and_staleness import DeterminismParams
from rlwb.params.schemas.engine_knobs import EngineKnobParams
from rlwb.params.schemas.equivalence_and_stress import StressParams
from rlwb.params.schemas.kl_vs_temperature import KLTemperatureParams
from rlwb.params.schemas.logprob_mismatch import MismatchParams
from rlwb.params.schemas.mismatch_cost import MismatchCostParams
from rlwb.params.schemas.toy_grpo import GRPOParams
from rlwb.params.schemas.trainer_settings import TrainerSettingsParams
from rlwb.params.schemas.which_correction import CorrectionRaceParams
from rlwb.paths import NOTEBOOKS_DIR, PARAMS_DIR


@dataclass(frozen=True)
class Notebook:
    schema: type[Params]  # its parameters; `schema.NOTEBOOK` is the stem
    question: str  # the one line its report answers (README's notebook table, the index)
    needs: Needs  # what one run holds on a GPU besides engine shares (rlwb.memory_plan)
    # data tables read from its runs of record besides the ones its figures are drawn from: `rlwb publish` keeps them
    reads: tuple[str, ...] = ()
    # the data tables its experiment's analysis reads where it redoes a finished run's analysis from them (`rlwb run
    # --reanalyze`: its module's `run` takes `reanalyzing=`, the source run's directory, `archive.Run.reanalyzes`);
    # none: it cannot
    reanalysis_reads: tuple[str, ...] = ()

    @property
    def stem(self) -> str:
        return self.schema.NOTEBOOK

    @property
    def name(self) -> str:
        """`03_toy_grpo` -> `toy_grpo`: the experiment's and the figures' module name."""
        return self.stem.split("_", 1)[1]

    @property
    def reanalyzes(self) -> bool:
        return bool(self.reanalysis_reads)

    @property
    def path(self) -> Path:
        return NOTEBOOKS_DIR / f"{self.stem}.ipynb"

    @property
    def params_dir(self) -> Path:
        return PARAMS_DIR / self.stem

    def experiment(self) -> ModuleType:
        """`rlwb.experiments.<name>`: its `run(params, model_path, *, on_start, progress) -> Result`."""
        return importlib.import_module(f"rlwb.experiments.{self.name}")

    def figures(self) -> dict:
        """`rlwb.plots.<name>.FIGURES`: figure name -> (the data table it is drawn from, the function)."""
        return importlib.import_module(f"rlwb.plots.{self.name}").FIGURES


NOTEBOOKS: dict[str, Notebook] = {record.stem: record for record in (
    Notebook(DefaultPolicyParams, "what policy do the experiments use?", Needs(0, "score")),
    Notebook(MismatchParams, "engine vs trainer logprobs, the V0 → V1 → V1-fixed ladder, reward equivalence",
             Needs(1, "score")),
    Notebook(KLTemperatureParams, "KL drift across temperatures, raw vs processed, top-p renormalisation",
             Needs(1, "score")),
    Notebook(GRPOParams, "what mismatch does to GRPO", Needs(1, "train")),
    # old and new weights are scored side by side
    Notebook(DeterminismParams, "batch invariance, reruns, stale prefix cache after in-flight weight updates",
             Needs(1, "score2")),
    # the memory-pressure engine starts beside the first one
    Notebook(StressParams, "property-based validator per preset, memory pressure with preemption, long contexts",
             Needs(2, "score")),
    # one knob's engine at a time; the MoE audit's scorer beside the main one
    Notebook(EngineKnobParams, "which vLLM settings keep rollouts on-policy, and what each costs in throughput; "
             "other vLLM versions; MoE router agreement", Needs(1, "score2")),
    # notebook 03's loop, one mismatch level's engine at a time
    Notebook(CorrectionRaceParams, "which peer's off-policy correction recovers the no-mismatch baseline, per "
             "mismatch level", Needs(1, "train")),
    # notebook 03's loop, one engine; the doses change what it reports or the weights it samples with; an engine
    # point's run beside a base-preset engine that scores its trained policy (mismatch_study.execution.CleanScorer)
    Notebook(MismatchCostParams, "what engine-trainer mismatch costs a GRPO run: reward gap per dose, paired by "
             "seed, per kind of mismatch and correction", Needs(2, "train"),
             reads=("benchmarks",),  # `rlwb audit` places an engine's k3 against them (dose_response.study_benchmarks)
             reanalysis_reads=("curves",)),
    # the fp32 master, its float64 reference and one setting's copy at a time; one engine at a time
    Notebook(TrainerSettingsParams, "how far the trainer's own settings (dtype, attention, batching, micro-batch, "
             "checkpointing, compile, fp32 head) move its logprobs, beside the engine's", Needs(1, "settings")),
    # one engine at a time (a served engine holds nothing here); rlwb's fp32 scorer, or none (an external one)
    Notebook(AuditParams, "is your engine, as you serve it, on-policy with your trainer on your prompts? (a prompts "
             "file, a preset or a server URL, rlwb's scorer or your own)", Needs(1, "score")),
)}


def headline(stem: str) -> list[str]:
    """The metric keys `rlwb runs` and the index show for a notebook's runs ([] for a stem no longer declared)."""
    return list(NOTEBOOKS[stem].schema.HEADLINE) if stem in NOTEBOOKS else []


def notebook(name: str | Path) -> Notebook:
    """The record of a notebook, by stem or path (`notebooks/03_toy_grpo.ipynb`)."""
    stem = Path(name).stem
    if stem not in NOTEBOOKS:
        raise ParamError(f"unknown notebook {stem!r}; known: {', '.join(NOTEBOOKS)}")
    return NOTEBOOKS[stem]
