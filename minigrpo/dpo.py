"""DPO (Rafailov et al. 2023, arXiv 2305.18290) and online DPO (Guo et al. 2024, arXiv 2402.04792).

    python -m minigrpo.dpo --reward pizza              # offline: pairs from a fixed set of π_ref
                                                       # samples
    python -m minigrpo.dpo --reward pizza --online     # online: pairs from each step's own rollout
    python -m minigrpo.dpo --reward pizza --labels bt --beta 0.3      # lands on π*_β (see below)

Per update, over the drawn pairs (y_w ranked above y_l), with sequence log-probs
(lm/logprobs.sequence_logp):

    L = mean_pairs[ p·ℓ(m) + (1 − p)·ℓ(−m) ]  (+ α·NLL(y_w)/|y_w|  + c·KL_exact on the rollout)  +
                                              preservation
    ℓ(m) = −log σ(β·m),   m = (log π_θ − log π_ref)(y_w) − (log π_θ − log π_ref)(y_l)
                          (preference.dpo_loss)
    p = 1  (--labels hard, default: the paper's eq. 7 on ranked pairs)   or   p = σ(r(y_w) − r(y_l))
           (--labels bt)

Pairs: within one prompt's samples, y_w ranks above y_l when r(y_w) > r(y_l)
(preference.preference_pairs: --pairs all, every such ordered pair; best_worst, one per group).
Offline: K = --offline-samples completions per RL prompt drawn ONCE from π_ref (their own generator,
rl.purpose_seed(seed, "dpo_pairs")), ranked, their π_ref log-probs kept; each update draws
--pairs-per-step of those pairs. Online: the pairs of the step's own rollout (G samples per prompt
from the current policy), so they follow the policy. A step with no pair (every group's rewards
equal) runs the other terms only. rl.run owns the rest: the rollout, exact evaluation, the stop
rule, the trust region, preservation, metrics, checkpoints and --resume (the pair set and the
pair-draw generator are this algorithm's state).

Where DPO ends. Its loss is the likelihood of Bradley–Terry preferences P(y_w ≻ y_l) = σ(r_w − r_l),
and its minimiser is π*_β ∝ π_ref·e^{r/β} (frontier.optimum) only when the labels ARE such draws. A
ranking by the reward says y_w wins with probability 1: no finite margin fits it, so hard labels
push every rejected completion down without end and overshoot π*_β. The loss is linear in the label,
so the soft label σ(Δr) (--labels bt) is the expected loss over Bradley–Terry draws; its gradient
vanishes at β·m = Δr, π*_β's own margin (tests/test_dpo.py). Hard labels overshoot π*_β, bt labels
land on it: docs/experiments.md.

Departures from the papers:
  - none in the loss by default; --labels bt (above), --sft-coef α (RPO's NLL of y_w, Pang et al.
    2404.19733, TRL's rpo_alpha) and --kl-coef c (the exact per-token KL on the rollout, GRPO's
    term) are flags, all off.
  - the run's per-step rollout (G x prompts samples of the current policy) is collected in offline
    mode too (rl/loop.py does so for every algorithm); offline DPO trains on none of it: it logs the
    on-policy reward and exact KL and is the trust region's probe.
  - preservation (rl/preserve.py: the other people, and the RL prompt's own forced states), the
    5-step warm-up, the gradient clip and the trust region apply as to every algorithm; lr 6e-4 (the
    papers: ~5e-7 on billion-parameter models).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from minigrpo.lm.logprobs import generation_logprobs, sequence_logp
from minigrpo.lm.sampling import Generation
from minigrpo.objectives.kl import exact
from minigrpo.objectives.losses import aggregate
from minigrpo.objectives.preference import PAIR_MODES, dpo_loss, preference_pairs
from minigrpo.rl.config import RLConfig, parse_rl_config
from minigrpo.rl.loop import run
from minigrpo.rl.report import COST_PANELS, OUTCOME_PANELS, combine_stats
from minigrpo.rl.rollout import RolloutBatch, collect
from minigrpo.rl.run_state import purpose_seed
from minigrpo.util.cli import (
    UsageError,
    check_ranges,
    exit_now,
    finish_unread,
    flag,
    main_guard,
    require,
)


@dataclass
class DPOConfig(RLConfig):
    """DPO: pairs, labels, the loss"""

    beta: float = flag(
        0.1,
        "β: DPO's sequence-level β, the scale of the log-ratio margin (the paper's 0.1; see "
        "dpo.py)",
    )
    online: bool = flag(
        False,
        "online DPO: pairs from each step's rollout of the current policy (off: a fixed set of "
        "π_ref samples)",
    )
    pairs: str = flag(
        "all",
        "pairs per group of samples: every ordered pair with r_w > r_l, or the best against the "
        "worst",
        choices=list(PAIR_MODES),
    )
    offline_samples: int = flag(
        256,
        "offline: K, π_ref samples per RL prompt, drawn once (a rare target, p = 0.02, needs K of "
        "a few hundred)",
    )
    pairs_per_step: int = flag(
        64,
        "pairs drawn (without replacement) for each update: from the fixed set offline, from the "
        "rollout online",
    )
    updates: int = flag(1, "updates per step, each on a fresh draw of pairs")
    sft_coef: float = flag(
        0.0,
        "α: + α·NLL of each chosen completion per token (RPO, Pang et al. 2404.19733, TRL's "
        "rpo_alpha; the paper's DPO: 0)",
    )
    labels: str = flag(
        "hard",
        "hard: y_w preferred with probability 1 (the paper's DPO on ranked pairs; overshoots "
        "π*_β, see dpo.py); bt: the Bradley–Terry probability σ(r_w − r_l) as a soft label "
        "(cDPO's form), whose minimiser is π*_β",
        choices=["hard", "bt"],
    )
    kl_coef: float = flag(
        0.0,
        "+ this x the exact KL(π‖π_ref) per token (full vocabulary) on the step's rollout, as "
        "GRPO's β (the paper's DPO: 0)",
    )


def sample_pair_set(policy, tok, prompts: list[str], k: int, reward, cfg, generator) -> dict:
    """K completions per prompt from `policy` (π_ref), scored and ranked -> the fixed offline pair
    set: the samples' Generation fields, their rewards (n·K,), their π_ref sequence log-probs (n·K,)
    and the pairs' row indices "chosen", "rejected" (P,) into those samples."""
    # the rollout's own sampling, scoring and π_ref log-probs (policy = ref = π_ref; no π_old
    # needed)
    batch = collect(
        policy,
        policy,
        tok,
        prompts,
        k,
        reward,
        generator,
        cfg.max_new_tokens,
        cfg.temperature,
        cfg.unfinished_reward,
        old_logp=False,
    )
    gen, rewards, ref_seq = batch.gen, batch.rewards, sequence_logp(batch.ref_logp, batch.mask)
    group, chosen, rejected = preference_pairs(rewards.view(len(prompts), k), cfg.pairs)
    if len(group) == 0:
        raise UsageError(
            f"the {k} π_ref samples per prompt hold no two with different rewards: no pair to "
            "learn from; raise --offline-samples (or use --online)"
        )
    return {
        **gen.to_dict(),
        "rewards": rewards,
        "ref_seq_logp": ref_seq,
        "chosen": group * k + chosen,
        "rejected": group * k + rejected,
    }


