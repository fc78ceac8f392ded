"""The learn path's exercises 10-12: the model's masked log-probs of a completion and its causal
self-attention with a KV cache (minigrpo/lm/), then the capstone, grpo_loss, one GRPO update
assembled from the learner's own pieces (minigrpo/grpo.py). Their order and the rest of the path:
path.py; what an exercise holds: exercise.py.
"""

from __future__ import annotations

from minigrpo.learn.exercise import TORCH, Exercise
from minigrpo.learn.exercise import Graded as G  # short, for the tables below

MODEL_EXERCISES = (
    Exercise(
        10,
        "completion_token_logprobs",
        "lm.logprobs",
        "the masked log-probs of a completion: the shift by one",
        ("tests/test_logprobs.py",),
        (
            "logits[:, t] predicts ids[:, t+1]: completion token j (slot P+j) is scored by "
            "logits[:, P−1+j]. Masked slots get exactly 0 and no gradient. The check also runs the "
            "rollout's tests (tests/test_rollout.py): the log-probs a rollout stores for each "
            "sampled row are yours.",
            "log_softmax over the vocabulary, then gather at the token: gather_logprobs does both.",
            "Slots after the first EOS hold PAD: they are not part of the completion. Return "
            "exactly 0 there.",
        ),
        (
            G("logits[:, t] predicts ids[:, t+1]", "one_slot_before"),
            G("masked slots exactly 0", "after_the_end"),
            G("exactly 0 and no gradient", "after_the_end"),
            G("is predicted by logits[:, P−1+j]", "prompt_logits"),
            G("rollout", "tests/test_rollout.py"),
        ),
        (
            TORCH,
            (
                "from minigrpo.lm.logprobs import gather_logprobs",
                "log_softmax at the targets: (B, T, V), (B, T) -> (B, T)",
            ),
        ),
        extra_tests=("tests/test_rollout.py",),
    ),
    Exercise(
        11,
        "attention",
        "lm.model",
        "causal self-attention with a KV cache: what makes sampling fast",
        ("tests/test_model.py",),
        (
            "scores = q @ kᵀ / √D, then softmax over the keys, then @ v; shapes (B, H, T, D). The "
            "check runs the model's tests (tests/test_model.py) and sampling with the cache "
            "against the slow path.",
            "With a cache: write k, v into cache.k[layer, :, :, L:L+T] (L = cache.length) and "
            "attend over cache.k[layer, :, :, :L+T]. Do not advance cache.length.",
            "attn_mask True = may attend: fill the other scores with −inf before the softmax. "
            "Without a mask and "
            "T > 1: query i sees keys 0..i (torch.ones(T, T).tril()); T = 1 sees every key.",
        ),
        (
            G("Causal scaled dot-product attention", "tests/test_model.py"),
            G("sampling with the cache against the slow path", "kv_cache_logprobs"),
        ),
        (
            TORCH,
            ("import torch.nn.functional as F", "softmax over the keys"),
            (
                "from minigrpo.lm.model import KVCache",
                "the cache: .k, .v (layers, B, H, slots, D), .length",
            ),
        ),
        extra_tests=(
            "tests/test_model.py",
            "tests/test_sampling.py::"
            "test_kv_cache_logprobs_equal_the_slow_path_for_prompts_of_different_lengths",
        ),
    ),
    Exercise(
        12,
        "grpo_loss",
        "grpo",
        "the capstone: one GRPO update assembled from your own pieces",
        ("tests/test_grpo.py",),
        (
            "per_token = clipped_surrogate(logp, old_logp, adv[:, None], policy_mask or mask, "
            "cfg.clip_low, cfg.clip_high, cfg.dual_clip, cfg.ratio); policy_loss = "
            "aggregate(per_token, mask, cfg.loss_agg, cfg.max_new_tokens).",
            "kl_tok = kl_per_token(logp, ref_logp, logits, ref_logits, cfg.kl); the KL is a "
            "PENALTY: add "
            "β·aggregate(kl_tok) to the loss, and only when cfg.beta > 0 and cfg.kl_in == 'loss'.",
            "ent = entropy(logits); subtract cfg.entropy_coef·aggregate(ent) when the coefficient "
            "is not 0. Return (loss, policy_loss, kl_tok, ent).",
            "The library's own grpo_loss also serves the variant flags (--policy-loss, "
            "--top-entropy, --cov-control); the capstone's run and tests use the defaults, which "
            "need only the pieces above.",
        ),
        (
            G("loss = agg(w_t·L_t) + β·agg(KL_t) − c_H·agg(H_t)", "one_step_loss at_ratio_one"),
            G("KL_t enters the loss only with β > 0 and --kl-in loss", "adds_beta kl_in_reward"),
            G("policy_mask (N, T): the tokens that carry L_t", "policy_mask"),
            G("− c_H·agg(H_t)", "entropy_bonus subtracts_the_entropy"),
            G("mask (N, T) bool: valid tokens", "only_completion"),
            G("old_logp, ref_logp (N, T): π_old's", "updates_one"),
        ),
        (
            TORCH,
            (
                "from minigrpo.grpo import GRPOConfig",
                "the run's settings: cfg.beta, cfg.kl, cfg.loss_agg, ...",
            ),
            (
                "from minigrpo.grpo import kl_per_token",
                "the KL per token of the estimator cfg.kl names",
            ),
            (
                "from minigrpo.objectives.losses import aggregate, clipped_surrogate, entropy",
                "yours (exercises 8 and 3) and the entropy per position",
            ),
        ),
        extra_tests=tuple(
            f"tests/test_grpo.py::{t}"
            for t in (
                "test_one_step_loss_equals_a_hand_computation",
                "test_only_completion_tokens_receive_gradient",
                "test_updates_one_gives_ratio_exactly_one",
                "test_entropy_bonus_adds_minus_coef_times_the_entropy_gradient",
                "test_kl_in_reward_subtracts_beta_times_the_summed_kl_of_each_sequence",
            )
        ),
        minutes=15,
    ),
)
