"""The language model layer: tokenizer, GPT, KV-cache sampling, decoding, prefix tree, log-probs,
AdamW, checkpoints. Imports nothing of ours but util."""
