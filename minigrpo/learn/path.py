"""The path: the exercises in the order a learner should walk them, each one function of the library.

An exercise names the function (its module and name in minigrpo), what it teaches, the tests that grade
it (the library's own tests: every test of `tests_from` whose body uses the function's name, plus the
`extra_tests` that reach it through a model or a run), and its hints, shown one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    number: int
    name: str  # the function's name in its module
    module: str  # minigrpo.<module>, e.g. objectives.kl; the learner's file is <workspace>/<last part>.py

    @property
    def file_stem(self) -> str:
        return self.module.rsplit(".", 1)[-1]
    lesson: str  # one line: what writing it teaches
    tests_from: tuple[str, ...]  # test files whose tests that use `name` grade it
    hints: tuple[str, ...]
    extra_tests: tuple[str, ...] = ()  # pytest node ids that reach the function indirectly
    extra_imports: tuple[str, ...] = ()  # import lines the stub offers beyond what the library's body uses
    minutes: int = 10  # about how long it takes


PATH = (
    Exercise(1, "group_advantages", "objectives.advantages", "GRPO's advantage: the group mean as baseline, its std as scale",
             ("tests/test_advantages.py",), (
                 "Centre each row (one prompt's G rewards) on its own mean: r − r.mean(dim=1, keepdim=True).",
                 "The paper's code and TRL use the Bessel-corrected std (÷(G−1)): torch.std(r, dim=1, keepdim=True) "
                 "does that; honour `unbiased=False` with correction=0.",
                 "A group whose rewards are all equal has std 0: its advantage must be exactly 0, not NaN and not "
                 "rounding noise divided by ε. advantages.equal_groups(r) finds those rows; torch.where sets them.",
                 "scale='batch' keeps the per-group mean but divides by ONE std over all B·G rewards; scale='none' "
                 "does not divide at all (Dr. GRPO). G = 1 gives zeros.",
                 "Tiny std: rewards 1e-200 apart square to 0 and the std underflows (±inf with ε = 0). Divide the "
                 "deviations by their largest |value| before squaring, then multiply back: advantages._std does.")),
    Exercise(2, "rloo_advantages", "objectives.advantages", "the leave-one-out baseline: unbiased because it excludes the sample",
             ("tests/test_advantages.py",), (
                 "Completion i's baseline is the mean reward of the OTHER G−1 completions of its group.",
                 "(Σ_j r_j − r_i)/(G−1) is that mean; r_i minus it simplifies to G/(G−1)·(r_i − r̄).",
                 "Equal rewards and G = 1 give exactly 0.")),
    Exercise(3, "clipped_surrogate", "objectives.losses", "the ratio, PPO's pessimistic clip, and why μ = 1 leaves it dead",
             ("tests/test_losses.py",), (
                 "ρ = exp(logp − old_logp) per token. The objective is min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A); the "
                 "function returns the LOSS, its negative, and 0 at masked positions.",
                 "For A < 0 the min picks the clipped value when ρ < 1−ε_low (no reward for pushing a bad token "
                 "further down) and the unclipped ρ·A when ρ > 1+ε_high: the clip is one-sided per sign of A.",
                 "Masked slots may hold NaN or ±1e4: select with torch.where(mask, ·, 0) BEFORE exp, never multiply by "
                 "the mask (0·NaN = NaN). Clamp the log-ratio to ±kl.LOG_RATIO_CLAMP so exp stays finite.",
                 "level='sequence' (GSPO): one ratio per row, exp of the MEAN valid log-ratio, broadcast to its tokens."
                 " "
                 "dual_clip = c: for A < 0 the objective is max(objective, c·A).",
                 "At the first of μ updates π_θ = π_old, so ρ ≡ 1 and the clip cannot act: with μ = 1 it never does.")),
    Exercise(4, "k1", "objectives.kl", "the naive KL estimate: unbiased, yet its gradient as a loss is zero",
             ("tests/test_kl.py",), (
                 "k1 = log π_θ(x) − log π_ref(x): positive where the policy likes x more than the reference.",
                 "Its expectation under x ~ π_θ is KL(π_θ‖π_ref); its expected gradient as a loss is 0.")),
    Exercise(5, "k2", "objectives.kl", "the squared log-ratio: biased, but its gradient is the reverse KL's",
             ("tests/test_kl.py",), (
                 "k2 = ½ (log π_θ(x) − log π_ref(x))².",)),
    Exercise(6, "k3", "objectives.kl", "GRPO's estimator: unbiased and ≥ 0, but its gradient is the forward KL's",
             ("tests/test_kl.py",), (
                 "With Δ = log π_ref(x) − log π_θ(x): k3 = e^Δ − Δ − 1 (mind the sign of Δ).",
                 "For tiny Δ, e^Δ − 1 cancels in float32: torch.expm1(Δ) − Δ is exact to rounding.",
                 "Clamp Δ to ±kl.LOG_RATIO_CLAMP before exp so the value and gradient stay finite.")),
    Exercise(7, "exact", "objectives.kl", "the KL over the whole vocabulary: the yardstick a character model affords",
             ("tests/test_kl.py",), (
                 "KL(p‖q) = Σ_v p_v (log p_v − log q_v), p = softmax(logits), q = softmax(ref_logits), per position.",
                 "Use log_softmax for both (finite at logits ±1e4); a probability that underflows to 0 then multiplies "
                 "a finite number. Clamp the result at 0 against rounding.")),
    Exercise(8, "aggregate", "objectives.losses", "how per-token losses become one number, and the length bias each choice has",
             ("tests/test_losses.py",), (
                 "First make masked slots exactly 0 with torch.where (they may hold NaN).",
                 "|o_i| is mask.sum(dim=1), the completion's own length: never the padded width T.",
                 "seq-mean-token-mean: mean over rows of (row sum / |o_i|); token-mean: total / Σ|o_i|; "
                 "seq-mean-token-sum: mean over rows of the row sums; seq-mean-token-sum-norm: total / (B·max_len).",
                 "Floor |o_i| and Σ|o_i| at 1 so an empty row or batch gives 0, not 0/0.")),
    Exercise(9, "gae", "objectives.advantages", "PPO's advantage: TD errors summed backwards with γλ",
             ("tests/test_advantages.py",), (
                 "δ_t = r_t + γ·V_{t+1} − V_t and A_t = δ_t + γλ·A_{t+1}: one reverse loop over time, vectorised "
                 "over the batch.",
                 "After the last valid token the completion has ENDED: V_{t+1} = 0 and A_{t+1} = 0 there. Never "
                 "bootstrap from a padding slot's value.",
                 "Returns are A_t + V_t; masked positions are 0 in both outputs whatever they held (NaN too).")),
    Exercise(10, "completion_token_logprobs", "lm.logprobs", "the masked log-probs of a completion: the shift by one",
             ("tests/test_logprobs.py",), (
                 "logits[:, t] predicts ids[:, t+1]: completion token j (slot P+j) is scored by logits[:, P−1+j].",
                 "log_softmax over the vocabulary, then gather at the token: logprobs.gather_logprobs does both.",
                 "Slots after the first EOS hold PAD: they are not part of the completion. Return exactly 0 there."),
             extra_tests=("tests/test_rollout.py",)),
    Exercise(11, "attention", "lm.model", "causal self-attention with a KV cache: what makes sampling fast",
             ("tests/test_model.py",), (
                 "scores = q @ kᵀ / √D, then softmax over the keys, then @ v; shapes (B, H, T, D).",
                 "With a cache: write k, v into cache.k[layer, :, :, L:L+T] (L = cache.length) and attend over "
                 "cache.k[layer, :, :, :L+T]. Do not advance cache.length.",
                 "attn_mask True = may attend: fill the other scores with −inf before the softmax. Without a mask and "
                 "T > 1: query i sees keys 0..i (torch.ones(T, T).tril()); T = 1 sees every key."),
             extra_tests=("tests/test_model.py", "tests/test_sampling.py::"
                          "test_kv_cache_logprobs_equal_the_slow_path_for_prompts_of_different_lengths")),
    Exercise(12, "grpo_loss", "grpo", "the capstone: one GRPO update assembled from your own pieces",
             ("tests/test_grpo.py",), (
                 "per_token = clipped_surrogate(logp, old_logp, adv[:, None], policy_mask or mask, cfg.clip_low, "
                 "cfg.clip_high, cfg.dual_clip, cfg.ratio); policy_loss = aggregate(per_token, mask, cfg.loss_agg, "
                 "cfg.max_new_tokens).",
                 "kl_tok = kl_per_token(logp, ref_logp, logits, ref_logits, cfg.kl); the KL is a PENALTY: add "
                 "β·aggregate(kl_tok) to the loss, and only when cfg.beta > 0 and cfg.kl_in == 'loss'.",
                 "ent = entropy(logits); subtract cfg.entropy_coef·aggregate(ent) when the coefficient is not 0. "
                 "Return (loss, policy_loss, kl_tok, ent).",
                 "The library's own grpo_loss also serves the variant flags (--policy-loss, --top-entropy, "
                 "--cov-control); the capstone's run and tests use the defaults, which need only the pieces above."),
             extra_tests=tuple(f"tests/test_grpo.py::{t}" for t in (
                 "test_one_step_loss_equals_a_hand_computation", "test_only_completion_tokens_receive_gradient",
                 "test_updates_one_gives_ratio_exactly_one",
                 "test_entropy_bonus_adds_minus_coef_times_the_entropy_gradient",
                 "test_kl_in_reward_subtracts_beta_times_the_summed_kl_of_each_sequence")),
             extra_imports=("from minigrpo.objectives.losses import aggregate, clipped_surrogate, entropy",
                            "from minigrpo.grpo import kl_per_token"),
             minutes=15),
)
CAPSTONE = PATH[-1]
BY_NAME = {e.name: e for e in PATH}


def find(key: str) -> Exercise:
    """An exercise by its number ('3') or its function's name ('clipped_surrogate'); ValueError otherwise."""
    if key.isdigit() and 1 <= int(key) <= len(PATH):
        return PATH[int(key) - 1]
    if key in BY_NAME:
        return BY_NAME[key]
    raise ValueError(f"no exercise {key!r}: give a number 1-{len(PATH)} or one of {', '.join(BY_NAME)}")
