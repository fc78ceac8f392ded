"""GRPO's flags, the checks that refuse harmful or meaningless combinations, and the presets: named
recipes, each only the flags its paper names (the run's lr, G, μ = 2, KL term, trust region and
preservation stay unless listed); explicit flags override a preset. grpo.py's docstring gives the
defaults and why.

  grpo       the paper's loss, β 0.04 and k3 estimator (μ = 2, ε 1e-4 in the std, warm-up, gradient
             clip and trust region as everywhere here)
  dr_grpo    no std division, Σ over tokens / (B·max_len), β 0           (Dr. GRPO, 2503.20783)
  dapo       ε_high 0.28, equal-reward groups dropped, token-mean, β 0   (DAPO, 2503.14476; dropped, not
             re-sampled, and no overlong shaping: completions here are far below the length limit)
  gspo       sequence-level ratio, ε 3e-4 / 4e-4, β 0                  (GSPO, 2507.18071; one ratio per
             sequence, the paper's GSPO, not verl's GSPO-token variant)
  rloo       RLOO-style: leave-one-out baseline, no std, k1 KL (β 0.04) folded into the reward (RLOO, 2402.14740;
             departure: μ = 2 clipped updates, where RLOO takes one REINFORCE step)
  reinforce  REINFORCE++-style: batch-mean baseline and batch std, token-mean, k1 KL (β 0.04) folded into
             the reward as ONE scalar per sequence (2501.03262 puts it per token into token-level returns)
  j_beta     the exact gradient of J_β(π) = E_y[r(y)] − β·KL(π(·|x)‖π_ref(·|x)) over whole completions
             (β 0.1). Differentiating, with E[∇log π] = 0:
                 ∇J_β = E_{y~π}[(r(y) − β·log(π(y)/π_ref(y)) − b)·∇log π(y)], any b independent of y,
             and log π(y)/π_ref(y) = Σ_t log(π/π_ref)(y_t). So: k1 summed over the completion, in the reward
             (on-policy π_old = π_θ); RLOO's leave-one-out baseline (independent of y_i); no std division
             (a y-dependent rescaling per group); Σ over tokens per sequence, mean over sequences (no 1/|o|);
             μ = 1 (ρ ≡ 1: the expected update IS the gradient). Its fixed point is the exact optimum
             π*_β ∝ π_ref·e^{r/β} (minigrpo/exact/frontier.py): measured in bench's optimum section (README, "What
             only exact ground truth can show"). Every other preset changes the objective it climbs: the
             default's per-token KL under a 1/|o| mean is a length-dependent β, std division and clipping
             reweight groups and samples.
The second wave (the math: policy_losses.py, entropy_control.py, kl.py, advantages.py):
  cispo          −sg(clip(ρ, 1−ε_low, 1+ε_high))·Â·log π: clipped tokens keep a gradient (MiniMax-M1 2506.13585
                 eq. 4; ScaleRL 2510.13786). ε_high 4, ρ capped at 5 (TRL's epsilon_high 5.0, as ScaleRL);
                 ε_low 1: 1 − ε_low = 0 < ρ, no lower clamp (MiniMax-M1 sets none, TRL clamps only above);
                 token-mean, the paper's 1/Σ_i|o_i|. CISPO reads --clip-low/--clip-high as its weight's clamp.
  gmpo           exp(mean_t log ρ_t)·Â, the geometric mean of the token ratios, each log ρ_t clipped
                 pessimistically to (−ε, ε), ε 0.4 (GMPO 2507.20673). A sequence loss (−J_i/|o_i| on each token
                 of row i): --policy-loss gmpo always reduces it as the paper's (1/B)·Σ_i −J_i (SEQUENCE_LOSSES),
                 while --loss-agg keeps reducing the KL term: with the preset setting --loss-agg
                 seq-mean-token-sum instead, β·Σ_t KL_t per sequence was ~|o| times the default's KL weight and
                 the runs stopped on a plateau at target rate 0.35 (measured: pizza, seeds 0-4, median)
  sapo           the soft gate (4/τ)·σ(τ(ρ − 1))·Â instead of the clip, τ_pos 1.0, τ_neg 1.05 (SAPO 2511.20347)
  clip_cov       each update detaches the policy loss of a random 2e-4 share of the tokens whose covariance
                 c_t = (Â_t − Ā)(log π_t − mean log π) lies in [1, 5] and whose ratio the clip does not already
                 stop (Cui et al. 2505.22617, verl clip_cov). The paper's share is kept: a rollout of ~500 tokens
                 (64 completions here) has at most ONE such token per update (max(1, ⌊2e-4·N⌋) = 1)
  kl_cov         the unclipped −ρ·Â plus 1·|log ρ_t| on the top 2e-4 share of tokens by c_t (same paper, verl
                 kl_cov: KL-Cov replaces the clip; again one token per update here)
  entropy_8020   only the top 20 % of tokens by the CURRENT policy's entropy carry the policy loss, chosen anew
                 at every update from its own logits (Wang et al. 2506.01939, TRL top_entropy_quantile);
                 --fork-entropy thresholds π_ref's entropy instead
  remax          Â = r − r(greedy completion of π_old for the same prompt), no std, μ = 1 (ReMax 2310.10505:
                 REINFORCE with a greedy baseline; one extra greedy decode per prompt per step)
  reinforce_rej  all-correct and all-wrong (all-equal) groups dropped (--skip-equal-groups, the same flag as
                 DAPO's), no std division (Xiong et al. 2504.11343: the std is not what helps GRPO). Departure:
                 the group-mean baseline is kept; whether the paper's Reinforce subtracts one was not checked
  gpg            Â = r − group mean, times α = N/#(Â ≠ 0) over the batch (undoes the dilution by zero-advantage
                 samples), μ = 1 (no surrogate: ρ ≡ 1), β 0 (no KL, no reference in the loss) (GPG 2504.02546)
  random_reward  the rewards replaced by Bernoulli(0.5) draws from their own seeded stream, blind to the
                 completions (Shao et al. 2506.10947: a control; with the clip the policy still moves)
Departures common to the second wave: the KL term (exact) stays in every preset but gpg, whose paper names
its removal; the papers' own KL settings differ and are not what each one changes. Its weight is the run's
β 0.3, except in remax and reinforce_rej, β 0.1: they do not divide by the group std, so their advantages are
about σ ≈ 0.35 times the default's on pizza and β 0.3 weighed some 3× more; with it, both settled at P(pizza)
0.79 (implied β 0.33) and missed the goal on 10 of 10 seeds; with β 0.1 both pass every bar (README "The second
wave": pizza over seeds 0-9, apple pie over seeds 0-4). Clip-Cov detaches
(the loss value keeps the token, its gradient is 0) where verl multiplies by 0 (the same gradient).
The sampler-trainer mismatch lab (is_correction.py; rollout.Sampler): rollouts from a distribution π_sampler
other than π_old, and the importance weights w = π_old/π_sampler that correct it.
  --sample-temperature T   sample at temperature T (π_old and π_ref stay at --temperature)
  --sample-top-p P         sample from the top-p nucleus (the truncated mass can never be sampled: no weight
                           corrects that part of the gradient; bench's mismatch section measures it)
  --sample-stale N         sample from the policy as it was N steps earlier (asynchronous RL; the first N
                           steps sample from the initial policy); the snapshots are in the checkpoint
  --is-correction tis|mis  multiply each token's policy loss by the weight before aggregation, as TRL
                           (vllm_importance_sampling_correction: per_token_loss *= ratio, before the KL term is
                           added) and verl (rollout correction: pg_losses * rollout_is_weights) do; the KL,
                           entropy and preservation terms are not weighted. tis: min(w, C), --is-cap C (default
                           2, verl's; TRL's cap default differs by version); mis (IcePop): w·1[LOW ≤ w ≤ HIGH],
                           --is-band LOW,HIGH (default 0.5,2, verl's). Departures: MIS zeroes the weight and keeps
                           the token in the aggregation's denominator (TRL's token_mask/sequence_mask), where
                           verl's rejection removes it from the response mask; our band has a lower edge (TRL
                           masks only above the cap). π_old is the current policy's log-probs from the first
                           update's forward pass (TRL recomputes them with the trainer, as here).
  --is-level token|sequence  w per token, or Π_t w_t over the completion on each of its tokens
Without a --sample-* flag the sampler is π_old itself through the KV cache: --is-correction is allowed there
and corrects only its rounding (weights within ~1e-6 of 1). Logged: sampler_kl (KL(π_sampler‖π_old) per
token, sampled), is_weight_mean, is_capped / is_masked (share of valid tokens). PPO has none of these flags.
The logged clip_frac_low/high always count PPO's bounds (--clip-low/--clip-high) on the token ratios: for
gmpo, sapo and kl_cov they say how far ρ went, not what their loss cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minigrpo.util.cli import UsageError, meta
from minigrpo.objectives.losses import AGG_MODES
from minigrpo.objectives.policy_losses import POLICY_LOSSES
from minigrpo.rl.config import RLConfig, check_ranges

PRESETS = {
    "grpo": {"kl": "k3", "beta": 0.04},
    "dr_grpo": {"adv_scale": "none", "loss_agg": "seq-mean-token-sum-norm", "beta": 0.0},
    "dapo": {"clip_high": 0.28, "skip_equal_groups": True, "loss_agg": "token-mean", "beta": 0.0},
    "gspo": {"ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "beta": 0.0},
    "rloo": {"baseline": "rloo", "adv_scale": "none", "kl": "k1", "kl_in": "reward", "loss_agg": "token-mean",
             "beta": 0.04},
    "reinforce": {"baseline": "batch", "adv_scale": "batch", "kl": "k1", "kl_in": "reward", "loss_agg": "token-mean",
                  "beta": 0.04},
    "j_beta": {"baseline": "rloo", "adv_scale": "none", "kl": "k1", "kl_in": "reward", "loss_agg": "seq-mean-token-sum",
               "updates": 1, "beta": 0.1},
    # the second wave (docstring above)
    "cispo": {"policy_loss": "cispo", "clip_low": 1.0, "clip_high": 4.0, "loss_agg": "token-mean"},
    "gmpo": {"policy_loss": "gmpo", "gmpo_eps": 0.4},
    "sapo": {"policy_loss": "sapo", "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05},
    "clip_cov": {"cov_control": "clip_cov", "cov_ratio": 2e-4, "clip_cov_low": 1.0, "clip_cov_high": 5.0},
    "kl_cov": {"cov_control": "kl_cov", "cov_ratio": 2e-4, "kl_cov_coef": 1.0},
    "entropy_8020": {"top_entropy": 0.2},
    "remax": {"baseline": "remax", "adv_scale": "none", "updates": 1, "beta": 0.1},
    "reinforce_rej": {"skip_equal_groups": True, "adv_scale": "none", "beta": 0.1},
    "gpg": {"adv_scale": "gpg", "updates": 1, "beta": 0.0},
    "random_reward": {"random_reward": True},
}

# each policy loss's keyword hyper-parameters, read from the flags (policy_losses.POLICY_LOSSES[name] takes them)
LOSS_HYPER = {
    "ppo_clip": lambda c: {"eps_low": c.clip_low, "eps_high": c.clip_high, "dual_clip": c.dual_clip, "level": c.ratio},
    "cispo": lambda c: {"eps_low": c.clip_low, "eps_high": c.clip_low if c.clip_high is None else c.clip_high},
    "gmpo": lambda c: {"eps": c.gmpo_eps},
    "sapo": lambda c: {"tau_pos": c.sapo_tau_pos, "tau_neg": c.sapo_tau_neg},
}
# policy losses that are sequence losses spread over their row's tokens: their own reduction, whatever --loss-agg
SEQUENCE_LOSSES = {"gmpo": "seq-mean-token-sum"}  # (1/B)·Σ_i Σ_t (−J_i/|o_i|) = (1/B)·Σ_i −J_i
KL_CHOICES = ["k1", "k2", "k3", "k3+", "k3_iw", "exact"]


@dataclass
class GRPOConfig(RLConfig):
    preset: str | None = field(default=None, metadata=meta(
        "set several flags at once (explicit flags win)", choices=sorted(PRESETS)))
    updates: int = field(default=2, metadata=meta(
        "μ: inner updates per rollout (1 makes the ratio identically 1 and the clip dead)"))
    policy_loss: str = field(default="ppo_clip", metadata=meta(
        "the per-token policy loss (policy_losses.py): PPO's clip, CISPO, GMPO or SAPO",
        choices=sorted(POLICY_LOSSES)))
    clip_low: float = field(default=0.2, metadata=meta(
        "ε_low: ratio clipped below at 1−ε_low (cispo: its weight's lower clamp, 1 = none)"))
    clip_high: float | None = field(default=None, metadata=meta(
        "ε_high: ratio clipped above at 1+ε_high (default ε_low; DAPO 0.28; cispo: its weight's cap, preset 4)"))
    dual_clip: float | None = field(default=None, metadata=meta(
        "dual-clip constant c > 1 bounding the loss for negative advantages (ppo_clip only)"))
    gmpo_eps: float = field(default=0.4, metadata=meta(
        "GMPO: each log ρ_t clipped to (−ε, ε) (the paper's 0.4)"))
    sapo_tau_pos: float = field(default=1.0, metadata=meta("SAPO: the gate's temperature τ where Â > 0"))
    sapo_tau_neg: float = field(default=1.05, metadata=meta("SAPO: the gate's temperature τ where Â ≤ 0"))
    beta: float = field(default=0.3, metadata=meta("β: KL(π‖π_ref) weight (the paper: 0.04; see grpo.py)"))
    kl: str = field(default="exact", metadata=meta(
        "KL estimator per token (exact: full vocabulary; the paper uses k3; k3+: k3's value, k2's gradient; "
        "k3_iw: ρ·k3, DeepSeek-V3.2; kl.py)", choices=KL_CHOICES))
    rollout_kl: bool = field(default=True, metadata=meta(
        "log the per-token KL(π‖π_ref) on each rollout even when nothing else needs π_ref's log-probs (β = 0, no "
        "--fork-entropy): one no-grad forward of π_ref a step, which --no-rollout-kl skips, as TRL does at β = 0 "
        "(the exact evaluation's kl_ref is logged either way)"))
    kl_in: str = field(default="loss", metadata=meta(
        "where the KL goes: a loss term, or subtracted from the reward (β·Σ_t k)", choices=["loss", "reward"]))
    baseline: str = field(default="group", metadata=meta(
        "reward baseline: group mean, leave-one-out (rloo), batch mean, or the reward of π_old's greedy "
        "completion (remax)", choices=["group", "rloo", "batch", "remax"]))
    adv_scale: str = field(default="group", metadata=meta(
        "divide advantages by the group std, the batch std, or nothing; gpg: nothing, times N/#(Â ≠ 0)",
        choices=["group", "batch", "none", "gpg"]))
    adv_std: str = field(default="unbiased", metadata=meta(
        "std with Bessel's correction (paper, TRL) or the population std", choices=["unbiased", "population"]))
    adv_eps: float = field(default=1e-4, metadata={"help": "ε added to the std"})
    loss_agg: str = field(default="seq-mean-token-mean", metadata=meta(
        "loss aggregation over tokens and sequences (gmpo's sequence loss keeps its own)", choices=list(AGG_MODES)))
    ratio: str = field(default="token", metadata=meta(
        "importance ratio per token, or one per sequence (GSPO; not GSPO-token; ppo_clip only)",
        choices=["token", "sequence"]))
    entropy_coef: float = field(default=0.0, metadata=meta(
        "entropy bonus weight (with --entropy-target: the adaptive coefficient's start)"))
    entropy_target: float | None = field(default=None, metadata=meta(
        "adaptive entropy control (Skywork-OR1), a target token entropy in nats: the bonus coefficient rises by "
        "--entropy-step each step the rollout's entropy is below it, falls while above, acts only at or below "
        "it (default off)"))
    entropy_step: float = field(default=1e-4, metadata=meta(
        "adaptive entropy control: the coefficient's change per step (Skywork-OR1's script: 1e-4)"))
    entropy_coef_max: float = field(default=0.005, metadata=meta(
        "adaptive entropy control: the coefficient stays in [0, this] (Skywork-OR1's script: 0.005)"))
    fork_entropy: float = field(default=0.0, metadata=meta(
        "only tokens where π_ref's entropy is >= this (nats) carry the policy loss (0 = all; "
        "losses.forking_token_mask)"))
    top_entropy: float = field(default=1.0, metadata=meta(
        "ρ: only the top ρ share of tokens by the CURRENT policy's entropy carry the policy loss (80/20 rule: "
        "0.2; 1 = all)"))
    cov_control: str = field(default="none", metadata=meta(
        "Clip-Cov (detach a random share of high-covariance tokens) or KL-Cov (unclipped loss + k·|log ρ| on the "
        "top share by covariance) (entropy_control.py; ppo_clip, token ratio)", choices=["none", "clip_cov", "kl_cov"]))
    cov_ratio: float = field(default=2e-4, metadata=meta(
        "Clip-Cov / KL-Cov: the share of valid tokens selected (at least one; the paper's 2e-4)"))
    clip_cov_low: float = field(default=1.0, metadata=meta("Clip-Cov: candidates have covariance >= this"))
    clip_cov_high: float = field(default=5.0, metadata=meta("Clip-Cov: candidates have covariance <= this"))
    kl_cov_coef: float = field(default=1.0, metadata=meta("KL-Cov: k, the weight of |log ρ| on the selected tokens"))
    skip_equal_groups: bool = field(default=False, metadata=meta(
        "drop groups whose rewards are all equal (they carry no signal; DAPO's and REINFORCE-Rej's filter)"))
    random_reward: bool = field(default=False, metadata=meta(
        "a control: replace every reward by a seeded Bernoulli(0.5) draw, blind to the completion (2506.10947)"))
    sample_temperature: float | None = field(default=None, metadata=meta(
        "sample the rollouts at this temperature (default --temperature; π_old stays at --temperature)"))
    sample_top_p: float | None = field(default=None, metadata=meta(
        "sample the rollouts from the top-p nucleus of the sampler's distribution (default: no truncation)"))
    sample_stale: int = field(default=0, metadata=meta(
        "sample the rollouts from the policy as it was N steps earlier (asynchronous RL; 0 = the current one)"))
    is_correction: str = field(default="none", metadata=meta(
        "importance weights π_old/π_sampler on the per-token policy loss: truncated (tis) or masked (mis, "
        "IcePop) (is_correction.py)", choices=["none", "tis", "mis"]))
    is_level: str = field(default="token", metadata=meta(
        "the weight per token, or Π_t over the completion (sequence)", choices=["token", "sequence"]))
    is_cap: float | None = field(default=None, metadata=meta("TIS: the cap C >= 1 of min(w, C) (default 2, verl's)"))
    is_band: str | None = field(default=None, metadata=meta(
        "MIS: LOW,HIGH, the band of weights kept, LOW <= 1 <= HIGH (default 0.5,2, verl's)"))


def check_grpo_config(cfg: GRPOConfig) -> None:
    """Refuse values and combinations GRPO cannot run as asked, with one line each."""
    check_ranges(cfg, {"clip_low": (0, 1), "clip_high": (0, None), "beta": (0, None), "adv_eps": (0, None),
                       "entropy_coef": (None, None), "fork_entropy": (0, None), "gmpo_eps": (0, None),
                       "sapo_tau_pos": (1e-6, None), "sapo_tau_neg": (1e-6, None), "entropy_target": (0, None),
                       "entropy_step": (0, None), "entropy_coef_max": (0, None), "top_entropy": (1e-6, 1),
                       "cov_ratio": (0, 1), "clip_cov_low": (None, None), "clip_cov_high": (None, None),
                       "kl_cov_coef": (0, None)})
    if cfg.updates < 1:
        raise UsageError(f"--updates must be >= 1, got {cfg.updates}")
    if cfg.dual_clip is not None and cfg.dual_clip <= 1:
        raise UsageError(f"--dual-clip must be > 1, got {cfg.dual_clip}")
    if cfg.kl_in == "reward" and cfg.beta > 0 and cfg.kl not in ("k1", "k2", "k3"):
        raise UsageError(f"--kl {cfg.kl} works only with --kl-in loss (the reward penalty uses k1, k2 or k3; "
                         f"k3+ and k3_iw differ from k3 only in their gradient)")
    if cfg.adv_scale == "group" and cfg.baseline != "group":
        raise UsageError(f"--adv-scale group needs --baseline group (got {cfg.baseline}); "
                         f"use --adv-scale batch or none")
    if cfg.policy_loss != "ppo_clip" and (cfg.ratio != "token" or cfg.dual_clip is not None):
        raise UsageError(f"--ratio sequence and --dual-clip belong to --policy-loss ppo_clip, not {cfg.policy_loss}")
    if cfg.cov_control != "none" and (cfg.policy_loss != "ppo_clip" or cfg.ratio != "token"):
        raise UsageError(f"--cov-control {cfg.cov_control} acts on --policy-loss ppo_clip with --ratio token "
                         f"(Cui et al.'s loss), got {cfg.policy_loss} with --ratio {cfg.ratio}")
    if cfg.clip_cov_low > cfg.clip_cov_high:
        raise UsageError(f"--clip-cov-low {cfg.clip_cov_low} is above --clip-cov-high {cfg.clip_cov_high}")
    if not cfg.rollout_kl and (cfg.beta > 0 or cfg.fork_entropy > 0):
        raise UsageError(f"--no-rollout-kl skips π_ref's log-probs, which --beta {cfg.beta:g}"
                         f"{' and --fork-entropy' if cfg.fork_entropy > 0 else ''} need: add --beta 0"
                         f"{' and drop --fork-entropy' if cfg.fork_entropy > 0 else ''}, or keep the metrics")
    check_mismatch(cfg)
    if cfg.random_reward and cfg.baseline == "remax":
        raise UsageError("--random-reward replaces the sampled rewards; --baseline remax would compare them with "
                         "a real greedy reward: use another baseline")



def mismatch(cfg: GRPOConfig) -> bool:
    """True when the rollouts come from a distribution other than π_old (a --sample-* flag is set)."""
    return cfg.sample_temperature is not None or cfg.sample_top_p is not None or cfg.sample_stale > 0


def is_band(cfg: GRPOConfig) -> tuple[float, float]:
    """--is-band LOW,HIGH as two floats (default verl's 0.5, 2)."""
    if cfg.is_band is None:
        return 0.5, 2.0
    try:
        low, high = (float(x) for x in cfg.is_band.split(","))
    except ValueError:
        raise UsageError(f"--is-band must be LOW,HIGH (two numbers), got {cfg.is_band!r}") from None
    if not (0 <= low <= 1 <= high < float("inf")):
        raise UsageError(f"--is-band needs 0 <= LOW <= 1 <= HIGH (a weight of 1 must pass), got {cfg.is_band!r}")
    return low, high


def check_mismatch(cfg: GRPOConfig) -> None:
    """The sampler-mismatch flags: ranges, and no flag that the chosen correction would ignore."""
    check_ranges(cfg, {"sample_temperature": (1e-3, None), "sample_top_p": (1e-6, 1), "is_cap": (1, None)})
    if cfg.sample_stale < 0:
        raise UsageError(f"--sample-stale must be >= 0, got {cfg.sample_stale}")
    is_band(cfg)
    ignored = [(cfg.is_level != "token", "--is-level", "tis or mis"), (cfg.is_cap is not None, "--is-cap", "tis"),
               (cfg.is_band is not None, "--is-band", "mis")]
    for given, flag, kinds in ignored:
        if given and cfg.is_correction not in kinds.split(" or "):
            raise UsageError(f"{flag} belongs to --is-correction {kinds}, got --is-correction {cfg.is_correction}")
