"""Every named off-policy correction rlwb can train with: which peer ships it, with which defaults.

A catalogue entry is data (no torch here, so reading params stays light): the parts it stacks, each a pure
function of `rlwb.core.rl.corrections` with the peer's default thresholds, and where the peer defines it. The
thresholds are the peers' own defaults as of the pinned versions (`engines/peers.txt`), so a user who runs
verl's `decoupled_geo_rs()` or TRL's default `vllm_importance_sampling_mode` gets the same weights and masks
here; `tests/test_corrections.py` checks each entry against the peer's own code: its weights and masks, and
how the peer's loss aggregates them (a rejected token leaving the token count or not). An entry no installed
peer's code can check says so (`reading`: rlwb's own reading, with the source it follows).

Ratios are r = pi_trainer / pi_engine throughout (every peer's convention). Bounds are on r (verl states
its k1 rejection bounds on 1/r: they are converted here, once, and the test holds them to verl's mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlwb.errors import ParamError

VERL = "https://github.com/volcengine/verl/blob/v0.9.1/verl/trainer/ppo/rollout_corr_helper.py"
VERL_PRESETS = "https://github.com/volcengine/verl/blob/v0.9.1/verl/trainer/config/algorithm.py"
TRL = "https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py"
SKYRL = "https://github.com/NovaSky-AI/SkyRL (skyrl 0.3.0, backends/skyrl_train/utils/off_policy_correction_utils.py)"
OPENRLHF = "https://github.com/OpenRLHF/OpenRLHF/blob/v0.11.2/openrlhf/models/loss.py"
YAO = "https://fengyao.notion.site/off-policy-rl"
ICEPOP = "https://arxiv.org/abs/2510.18855"
DSV32 = "https://arxiv.org/abs/2512.02556"
VERL_BYPASS = ("https://github.com/volcengine/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py "
               "(compute_policy_loss_bypass_mode)")

# Parts that multiply a token's loss term by a ratio-derived weight. Every peer defines these in the *decoupled*
# mode, where the PPO ratio is pi_theta / pi_trainer_old and the weight pi_trainer_old / pi_engine brings the
# engine's samples back to the trainer's policy. With behaviour logprobs from the engine (verl's bypass mode,
# PipelineRL) the PPO ratio is already pi_theta / pi_engine: a weight on top applies the ratio twice
# (r * min(r, C)), which is why verl's bypass PPO-clip loss computes its IS weights for metrics only. Rejection
# parts only remove tokens or sequences, so they mean the same in both modes (verl bypass_ppo_clip_geo_rs()).
WEIGHT_PARTS = frozenset({"token_tis", "sequence_tis", "token_band", "sequence_band"})


@dataclass(frozen=True)
class Part:
    """One function of `rlwb.core.rl.corrections` with its keyword arguments."""

    fn: str
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CatalogEntry:
    parts: tuple[Part, ...]
    peer: str  # who ships it, and the setting that reproduces it there
    what: str  # one line a reader of the race table understands
    url: str
    reading: str = ""  # set where no installed peer code checks it: rlwb's own reading, and the source it follows

    @property
    def checked_against(self) -> str:
        """For a reader of the race table: whose code this entry was held to, or that it is rlwb's reading."""
        if self.reading:
            return f"rlwb's own reading, not one peer's setting: {self.reading}"
        return "the peer's own code (tests/test_corrections.py)" if self.parts else "-"

    @property
    def weighs_tokens(self) -> bool:
        """Does it multiply loss terms by a ratio (so it is defined for `old_logprobs: trainer` only)?"""
        return any(p.fn in WEIGHT_PARTS for p in self.parts)


def _e(parts, peer, what, url, reading=""):
    return CatalogEntry(tuple(Part(f, k) for f, k in parts), peer, what, url, reading)


