"""The learn path's exercises 1-9: the objectives, each a pure function over tensors
(minigrpo/objectives/): GRPO's and RLOO's advantages, the clipped surrogate, the KL estimators k1,
k2, k3 and the exact KL, the aggregation of per-token losses, and PPO's GAE. Their order and the
rest of the path: path.py; what an exercise holds: exercise.py.
"""

from __future__ import annotations

from minigrpo.learn.exercise import TORCH, Exercise
from minigrpo.learn.exercise import Graded as G  # short, for the tables below

FUNCTIONAL = ("import torch.nn.functional as F", "log_softmax, softmax")
CLAMP = (
    "from minigrpo.objectives.kl import LOG_RATIO_CLAMP",
    "20: clamp a log-ratio to ±this before exp",
)
ZERO = (
    "from minigrpo.objectives.losses import zero_like",
    "a 0-dim zero of x's dtype and device, for torch.where",
)
EQUAL = (
    "from minigrpo.objectives.advantages import equal_groups",
    "(B, G) -> (B,) bool: rows of all-equal rewards",
)
KL_TABLE = G("KL_ESTIMATORS", "estimators_table")
OBJECTIVE_EXERCISES = (
    Exercise(
        1,
        "group_advantages",
        "objectives.advantages",
        "GRPO's advantage: the group mean as baseline, its std as scale",
        ("tests/test_advantages.py",),
        (
            "Centre each row (one prompt's G rewards) on its own mean: r − r.mean(dim=1, "
            "keepdim=True), then divide by the row's std + ε. The check also grades: an unknown "
            "scale raises ValueError naming the choices (SCALES); A stays finite for rewards "
            "1e-200 apart (hint 5).",
            "The paper's code and TRL use the Bessel-corrected std (÷(G−1)): torch.std(r, dim=1, "
            "keepdim=True) does that; honour `unbiased=False` with correction=0.",
            "A group whose rewards are all equal has std 0: its advantage must be exactly 0, not "
            "NaN and not "
            "rounding noise divided by ε. equal_groups(r) finds those rows; torch.where sets them.",
            "scale='batch' keeps the per-group mean but divides by ONE std over all B·G rewards; "
            "scale='none' does not divide at all (Dr. GRPO). G = 1 gives zeros.",
            "Tiny std: rewards 1e-200 apart square to 0 and the std underflows (±inf with ε = "
            "0). Divide the "
            "deviations by their largest |value| before squaring, then multiply the std back.",
        ),
        (
            G(
                "(r_i − mean(r_group)) / (std + ε)",
                "zero_mean unit_std invariant_under monotone reinforce_rej",
            ),
            G("std within each group", "permutation groups_are_independent"),
            G("no division", "scale_none"),
            G("one std over all B·G rewards", "batch_scale"),
            G("Bessel-corrected std", "unit_std worked_example"),
            G("±0.935", "worked_example"),
            G("all equal gets exactly 0", "equal_rewards gpg_alpha"),
            G("1e-200 apart", "near_equal"),
            G("|A| ≤ (G−1)/√G", "abs_advantage near_equal"),
            G("G = 1 gives 0", "group_of_one"),
            G("raises ValueError", "unknown_scale"),
        ),
        (
            TORCH,
            (
                "from minigrpo.objectives.advantages import SCALES",
                "the scale names: group, batch, none",
            ),
            EQUAL,
        ),
    ),
    Exercise(
        2,
        "rloo_advantages",
        "objectives.advantages",
        "the leave-one-out baseline: unbiased because it excludes the sample",
        ("tests/test_advantages.py",),
        (
            "Completion i's baseline is the mean reward of the OTHER G−1 completions of its group.",
            "(Σ_j r_j − r_i)/(G−1) is that mean; r_i minus it simplifies to G/(G−1)·(r_i − r̄).",
            "Equal rewards and G = 1 give exactly 0: the mean of equal floats is not always that "
            "float, so set those rows with equal_groups and torch.where.",
        ),
        (
            G("the mean reward of the other G−1", "leave_one_out"),
            G("G = 1 gives 0", "group_of_one"),
            G("all equal gets exactly 0", "exactly_zero_to_every_all_equal_group"),
        ),
        (TORCH, EQUAL),
    ),
    Exercise(
        3,
        "clipped_surrogate",
        "objectives.losses",
        "the ratio, PPO's pessimistic clip, and why μ = 1 leaves it dead",
        ("tests/test_losses.py",),
        (
            "ρ = exp(logp − old_logp) per token; return the LOSS, −min(ρ·A, clip(ρ)·A), and 0 at "
            "masked positions. The check also grades: masked slots may hold NaN or ±1e4 (select "
            "with torch.where(mask, ·, 0) BEFORE exp, never multiply by the mask: 0·NaN = NaN); "
            "clamp the log-ratio to ±20 (LOG_RATIO_CLAMP) before exp, so extreme log-ratios give a "
            "finite loss and gradient; an unknown level raises ValueError.",
            "For A < 0 the min picks the clipped value when ρ < 1−ε_low (no reward for pushing a "
            "bad token further down) and the unclipped ρ·A when ρ > 1+ε_high: the clip is "
            "one-sided per sign of A.",
            "level='sequence' (GSPO): one ratio per row, exp of the MEAN valid log-ratio, "
            "broadcast to its tokens. dual_clip = c: for A < 0 the objective is max(objective, "
            "c·A).",
            "At the first of μ updates π_θ = π_old, so ρ ≡ 1 and the clip cannot act: with μ = 1 "
            "it never does.",
        ),
        (
            G(
                "−min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)",
                "never_exceeds_unclipped without_dual_clip",
            ),
            G("At ρ = 1 it is −A per token", "at_ratio_one"),
            G("eps_high: upper clip", "clip_higher"),
            G("The gradient is exactly 0 where the clip acts", "gradient_is_zero clip_fractions"),
            G("dual_clip = c > 1", "dual_clip_bounds"),
            G('level="sequence" GSPO', "gspo_sequence"),
            G("Masked positions: loss 0 and no gradient", "masked_nan"),
            G("NaN or ±1e4", "masked_nan"),
            G("advantages (B,), (B, 1) or (B, T)", "broadcast_alike"),
            G("clamp the log-ratio to ±20", "extreme_log_ratios"),
            G("unknown level raises ValueError", "unknown_level"),
        ),
        (
            TORCH,
            CLAMP,
            ZERO,
            ("from minigrpo.objectives.losses import LEVELS", "the level names: token, sequence"),
        ),
    ),
    Exercise(
        4,
        "k1",
        "objectives.kl",
        "the naive KL estimate: unbiased, yet its gradient as a loss is zero",
        ("tests/test_kl.py",),
        (
            "k1 = log π_θ(x) − log π_ref(x): positive where the policy likes x more than the "
            "reference. The "
            "check grades yours where the trainer finds it too: in KL_ESTIMATORS (variants/kl.py).",
            "Its expectation under x ~ π_θ is KL(π_θ‖π_ref); its expected gradient as a loss is 0.",
        ),
        (
            G("k1 = log π_θ(x) − log π_ref(x)", "hand_values antisymmetric"),
            KL_TABLE,
            G("Unbiased for KL(π_θ‖π_ref)", "unbiased"),
            G("expected on-policy gradient is 0", "expected_gradients"),
        ),
    ),
    Exercise(
        5,
        "k2",
        "objectives.kl",
        "the squared log-ratio: biased, but its gradient is the reverse KL's",
        ("tests/test_kl.py",),
        (
            "k2 = ½ (log π_θ(x) − log π_ref(x))², in torch operations so autograd gives its "
            "gradient: the check also grades that gradient inside k3+ and k3_iw (kl.py, built on "
            "k2 and k3) and finds yours in KL_ESTIMATORS, the trainer's table.",
        ),
        (
            G("k2 = ½ (log π_θ(x) − log π_ref(x))²", "hand_values symmetric"),
            G("≥ 0 and low variance", "non_negative"),
            G("exactly ∇KL(π_θ‖π_ref)", "expected_gradients"),
            KL_TABLE,
            G("inside k3+ and k3_iw", "k3_plus k3_iw"),
        ),
    ),
    Exercise(
        6,
        "k3",
        "objectives.kl",
        "GRPO's estimator: unbiased and ≥ 0, but its gradient is the forward KL's",
        ("tests/test_kl.py",),
        (
            "With Δ = log π_ref(x) − log π_θ(x): k3 = e^Δ − Δ − 1 (mind the sign of Δ). The check "
            "also grades k3+ and k3_iw (kl.py), built on yours, and finds yours in KL_ESTIMATORS, "
            "the trainer's table.",
            "For tiny Δ, e^Δ − 1 cancels in float32: torch.expm1(Δ) − Δ is exact to rounding.",
            "Clamp Δ to ±LOG_RATIO_CLAMP before exp so the value and gradient stay finite.",
        ),
        (
            G("k3 = e^Δ − Δ − 1 with Δ = log π_ref(x) − log π_θ(x)", "hand_values"),
            KL_TABLE,
            G("≥ 0, = 0 iff Δ = 0", "non_negative zero_iff"),
            G("unbiased and low variance", "unbiased"),
            G("the FORWARD KL", "expected_gradients"),
            G("clamped to ±20 before exp", "extreme_log_ratios"),
            G("expm1(Δ) − Δ", "small_log_ratios"),
            G("k3+ and k3_iw (kl.py), built on yours", "k3_plus k3_iw"),
        ),
        (TORCH, CLAMP),
    ),
    Exercise(
        7,
        "exact",
        "objectives.kl",
        "the KL over the whole vocabulary: the yardstick a character model affords",
        ("tests/test_kl.py",),
        (
            "KL(p‖q) = Σ_v p_v (log p_v − log q_v), p = softmax(logits), q = softmax(ref_logits), "
            "per position; its value and its gradient stay finite at logits ±1e4.",
            "Use log_softmax for both (finite at logits ±1e4); a probability that underflows to 0 "
            "then multiplies a finite number. Clamp the result at 0 against rounding.",
        ),
        (
            G("Σ_v p_v·(log p_v − log q_v)", "unbiased_and_exact"),
            G("finite at logits ±1e4", "finite"),
            G("Clamped at 0", "non_negative"),
            G("its gradient stay finite", "gradient_is_finite"),
        ),
        (TORCH, FUNCTIONAL),
    ),
    Exercise(
        8,
        "aggregate",
        "objectives.losses",
        "how per-token losses become one number, and the length bias each choice has",
        ("tests/test_losses.py",),
        (
            "First make masked slots exactly 0 with torch.where (they may hold NaN). An unknown "
            "mode raises ValueError listing the modes (AGG_MODES).",
            "|o_i| is mask.sum(dim=1), the completion's own length: never the padded width T.",
            "seq-mean-token-mean: mean over rows of (row sum / |o_i|); token-mean: total / Σ|o_i|; "
            "seq-mean-token-sum: mean over rows of the row sums; seq-mean-token-sum-norm: total "
            "/ (B·max_len).",
            "Floor |o_i| and Σ|o_i| at 1 so an empty row or batch gives 0, not 0/0.",
        ),
        (
            G("masked slots exactly 0 with torch.where (they may hold NaN)", "masked_garbage"),
            G("max_len defaults to T", "extra_masked_columns"),
            G("(1/B) Σ_i (1/|o_i|) Σ_t x", "constant_loss"),
            G("per-token gradient weight", "per_token_gradient"),
            G("A fully masked row sums to 0", "fully_masked"),
            G("unknown mode raises ValueError", "unknown_mode"),
        ),
        (
            TORCH,
            ZERO,
            ("from minigrpo.objectives.losses import AGG_MODES", "the four mode names, in order"),
        ),
    ),
    Exercise(
        9,
        "gae",
        "objectives.advantages",
        "PPO's advantage: TD errors summed backwards with γλ",
        ("tests/test_advantages.py",),
        (
            "δ_t = r_t + γ·V_{t+1} − V_t and A_t = δ_t + γλ·A_{t+1}: one reverse loop over time, "
            "vectorised over the batch.",
            "After the last valid token the completion has ENDED: V_{t+1} = 0 and A_{t+1} = 0 "
            "there. Never bootstrap from a padding slot's value.",
            "Returns are A_t + V_t; masked positions are 0 in both outputs whatever they held "
            "(NaN too).",
        ),
        (
            G("R_t = A_t + V_t", "naive_double_loop"),
            G("λ = 1 gives reward-to-go − V", "gamma_one"),
            G("λ = 0 gives the one-step TD error", "lambda_zero"),
            G("Σ_k (γλ)^k δ_{t+k}", "linear_in_rewards"),
            G("Masked positions are 0 in both outputs", "appended_masked naive_double_loop"),
        ),
    ),
)
