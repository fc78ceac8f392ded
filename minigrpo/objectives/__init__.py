"""The math: advantages, KL estimators, surrogate and aggregation, policy losses, entropy control,
importance corrections, the DPO loss. Pure functions on tensors; imports nothing of ours above
it."""
