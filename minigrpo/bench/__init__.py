"""Benchmarks: python -m minigrpo.bench measures speed and quality; with --write-docs it writes the
results pages."""