class DPO:
    needs_ref = True  # the implicit reward is log π/π_ref
    # the exact KL per token on the rollout (logged; the vocabulary is ~30 characters)
    needs_ref_logits = True
    needs_old_logp = False
    sampler = None  # rollouts from π_old (rl/algorithm.py; the sampler-mismatch flags are GRPO's)

    def __init__(self, run):
        self.run, self.cfg, self.policy = run, run.cfg, run.policy
        device = next(self.policy.parameters()).device
        self.draws = torch.Generator().manual_seed(purpose_seed(self.cfg.seed, "dpo_minibatch"))
        self.pair_set = None
        # on resume, load_state_dict brings it back
        if not self.cfg.online and run.resume_state is None:
            g = torch.Generator(device).manual_seed(purpose_seed(self.cfg.seed, "dpo_pairs"))
            self.pair_set = sample_pair_set(
                run.ref, run.tok, run.prompts, self.cfg.offline_samples, run.reward, self.cfg, g
            )
            run.log(
                f"offline DPO: {len(self.pair_set['chosen'])} pairs from "
                f"{self.cfg.offline_samples} π_ref "
                f"samples per prompt (mean reward {self.pair_set['rewards'].mean().item():.3f})"
            )

    def parameters(self):
        return list(self.policy.parameters())

    def state_dict(self) -> dict:
        pairs = (
            None
            if self.pair_set is None
            else {
                k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in self.pair_set.items()
            }
        )
        return {"draws": self.draws.get_state(), "pair_set": pairs}

    def load_state_dict(self, state: dict) -> None:
        self.draws.set_state(state["draws"])
        device = next(self.policy.parameters()).device
        if state["pair_set"] is not None:
            self.pair_set = {
                k: v.to(device) if torch.is_tensor(v) else v for k, v in state["pair_set"].items()
            }

    def draw(self, n_pairs: int) -> torch.Tensor:
        """--pairs-per-step pair indices out of n_pairs, without replacement (all of them, if
        fewer)."""
        return torch.randperm(n_pairs, generator=self.draws)[: self.cfg.pairs_per_step]

    def pairs(self, batch: RolloutBatch):
        """-> the chosen and rejected rows (P,) each, the rows' π_ref sequence log-probs, lengths
        and rewards: of the rollout (online), or of the fixed π_ref samples (offline)."""
        if self.cfg.online:  # the rollout's pairs: rows of the batch, grouped G by G
            G = batch.group_size
            group, chosen, rejected = preference_pairs(batch.rewards.view(-1, G), self.cfg.pairs)
            return (
                group * G + chosen,
                group * G + rejected,
                sequence_logp(batch.ref_logp, batch.mask),
                batch.mask.sum(1),
                batch.rewards,
            )
        s = self.pair_set
        return (
            s["chosen"],
            s["rejected"],
            s["ref_seq_logp"],
            s["completion_mask"].sum(1),
            s["rewards"],
        )

    def update(self, batch: RolloutBatch, opt) -> dict:
        cfg = self.cfg
        chosen, rejected, ref_seq, lengths, rewards = self.pairs(batch)
        stats, per_update = {"pairs_available": float(len(chosen))}, []
        for i in range(cfg.updates if len(chosen) else 1):
            logp, logits = generation_logprobs(
                self.policy, batch.gen, cfg.temperature, return_logits=True
            )
            # (N, T): the exact KL(π‖π_ref) at the rollout's states
            kl_tok = exact(logits, batch.ref_logits)
            if i == 0:
                stats["kl_exact"] = aggregate(kl_tok.detach(), batch.mask, "token-mean").item()
            kl = aggregate(kl_tok, batch.mask, "seq-mean-token-mean") if cfg.kl_coef else None
            # no preference in this rollout: the KL term and preservation still act
            if len(chosen) == 0:
                per_update.append(self.step(opt, None, kl))
                stats["skipped"] = 1.0
                continue
            pick = self.draw(len(chosen)).to(chosen.device)
            w, l = chosen[pick], rejected[pick]
            if cfg.online:
                seq = sequence_logp(logp, batch.mask)
            else:  # one forward over the distinct samples the drawn pairs use
                rows = torch.unique(torch.cat([w, l]))
                gen = Generation.from_dict(self.pair_set).select(rows)
                seq = torch.zeros_like(ref_seq).index_copy(
                    0,
                    rows,
                    sequence_logp(
                        generation_logprobs(self.policy, gen, cfg.temperature), gen.completion_mask
                    ),
                )
            label = torch.sigmoid(rewards[w] - rewards[l]) if cfg.labels == "bt" else None
            per_update.append(
                self.step(opt, (seq[w], seq[l], ref_seq[w], ref_seq[l], lengths[w], label), kl)
            )
        return {**stats, **combine_stats(per_update)}

    def step(self, opt, pair, kl) -> dict:
        """One update: DPO on the drawn pairs (log π_θ and log π_ref of y_w and y_l, y_w's lengths
        in tokens and the label P(y_w ≻ y_l) (None: 1), (P,) each; pair None: no pair), + α·NLL(y_w)
        per token, + the KL term, + preservation.
        A label p < 1 gives p·L(y_w, y_l) + (1 − p)·L(y_l, y_w) (cDPO; TRL's label_smoothing = 1 −
        p)."""
        cfg, out, loss = self.cfg, {}, None
        add = lambda a, b: b if a is None else a + b
        if pair is not None:
            pc, pr, rc, rr, chosen_len, label = pair
            loss = dpo_loss(pc, pr, rc, rr, cfg.beta)
            if label is not None:  # soft: the expected loss when y_w wins with probability `label`
                loss = label * loss + (1 - label) * dpo_loss(pr, pc, rr, rc, cfg.beta)
            loss = loss.mean()
            # RPO's term: the chosen completions' NLL per token
            nll = -(pc / chosen_len.clamp(min=1)).mean()
            with torch.no_grad():
                margin = (pc - rc) - (pr - rr)
                out.update(
                    policy_loss=loss.item(),
                    pairs=float(len(pc)),
                    nll=nll.item(),
                    dpo_margin=(cfg.beta * margin).mean().item(),
                    dpo_accuracy=(margin > 0).float().mean().item(),
                    chosen_logratio=(pc - rc).mean().item(),
                    rejected_logratio=(pr - rr).mean().item(),
                )
            if cfg.sft_coef:
                loss = loss + cfg.sft_coef * nll
        if kl is not None:
            loss = add(loss, cfg.kl_coef * kl)
            out["kl_loss"] = kl.item()
        anchor = self.run.anchor_term()
        if anchor is not None:
            loss = add(loss, anchor)
            out["preserve_loss"] = anchor.item()
        if loss is not None:
            out["loss"] = loss.item()
            out["grad_norm"] = self.run.clip_and_step(opt, loss, self.parameters())
        return out


