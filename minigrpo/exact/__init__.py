"""The exact KL-regularised optimum and the reward–KL frontier (pure math on enumerated
distributions)."""
