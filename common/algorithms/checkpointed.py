"""`Checkpointed`: a part's ``save`` and ``load``, from what its ``named()`` lists.

Every algorithm part (common/algorithms/td3.py, sac.py, crossq.py, a user's) names what it
checkpoints; this mixin writes and reads exactly those entries (base.save_named,
base.load_named), refuses another algorithm's or shape's checkpoint by name, and rebinds a
compiled step to the loaded tensors. Imports no torch (algorithm modules subclass it at
import time, and every service imports them to read the config).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spreeze.common.algorithms.lazy import lazy

if TYPE_CHECKING:
    from spreeze.common.algorithms import base
    from spreeze.common.algorithms.base import CompiledUpdate, Named
    from spreeze.common.sparse import SparseTopology
else:
    base = lazy("spreeze.common.algorithms.base")


class Checkpointed:
    """``role``: "actor part" or "critic part", the name a refused checkpoint is reported under."""

    algo: str
    role: str
    updates: int
    sparse: SparseTopology | None
    fast: CompiledUpdate | None

    def named(self) -> Named:
        """What the part checkpoints, by name: its networks, optimizers, RNGs and tensors."""
        raise NotImplementedError

    def save(self) -> dict[str, Any]:
        return base.save_named(self.algo, self.updates, self.named(), self.sparse)

    def load(self, d: dict[str, Any]) -> None:
        self.updates = base.load_named(f"{self.algo} {self.role}", self.algo, self.named(), d, self.sparse)
        if self.fast is not None:
            self.fast.rebind()
