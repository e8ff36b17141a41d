"""The actor's acting policy as a portable description (proto/SPEC.md §4.4), without torch.

A description is a msgpack-able map ``{"format": 1, "ops": [...]}``: a short program of
operations over named parameters of the actor's weights, ending in one output head. It
travels in the ``weights`` message of ``net = actor`` (``policy``), so a sampler acts from
the message alone, whatever the algorithm: common/numpy_policy.py runs it, the learner
writes it (common/policy_export.py). :func:`parse` checks a description's structure; the
parameter shapes are checked against the weights when a policy is built from both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spreeze.common.errors import PolicyFormatError

FORMAT = 1  # description format this module reads and writes (the map's "format")

PARAM, OPT_PARAM, NUMBER, SLOT = "param", "optional param", "number", "slot"

# op -> its fields and their kinds; every field is required unless it is an optional param.
OPS: dict[str, dict[str, str]] = {
    "obs_norm": {"mean": PARAM, "var": PARAM, "eps": NUMBER, "clip": NUMBER},
    "linear": {"weight": PARAM, "bias": OPT_PARAM},
    "layer_norm": {"weight": OPT_PARAM, "bias": OPT_PARAM, "eps": NUMBER},
    "relu": {},
    "tanh": {},
    "elu": {"alpha": NUMBER},
    "silu": {},
    "save": {"slot": SLOT},
    "add": {"slot": SLOT},
    "squash": {"scale": PARAM, "bias": PARAM, "exploration_noise": NUMBER},
    "tanh_gaussian": {"scale": PARAM, "bias": PARAM, "log_std_min": NUMBER, "log_std_max": NUMBER},
}
HEADS = frozenset({"squash", "tanh_gaussian"})  # output heads: exactly one, the last op
NON_NEGATIVE = frozenset({("obs_norm", "eps"), ("layer_norm", "eps"), ("squash", "exploration_noise")})
POSITIVE = frozenset({("obs_norm", "clip")})

Op = dict[str, Any]


@dataclass(frozen=True)
class PolicyProgram:
    """A checked description: body ops in order, then the output head."""

    body: tuple[Op, ...]
    head: Op

    @property
    def params(self) -> list[str]:
        """Every parameter name the program reads, in order of first use."""
        names: list[str] = []
        for op in (*self.body, self.head):
            for name, kind in OPS[op["op"]].items():
                if kind in (PARAM, OPT_PARAM) and op.get(name) is not None and op[name] not in names:
                    names.append(op[name])
        return names

    def to_dict(self) -> dict[str, Any]:
        """The description as it travels (the inverse of :func:`parse`)."""
        return {"format": FORMAT, "ops": [dict(op) for op in (*self.body, self.head)]}


def where(i: int, op: Mapping[str, Any]) -> str:
    """How errors name an op: ``policy op 3 (linear)``."""
    return f"policy op {i} ({op.get('op')!r:.40})"


def _field(i: int, op: Mapping[str, Any], name: str, kind: str) -> Any:
    """One field of op `i`, checked against its kind; optional params may be absent (None)."""
    value = op.get(name)
    if value is None and kind == OPT_PARAM:
        return None
    if value is None:
        raise PolicyFormatError(f"{where(i, op)}: field {name!r} is missing")
    if kind == NUMBER:
        ok = type(value) in (int, float) and math.isfinite(value)
        if ok and (op["op"], name) in NON_NEGATIVE:
            ok = value >= 0
        if ok and (op["op"], name) in POSITIVE:
            ok = value > 0
        if not ok:
            raise PolicyFormatError(f"{where(i, op)}: field {name!r}={value!r:.40} is not a valid number")
        return float(value)
    if type(value) is not str or not value:
        raise PolicyFormatError(f"{where(i, op)}: field {name!r}={value!r:.40} must be a non-empty string")
    return value


def _op(i: int, raw: Any, saved: set[str]) -> Op:
    if not isinstance(raw, Mapping):
        raise PolicyFormatError(f"policy op {i}={raw!r:.60} is not a map")
    name = raw.get("op")
    if name not in OPS:
        raise PolicyFormatError(f"{where(i, raw)}: unknown op (known: {', '.join(OPS)})")
    op: Op = {"op": name}
    for field_name, kind in OPS[name].items():
        value = _field(i, raw, field_name, kind)
        if value is not None:
            op[field_name] = value
    if name == "tanh_gaussian" and not op["log_std_min"] < op["log_std_max"]:
        raise PolicyFormatError(f"{where(i, op)}: log_std_min={op['log_std_min']} must be < "
                                f"log_std_max={op['log_std_max']}")
    if name == "save":
        saved.add(op["slot"])
    if name == "add" and op["slot"] not in saved:
        raise PolicyFormatError(f"{where(i, op)}: slot {op['slot']!r} is added before it is saved")
    return op


def parse(desc: Any) -> PolicyProgram:
    """Check a description's structure; :class:`PolicyFormatError` names the first bad op or field."""
    if not isinstance(desc, Mapping):
        raise PolicyFormatError(f"policy description {desc!r:.60} is not a map")
    if not desc:
        raise PolicyFormatError("policy is missing (empty): weights of net = actor carry it from proto/SPEC.md 1.5 on")
    if desc.get("format") != FORMAT:
        raise PolicyFormatError(f"policy format={desc.get('format')!r:.40}: this reader knows format {FORMAT}")
    raw = desc.get("ops")
    if not isinstance(raw, list) or not raw:
        raise PolicyFormatError(f"policy ops={raw!r:.60} must be a non-empty list")
    saved: set[str] = set()
    ops = [_op(i, r, saved) for i, r in enumerate(raw)]
    for i, op in enumerate(ops[:-1]):
        if op["op"] in HEADS:
            raise PolicyFormatError(f"{where(i, op)}: an output head must be the last op (there are {len(ops)})")
    if ops[-1]["op"] not in HEADS:
        raise PolicyFormatError(f"{where(len(ops) - 1, ops[-1])}: the last op must be an output head "
                                f"({', '.join(sorted(HEADS))})")
    return PolicyProgram(tuple(ops[:-1]), ops[-1])
