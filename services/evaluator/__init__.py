"""Evaluator: deterministic episodes of the newest actor, results and checkpoints."""
