"""Replay service: the authoritative transition store, rate-limited sampling for learners."""