PANELS = (
    OUTCOME_PANELS
    + [
        ("DPO margin β·m, mean over the pairs (higher = more separated)", ["dpo_margin"]),
        ("pair accuracy: share with m > 0", ["dpo_accuracy"]),
        ("log π_θ/π_ref: chosen, rejected", ["chosen_logratio", "rejected_logratio"]),
        ("pairs: available, used per update", ["pairs_available", "pairs"]),
        ("KL to π_ref per token on the rollout (lower = closer)", ["kl_exact"]),
    ]
    + COST_PANELS
)


def check_config(cfg: DPOConfig) -> None:
    check_ranges(cfg, {"beta": (1e-9, None), "sft_coef": (0, None), "kl_coef": (0, None)})
    for name in ("offline_samples", "pairs_per_step", "updates"):
        require(cfg, name, getattr(cfg, name) >= 1, ">= 1")
    require(
        cfg,
        "offline_samples",
        cfg.offline_samples >= 2 or cfg.online,
        ">= 2 (a pair needs two samples)",
    )


def train(cfg: DPOConfig, log=print) -> dict:
    check_config(cfg)
    return run(cfg, DPO, "dpo", PANELS, log)


def parse(argv) -> DPOConfig:
    """The command line's config (a UsageError names a bad flag)."""
    return parse_rl_config(DPOConfig, argv, __doc__.split("\n\n")[0], "dpo")


@main_guard
@finish_unread
def main(argv=None):
    train(parse(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_now()  # the files are closed: skip the interpreter's teardown (cli.exit_now)
