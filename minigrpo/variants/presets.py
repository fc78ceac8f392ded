"""Presets: named recipes, each only the flags its paper names; explicit flags override a preset.
The run's lr, G, μ = 2, exact KL term, trust region and preservation stay unless listed. Details and
measured figures: docs/algorithms.md.

  grpo           (DeepSeekMath 2402.03300) the paper's loss with β 0.04 and the k3 estimator
  dr_grpo        (Dr. GRPO 2503.20783) no std division, Σ over tokens / (B·max_len), β 0
  dapo           (DAPO 2503.14476) ε_high 0.28, equal-reward groups dropped (not re-sampled),
                 token-mean, β 0; no overlong shaping: completions here are far below the length
                 limit
  gspo           (GSPO 2507.18071) one ratio per sequence (not GSPO-token), ε 3e-4 / 4e-4, β 0
  rloo           (RLOO 2402.14740) leave-one-out baseline, no std, k1 KL (β 0.04) in the reward;
                 departure: μ = 2 clipped updates where RLOO takes one REINFORCE step
  reinforce      (REINFORCE++ 2501.03262) batch-mean baseline and batch std, token-mean, k1 KL (β
                 0.04) in the reward as ONE scalar per sequence (the paper puts it per token into
                 the returns)
  j_beta         the exact gradient of J_β = E[r] − β·KL(π‖π_ref) over whole completions (β 0.1): k1
                 summed over the completion in the reward, leave-one-out baseline, no std, Σ over
                 tokens, μ = 1; its fixed point is π*_β ∝ π_ref·e^{r/β} (minigrpo/exact/frontier.py)
  cispo          (MiniMax-M1 2506.13585) ε_high 4 (ρ capped at 5, TRL's epsilon_high 5), ε_low 1 (no
                 lower clamp), token-mean
  gmpo           (GMPO 2507.20673) geometric mean of the token ratios, ε 0.4
  sapo           (SAPO 2511.20347) soft gate, τ_pos 1.0, τ_neg 1.05
  clip_cov       (Cui et al. 2505.22617) detach a random 2e-4 share of tokens with covariance in
                 [1, 5]
  kl_cov         (same paper) unclipped loss + 1·|log ρ| on the top 2e-4 share by covariance
  entropy_8020   (Wang et al. 2506.01939) only the top 20 % of tokens by the current policy's
                 entropy
  remax          (ReMax 2310.10505) Â = r − r(greedy completion of π_old), no std, μ = 1
  reinforce_rej  (2504.11343) all-equal groups dropped, no std; departure: the group-mean baseline
                 is kept
  gpg            (GPG 2504.02546) Â = r − group mean, times α = N/#(Â ≠ 0), μ = 1, β 0
  random_reward  (2506.10947) Bernoulli(0.5) rewards from their own stream, blind to the completions
Departures common to cispo … random_reward: the exact KL term stays (gpg's paper removes it), at the
run's β 0.3, except remax and reinforce_rej at β 0.1: without the std division their advantages are
about 0.35 times the default's on pizza, so β 0.3 weighed some 3× more.
"""

PRESETS = {
    "grpo": {"kl": "k3", "beta": 0.04},
    "dr_grpo": {"adv_scale": "none", "loss_agg": "seq-mean-token-sum-norm", "beta": 0.0},
    "dapo": {"clip_high": 0.28, "skip_equal_groups": True, "loss_agg": "token-mean", "beta": 0.0},
    "gspo": {"ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "beta": 0.0},
    "rloo": {
        "baseline": "rloo",
        "adv_scale": "none",
        "kl": "k1",
        "kl_in": "reward",
        "loss_agg": "token-mean",
        "beta": 0.04,
    },
    "reinforce": {
        "baseline": "batch",
        "adv_scale": "batch",
        "kl": "k1",
        "kl_in": "reward",
        "loss_agg": "token-mean",
        "beta": 0.04,
    },
    "j_beta": {
        "baseline": "rloo",
        "adv_scale": "none",
        "kl": "k1",
        "kl_in": "reward",
        "loss_agg": "seq-mean-token-sum",
        "updates": 1,
        "beta": 0.1,
    },
    "cispo": {"policy_loss": "cispo", "clip_low": 1.0, "clip_high": 4.0, "loss_agg": "token-mean"},
    "gmpo": {"policy_loss": "gmpo", "gmpo_eps": 0.4},
    "sapo": {"policy_loss": "sapo", "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05},
    "clip_cov": {
        "cov_control": "clip_cov",
        "cov_ratio": 2e-4,
        "clip_cov_low": 1.0,
        "clip_cov_high": 5.0,
    },
    "kl_cov": {"cov_control": "kl_cov", "cov_ratio": 2e-4, "kl_cov_coef": 1.0},
    "entropy_8020": {"top_entropy": 0.2},
    "remax": {"baseline": "remax", "adv_scale": "none", "updates": 1, "beta": 0.1},
    "reinforce_rej": {"skip_equal_groups": True, "adv_scale": "none", "beta": 0.1},
    "gpg": {"adv_scale": "gpg", "updates": 1, "beta": 0.0},
    "random_reward": {"random_reward": True},
}
