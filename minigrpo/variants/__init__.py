"""GRPO's variant families and presets, plugged into the core trainer from tables."""
