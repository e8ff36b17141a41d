"""The `sparse` section of the run config: which networks are sparse and how their topology
changes (DS-TD3 / DS-SAC). Kept apart from common/sparse.py, which holds the masks and needs
torch, so that every service can read a run config without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from spreeze.common.errors import ConfigError

NETWORKS = ("dense", "static", "ds")
DISTRIBUTIONS = ("er", "erk")
GROWTHS = ("random", "gradient")


@dataclass(frozen=True)
class SparseConfig:
    """Sparse actor and critics: static masks or dynamic sparse training (DS-TD3)."""

    network: str = "dense"  # dense | static (fixed random sparse masks) | ds (dynamic sparse training)
    sparsity: float | None = None  # target overall sparsity of the sparse layers; null = Erdos-Renyi lambdas
    lambdas: tuple[float, ...] = (7.0, 64.0)  # ER lambda per hidden layer (paper, HalfCheetah: 7 then 64); deeper layers reuse the last
    distribution: str = "er"  # er | erk: density ~ (n_in + n_out) / (n_in * n_out); identical for MLP layers
    eta: float = 0.05  # fraction of a layer's connections dropped and regrown per adaptation
    every: int = 1000  # gradient steps of a network between two of its topology adaptations (e)
    growth: str = "random"  # random (SET) | gradient (RigL: where the dense |gradient| is largest)
    freeze_last: int = 50_000  # updates at the end of the budget (total_steps x update_to_data; none if that is 0) with a frozen topology

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first bad key and its value."""
        for name, choices in (("network", NETWORKS), ("distribution", DISTRIBUTIONS),
                              ("growth", GROWTHS)):
            if getattr(self, name) not in choices:
                _bad(name, getattr(self, name), f"must be one of {', '.join(choices)}")
        if self.sparsity is not None and not 0.0 < self.sparsity < 1.0:
            _bad("sparsity", self.sparsity, "must be in (0, 1) or null")
        if not self.lambdas or not all(_number(v) and v > 0 for v in self.lambdas):
            _bad("lambdas", self.lambdas, "must be a non-empty list of numbers > 0")
        if not (_number(self.eta) and 0.0 < self.eta < 1.0):
            _bad("eta", self.eta, "must be in (0, 1)")
        if not (_integer(self.every) and self.every >= 1):
            _bad("every", self.every, "must be an int >= 1")
        if not (_integer(self.freeze_last) and self.freeze_last >= 0):
            _bad("freeze_last", self.freeze_last, "must be an int >= 0")

    @property
    def enabled(self) -> bool:
        return self.network != "dense"

    @property
    def dynamic(self) -> bool:
        return self.network == "ds"


def _bad(name: str, value: object, requirement: str) -> None:
    raise ConfigError(f"sparse.{name}={value!r} {requirement}")


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
