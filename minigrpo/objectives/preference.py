"""Learning from preferences: DPO's loss and the pairs an online variant builds from rewarded
samples.

    dpo_loss           −log σ(β[(log π − log π_ref)(y_w) − (log π − log π_ref)(y_l)])   (DPO,
                       2305.18290 eq. 7)
    preference_pairs   (chosen, rejected) pairs from a group of sampled completions ranked by reward
                       (online DPO: pairs sampled from the current policy and labelled online,
                       2402.04792)

With preferences drawn from a Bradley-Terry model of r and enough of them, DPO's minimiser is the
same π*_β ∝ π_ref·e^{r/β} that frontier.optimum computes (Rafailov et al. 2023, §4); here the pairs
come from sampled completions ranked by the task's reward instead of human labels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAIR_MODES = ("all", "best_worst")


def dpo_loss(
    policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp, beta: float = 0.1
) -> torch.Tensor:
    """DPO per pair:  L = −log σ(β·m),  m = (log π_θ − log π_ref)(y_w) − (log π_θ − log π_ref)(y_l).

    Inputs: SEQUENCE log-probs (B,) of the chosen y_w and the rejected y_l under the policy and the
    reference (lm.logprobs.sequence_logp); output (B,), to average over pairs (Rafailov et al. 2023,
    arXiv 2305.18290, eq. 7). Computed as −logsigmoid(β·m): finite and exact at margins of ±1e4
    (log(1 + e^{−x}) would overflow). Facts the tests pin: L = log 2 when the two log-ratios are
    equal; ∂L/∂log π_θ(y_w) = −β·σ(−β·m) < 0 and ∂L/∂log π_θ(y_l) = +β·σ(−β·m) > 0 (descent raises
    the chosen, lowers the rejected); swapping the pair gives L(w, l) − L(l, w) = −β·m and
    e^{−L(w,l)} + e^{−L(l,w)} = 1.
    """
    margin = (policy_chosen_logp - ref_chosen_logp) - (policy_rejected_logp - ref_rejected_logp)
    return -F.logsigmoid(beta * margin)


def preference_pairs(
    rewards: torch.Tensor, mode: str = "all"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs (chosen, rejected) within each group of sampled completions,  rewards (B, G) ->
    (group, chosen, rejected), three LongTensors (P,): completion (group[p], chosen[p]) is preferred
    to (group[p], rejected[p]), whose reward is strictly lower.

    mode "all":        every ordered pair i, j of a group with r_i > r_j; ties make no pair (P = Σ_b
    of
                       the number of such pairs; with 0/1 rewards, #correct·#wrong per group)
    mode "best_worst": one pair per group, its highest reward against its lowest (the first sample
    among
                       equals), and none for a group whose rewards are all equal
    Source: online DPO (Guo et al. 2024, arXiv 2402.04792) samples the pair from the current policy
    and has it labelled online; with a reward function the labelling is the comparison r_i > r_j.
    Groups whose rewards are all equal give no pair in either mode (no preference to learn from).
    Pairs come in row-major order (group, then chosen, then rejected).
    """
    if mode not in PAIR_MODES:
        raise ValueError(f"mode must be one of {PAIR_MODES}, got {mode!r}")
    if mode == "all":
        # (B, G, G): better[b, i, j] = r_bi > r_bj
        better = rewards[:, :, None] > rewards[:, None, :]
        group, chosen, rejected = better.nonzero(as_tuple=True)
        return group, chosen, rejected
    # (B,) each: first index among equals
    best, worst = rewards.argmax(dim=1), rewards.argmin(dim=1)
    # groups with any contrast
    group = (rewards.amax(dim=1) > rewards.amin(dim=1)).nonzero(as_tuple=True)[0]
    return group, best[group], worst[group]
