"""Learner services: fused (both parts, one process) and the shared learner base."""