CATALOG: dict[str, CatalogEntry] = {
    "none": _e([], "-", "no correction: the engine's samples trained on as if on-policy", ""),
    # rlwb's own names (notebook 03 since the seeds), each a peer's rule: "tis" takes its cap from the `tis_cap`
    # param (at its default 2 it is verl's decoupled_token_is() and SkyRL's token TIS); "mis" and "seq_mask" are
    # verl's token and geometric rejection with rlwb's band [0.5, 2] (verl's presets use other bands)
    "tis": _e([("token_tis", {})], "rlwb (Yao et al. 2025); at tis_cap 2 verl rollout_is=token, SkyRL "
              "tis_ratio_type=token", "token TIS, weights min(r, tis_cap)", YAO),
    "mis": _e([("token_reject", {"lo": 0.5, "hi": 2.0})],
              "rlwb's band on verl rollout_rs=token_k1 (rollout_rs_threshold 0.5_2.0)",
              "tokens with r outside [0.5, 2] leave the loss and its token count", VERL),
    "seq_mask": _e([("sequence_reject_geometric", {"lo": 0.5, "hi": 2.0})],
                   "rlwb's band on verl rollout_rs=seq_mean_k1 (rollout_rs_threshold 0.5_2.0)",
                   "sequences whose geometric-mean r is outside [0.5, 2] leave the loss", VERL),
    # verl 0.9.1 RolloutCorrectionConfig presets (decoupled mode)
    "verl.token_tis": _e([("token_tis", {"cap": 2.0})], "verl decoupled_token_is()",
                         "token TIS, weights min(r, 2)", VERL_PRESETS),
    "verl.seq_tis": _e([("sequence_tis", {"cap": 2.0})], "verl decoupled_seq_is()",
                       "sequence TIS, weight min(prod r, 2) on every token", VERL_PRESETS),
    "verl.seq_mis": _e([("sequence_tis", {"cap": 2.0}), ("sequence_reject_product", {"lo": 0.5, "hi": 2.0})],
                       "verl decoupled_seq_is_rs() (Seq-MIS)",
                       "sequence TIS (cap 2) + sequences with prod r outside [0.5, 2] rejected", VERL_PRESETS),
    "verl.geo_rs": _e([("sequence_reject_geometric", {"lo": 1 / 1.001, "hi": 1 / 0.999})],
                      "verl decoupled_geo_rs() (Geo-RS, 0.999_1.001); with engine logprobs bypass_ppo_clip_geo_rs()",
                      "sequences whose geometric-mean r is off 1 by more than 0.1% rejected", VERL_PRESETS),
    # rlwb's length-scaled Geo-RS (notebook 08, issue 46): verl's band widened by sqrt(4096 / L) on an L-token
    # completion, so short completions face the rejection rate verl's band has at 4096 tokens
    "geo_rs_len": _e([("sequence_reject_geometric_scaled", {"lo": 1 / 1.001, "hi": 1 / 0.999, "ref_len": 4096})],
                     "rlwb (verl Geo-RS's band scaled by sqrt(4096 / length))",
                     "sequences whose geometric-mean r is off 1 by more than 0.1% x sqrt(4096 / length) rejected",
                     VERL, reading="verl's Geo-RS (decoupled_geo_rs(), 0.999_1.001) with its band scaled by the "
                                   "standard error of a mean of L log-ratios, sqrt(4096 / L): equal to verl's at "
                                   "4096 tokens; no peer ships a length-aware band"),
    "verl.k3_rs": _e([("sequence_reject_k3", {"threshold": 0.01})],
                     "verl decoupled_k3_rs(); with engine logprobs bypass_ppo_clip_k3_rs()",
                     "sequences whose mean k3 exceeds 0.01 rejected", VERL_PRESETS),
    "verl.geo_rs_token_tis": _e([("token_tis", {"cap": 2.0}),
                                 ("sequence_reject_geometric", {"lo": 1 / 1.001, "hi": 1 / 0.999})],
                                "verl decoupled_geo_rs_token_tis()", "token TIS (cap 2) + Geo-RS", VERL_PRESETS),
    "verl.token_tis_norm": _e([("token_tis", {"cap": 2.0, "normalize": True})],
                              "verl decoupled_token_is() + rollout_is_batch_normalize",
                              "token TIS, weights renormalised to mean 1 per batch", VERL),
    # IcePop: a band mask whose survivors keep their ratio as weight
    "icepop": _e([("token_band", {"lo": 0.5, "hi": 5.0})],
                 "OpenRLHF is_correction_level=token (mask, ratio, [0.5, 5]); verl decoupled_token_icepop()",
                 "token weight r inside [0.5, 5], 0 outside", ICEPOP),
    # SkyRL 0.3.0 off_policy_correction (recommended values from its config docs). Its token_mean loss divides by
    # the token count taken before these masks apply: a masked token weighs 0 and still counts (keep_in_count)
    "skyrl.geo_mask": _e([("sequence_reject_geometric", {"lo": 0.99, "hi": 1.01, "keep_in_count": True})],
                         "SkyRL sequence_mask_metric=geometric (0.99, 1.01)",
                         "sequences whose geometric-mean r is outside [0.99, 1.01] weigh 0", SKYRL),
    "skyrl.outlier_mask": _e([("outlier_token_reject", {"lo": 1e-4, "hi": 100.0, "keep_in_count": True})],
                             "SkyRL outlier_token_is_threshold_low/high (1e-4, 100)",
                             "sequences holding any token with r outside [1e-4, 100] weigh 0", SKYRL),
    "skyrl.token_mask": _e([("token_reject", {"lo": 0.5, "hi": 2.0, "keep_in_count": True})],
                           "SkyRL token_mask_is_threshold_low/high (0.5, 2)",
                           "tokens with r outside [0.5, 2] weigh 0", SKYRL),
    # TRL 1.16 vllm_importance_sampling_mode (clip_max 3.0, clip_min None); sequence_mask is TRL's default
    "trl.token_truncate": _e([("token_tis", {"cap": 3.0})], "TRL vllm_importance_sampling_mode=token_truncate",
                             "token TIS, weights min(r, 3)", TRL),
    "trl.token_mask": _e([("token_band", {"lo": None, "hi": 3.0})], "TRL vllm_importance_sampling_mode=token_mask",
                         "token weight r up to 3, 0 above", TRL),
    "trl.sequence_truncate": _e([("sequence_tis", {"cap": 3.0})],
                                "TRL vllm_importance_sampling_mode=sequence_truncate",
                                "sequence TIS, weight min(prod r, 3)", TRL),
    "trl.sequence_mask": _e([("sequence_band", {"lo": None, "hi": 3.0})],
                            "TRL vllm_importance_sampling_mode=sequence_mask (TRL's default)",
                            "sequence weight prod r up to 3, 0 above", TRL),
    "trl.opsm": _e([("off_policy_sequence_mask", {"delta": 0.5})],
                   "TRL off_policy_mask_threshold=0.5 (DeepSeek-V3.2 OPSM)",
                   "negative-advantage sequences with mean engine-trainer KL > 0.5 dropped", DSV32),
    # the stack the Miles/LMSYS 30B-MoE study found stable: two-sided token TIS, a geometric sequence mask
    # (SkyRL's recommended bounds), weights renormalised to mean 1. No installed peer ships it as one setting: the
    # renormalisation (verl) and the mask (SkyRL) are each held to their peer's code alone; the floor of the clamp
    # is Miles's, read in its source but run by no installed peer; rejected sequences leave the count, as in verl
    "miles.tis_geo_norm": _e([("token_tis", {"cap": 1.5, "floor": 0.5, "normalize": True}),
                              ("sequence_reject_geometric", {"lo": 0.99, "hi": 1.01})],
                             "Miles --use-tis --tis-clip-low 0.5 --tis-clip 1.5 + geometric mask + normalisation",
                             "token TIS clamped to [0.5, 1.5], mean 1 per batch, + geometric mask [0.99, 1.01]", YAO,
                             reading="the Miles/LMSYS 30B-MoE recipe composed from Miles's two-sided TIS clamp "
                                     "(radixark/miles vanilla_tis_function; Miles is not installed here, so no peer "
                                     "runs its floor), verl's batch renormalisation and SkyRL's geometric bounds"),
}

