"""Sampler service: steps vectorized environments and pushes Experience to replay."""
