"""Benchmarks anyone can rerun (`python -m spreeze.bench.<name>`); each reports medians and ratios."""

# the benchmarks: modules bench/<name>.py, each with main(argv) (`spreeze bench <name>`)
BENCHES = ("transport", "learning", "sampling", "update", "e2e", "tuner", "snapshot", "remote", "containers", "soak")