CORRECTIONS: tuple[str, ...] = tuple(CATALOG)

# per-step health numbers of a correction (`rlwb.core.rl.corrections.health`): curve columns the mismatch breaker
# can watch; ESS is the one where *low* is bad
HEALTH = ("is_weight_mean", "is_weight_std", "is_weight_max", "ess", "masked_frac", "truncated_frac",
          "seq_masked_frac")
LOWER_IS_WORSE = ("ess",)


def modes(name: str) -> tuple[str, ...]:
    """The `old_logprobs` modes correction `name` is defined in: a weighting correction in `trainer` (decoupled)
    only, a rejection-only one (or `none`) in both."""
    return ("trainer",) if CATALOG[name].weighs_tokens else ("trainer", "engine")


def check_modes(corrections: list[str], old_logprobs: str, param: str = "corrections") -> None:
    """Refuse, before any compute, a correction in a mode its peers do not define it for (ParamError)."""
    bad = [c for c in corrections if c in CATALOG and old_logprobs not in modes(c)]
    if bad:
        ok = [c for c in CATALOG if old_logprobs in modes(c)]
        raise ParamError(
            f"parameter {param!r}: {', '.join(bad)} weigh(s) each token by a ratio pi_trainer/pi_engine, but with "
            f"old_logprobs '{old_logprobs}' the PPO ratio is already pi_theta/pi_engine, so the weight would apply "
            f"twice (r * min(r, C)); verl's bypass PPO-clip loss turns its IS weights off for this reason "
            f"({VERL_BYPASS}). "
            f"Use old_logprobs: trainer (the decoupled mode the peers define these in), or corrections that only "
            f"reject tokens or sequences: {', '.join(ok)}")
