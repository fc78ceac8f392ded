"""Populations: many runs trained as one batched computation (compare --engine population)."""
