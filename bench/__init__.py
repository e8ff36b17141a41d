"""Benchmarks anyone can rerun (`python -m bench.<name>`); each reports medians and ratios."""

BENCHES = ("transport", "learning", "sampling", "update", "e2e", "tuner", "snapshot", "remote")  # modules bench/<name>.py
