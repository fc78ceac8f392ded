"""The RL run every algorithm shares: its config, rollout, preservation, trust region, stop rule,
report, loop."""
