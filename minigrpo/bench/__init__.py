"""Benchmarks: python -m minigrpo.bench measures speed and quality and writes the results pages."""
