"""`PolicyWrapper`: a `Policy` that answers as the policy it wraps except where a
subclass overrides (the engine's deterministic grid, the explainer's recorder).
Every member a subclass does not define is the inner policy's, so a wrapper
stays a whole `Policy` when the protocol grows."""

from __future__ import annotations

from typing import Any

from mambaradix.policies.protocol import Policy

__all__ = ["PolicyWrapper"]


class PolicyWrapper:
    """`inner`'s members, unless overridden (read through `__getattr__`)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
