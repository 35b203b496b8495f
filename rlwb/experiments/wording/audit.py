"""Notebook 10's sentences: what was audited (a prompts file sampled by the engines, or an archived run's rollouts
re-scored) and by which trainer, one bullet per engine (the mismatch with intervals, raw logprobs where the engine
reports them, what the RL frameworks' dashboards would flag, the archived trainer against this one), and which
engines sit at the float floor. `rlwb.experiments.audit` decides (whether an engine reports raw logprobs, which
panel rows are flagged, which engines are at the floor) and passes plain values; nothing here compares or measures.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rlwb.experiments.wording import ci_text
from rlwb.experiments.wording.mismatch_cost import BMD_BOUNDED
from rlwb.formatting import metric


def alert_text(alert, threshold) -> str:
    """When a framework alerts: "> 0.1", "|x| > 0.1"; "–" without a threshold."""
    if threshold is None or pd.isna(threshold):
        return "–"
    return f"{'|x| > ' if alert == 'abs above' else '> '}{threshold:g}"


def trainer_text(trainer: dict) -> str:
    """What scored (`kind` "hf": rlwb's scorer with its `dtype` and `attn_implementation`; else the team's
    `command`)."""
    if trainer.get("kind") == "hf":
        return f"rlwb's scorer ({trainer.get('dtype')}, {trainer.get('attn_implementation')} attention)"
    return f"the command `{trainer.get('command')}`"


def setup_line(source: dict, trainer: dict, samples_per_prompt: int, temperature: float, top_p: float, top_k: int,
               max_tokens: int) -> str:
    """`source`: an archived run (`kind` "archived run", `run_id`, `notebook`) or a prompts file (`rows`, `path`,
    `sha256`); the sampling settings only say something for a prompts file."""
    who = trainer_text(trainer)
    if source.get("kind") == "archived run":
        return (f"**Setup.** The rollouts of archived run `{source.get('run_id')}` ({source.get('notebook')}) "
                f"re-scored by {who}; the engines' logprobs are the archive's.")
    return (f"**Setup.** {source.get('rows')} prompts from `{Path(str(source.get('path'))).name}` "
            f"(sha256 {str(source.get('sha256'))[:12]}), {samples_per_prompt} completion(s) each, "
            f"T={temperature:g}, top_p={top_p:g}, top_k={top_k}, up to {max_tokens} tokens; scored by {who}.")


def engine_lines(metrics: dict, engine: str, temperature: float, reports_raw: bool, panel: dict | None) -> list[str]:
    """One engine's bullet from `metrics` (`<engine>/...`) and what follows it: `reports_raw` (its logprobs are the
    trainer's raw T = 1 ones: say so and how to get the sampling distribution's); `panel` (None without panel rows,
    else {"flagged": rows with `framework`, `metric`, `value`, `alert`, `threshold`; "thresholds": how many
    thresholds were checked}); the archived trainer against this one where it was re-scored."""
    def v(name: str, spec: str) -> str:  # values at the float floor read as such
        return metric(name, metrics.get(f"{engine}/{name}"), spec)

    e, m = engine, metrics
    lines = [f"- `{e}`: max |Δlogp| = {v('abs_dlogp_max', '.2e')}, mean = {v('abs_dlogp_mean', '.2e')} "
             f"{ci_text(m, e, 'abs_dlogp_mean', '.2e')}, k3 = {v('k3_mean', '.2e')} "
             f"{ci_text(m, e, 'k3_mean', '.2e')}, clip fraction {m.get(f'{e}/clip_frac'):.1%} over "
             f"{m.get(f'{e}/n_tokens')} tokens."]
    if reports_raw:
        lines.append(f"  Its logprobs are the trainer's *raw* (T = 1, untruncated) ones (mean gap to those "
                     f"{metric('abs_dlogp_mean', m.get(f'{e}/abs_dlogp_raw_mean'), '.1e')}): it reports "
                     f"pre-temperature logprobs while sampling at T = {temperature:g}; vLLM's `--logprobs-mode "
                     f"processed_logprobs` (`logprobs_mode: processed_logprobs`) reports the sampling distribution's.")
    if panel is not None and panel["flagged"]:
        lines.append("  Flagged on the dashboards: " + "; ".join(
            f"{r['framework']} `{r['metric']}` = {r['value']:.3g} "
            f"(alerts when {alert_text(r['alert'], r['threshold'])})" for r in panel["flagged"]) + ".")
    elif panel is not None:
        lines.append(f"  No framework's threshold is crossed ({panel['thresholds']} thresholds checked).")
    if m.get(f"{e}/vs_archived_trainer_abs_dlogp_max") is not None:
        lines.append(f"  This trainer vs the archived run's trainer, same tokens: max |Δlogp| = "
                     f"{v('vs_archived_trainer_abs_dlogp_max', '.2e')}.")
    return lines


def floor_lines(at_floor: list[str], off_floor: list[str], floor: float) -> list[str]:
    """Which engines agree with the trainer to float precision (max |Δlogp| at or under `floor`), which do not."""
    lines = []
    if at_floor:
        lines.append(f"\nOn-policy to float precision (max |Δlogp| ≤ {floor:g}): "
                     f"{', '.join(f'`{e}`' for e in at_floor)}.")
    if off_floor:
        lines.append(f"Off the float floor: {', '.join(f'`{e}`' for e in off_floor)}: its importance ratios are not "
                     f"1; the worst tokens and the panel below say where and how much.")
    return lines


def conclusion(metrics: dict, setup: dict) -> str:
    """Notebook 10's answer in Markdown. `setup`: `setup_line`'s arguments under `run`; `engines` (engine ->
    `engine_lines`'s `reports_raw` and `panel`, in the order audited, only engines with metrics); `temperature`;
    `at_floor`, `off_floor` and `floor` (`floor_lines`'s arguments)."""
    s = setup
    lines = [setup_line(**s["run"])]
    for e, verdict in s["engines"].items():
        lines += engine_lines(metrics, e, s["temperature"], **verdict)
    lines += floor_lines(s["at_floor"], s["off_floor"], s["floor"])
    if "study" in s:
        lines += study_lines(s["study"])
    lines.append("\nIntervals: 95%, bootstrap over completions.")
    return "\n".join(lines)


def study_lines(study: dict) -> list[str]:
    """Where each audited engine's measured k3 sits against notebook 08's benchmark doses (issue 46): per study run
    of record and arm, the BMDL of the engine's kind of mismatch (ratio for raw logprobs, distribution otherwise)
    and the engine's k3 as a multiple of it; said to be measured on small embedded models. Without a run of record,
    says so and where one would be read from."""
    head = "\n**Against the mismatch-cost study (notebook 08)**"
    if not study["runs"]:
        return [f"{head}: no study run of record yet (`{study['dir']}/` holds none with benchmark doses; run "
                f"`rlwb sweep params/sweeps/mismatch_cost.yaml` and `rlwb publish` its runs), so this k3 cannot be "
                f"placed against a tolerable one."]
    out = [f"{head}: the benchmark doses below were measured on rlwb's small embedded models (a 30-step GRPO run "
           f"on sums), not on your model or task: read them as an order of magnitude, not a limit for your run. "
           f"BMDL: the lower 95% bound of the k3 at which the cost reaches the study's benchmark response."
           + (f" Model(s) {', '.join(f'`{m}`' for m in study['models_twice'])} have more than one study as broad, "
              f"each listed: for a row, act on the lower level where more than one gives one."
              if study.get("models_twice") else "")]
    for eng in study["engines"]:
        kind = ("ratio mismatch (your engine reports raw logprobs: it samples right, reports wrong)" if eng["raw"]
                else "distribution mismatch (perturbed or stale weights: your engine samples another policy)")
        out.append(f"- `{eng['engine']}`, k3 {eng['k3']:.2e}, against {kind}:")
        for r in eng["runs"]:
            if not r["fitted"]:
                out.append(f"  - run `{r['run']}` (model `{r['model']}`): analysed before rlwb fitted benchmark doses "
                           f"by EPA's convention (one line in log k3 per seed, no test of fit, the benchmark "
                           f"response taken as known), so no level is quoted from it; rerun the study.")
                continue
            parts = []
            for x in r["rows"]:
                if x["keep_below"] == x["keep_below"]:  # a level to quote (not NaN)
                    parts.append(f"{x['kind']} `{x['arm']}` keep k3 below {x['keep_below']:.1e} (BMD {x['bmd']:.1e}; "
                                 f"yours is {eng['k3'] / x['keep_below']:.2g}x the BMDL)")
                else:
                    why = "the dose scale decides it" if x["status"] == BMD_BOUNDED else x["status"]
                    parts.append(f"{x['kind']} `{x['arm']}` no level ({why}; tested k3 {x['k3_min']:.1e} to "
                                 f"{x['k3_max']:.1e}, yours is {eng['k3']:.1e})")
            sd = r.get("seeds") or {}
            design = (f"; seeds from {sd['seed']}, {sd['num_seeds']} then up to {sd['max_seeds']} sized by the "
                      f"{sd['seed_power']} test" if len(sd) == 4 else "")
            out.append(f"  - run `{r['run']}` (model `{r['model']}`{design}): "
                       + ("; ".join(parts) if parts else "no benchmark dose of this kind") + ".")
        for model in study.get("models_twice") or []:
            rows = [x for x in eng.get("act_on") or [] if x["model"] == model]
            if rows:
                out.append(f"  - **act on**, model `{model}` (the lower level per row of its studies): " + "; ".join(
                    f"{x['kind']} `{x['arm']}` keep k3 below {x['keep_below']:.1e} (run `{x['run']}`; "
                    f"{x['quoting']} of its {x['studies']} fitted studies {'gives' if x['quoting'] == 1 else 'give'}"
                    f" a level; yours is {eng['k3'] / x['keep_below']:.2g}x it)" for x in rows) + ".")
    return out
