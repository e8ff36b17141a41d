"""Benchmarks anyone can rerun (`python -m bench.<name>`); each reports medians and ratios."""
