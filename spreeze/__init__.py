"""Spreeze: high-throughput message-driven actor-critic RL for continuous control.

The installed library's one import name. The repository keeps its layers as top-level
folders (proto, common, services, bench, cli: DESIGN.md); each is a subpackage of
``spreeze`` (``spreeze.common.config``, ``python -m spreeze.services.sampler``), linked here
in a checkout and copied here by ``pip install``.
"""

__version__ = "0.1.0"
