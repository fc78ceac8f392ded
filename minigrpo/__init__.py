"""minigrpo: a tiny, from-scratch, character-level sandbox for RL on language models.

Imports point one way: tokenizer -> model -> logprobs -> sampling -> rollout -> algorithms -> CLIs.
"""

__version__ = "0.1.0"
