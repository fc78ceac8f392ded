"""Plumbing every command shares: flag parsing and one-line errors (cli), threads and device
(runtime)."""
