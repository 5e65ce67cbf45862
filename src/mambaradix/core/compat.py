"""Which behaviour a tree (and the lifecycle on it) reproduces: `compat`.

    None                   ours (see `mambaradix.core.tree`)
    "sglang-0.5.15.post1"  SGLang 0.5.15.post1's MambaRadixCache
    "sglang-0.5.23"        SGLang 0.5.23's UnifiedRadixCache (FULL + MAMBA
                           components; its current release)
    "sglang"               an alias of the current release (0.5.23)

A tree keeps the explicit release name (`tree.compat`), so whoever reads it
knows which release's rules apply.
"""

from __future__ import annotations

from typing import Any

SGLANG_0_5_15 = "sglang-0.5.15.post1"
SGLANG_0_5_23 = "sglang-0.5.23"
SGLANG_CURRENT = SGLANG_0_5_23
SGLANG_RELEASES = (SGLANG_0_5_15, SGLANG_0_5_23)
ALIASES = {"sglang": SGLANG_CURRENT}
COMPAT_MODES: tuple[str | None, ...] = (None, *SGLANG_RELEASES, *ALIASES)


def resolve_compat(compat: Any) -> str | None:
    """The explicit release `compat` names (an alias resolved), or None for ours.

    Raises ValueError naming the choices for anything else."""
    if compat is None:
        return None
    if isinstance(compat, str):
        if compat in SGLANG_RELEASES:
            return compat
        if compat in ALIASES:
            return ALIASES[compat]
    raise ValueError(f"compat must be one of {COMPAT_MODES}, got {compat!r}")


def is_sglang(compat: str | None) -> bool:
    """Whether `compat` (resolved) reproduces an SGLang release."""
    return compat in SGLANG_RELEASES


__all__ = [
    "ALIASES",
    "COMPAT_MODES",
    "SGLANG_0_5_15",
    "SGLANG_0_5_23",
    "SGLANG_CURRENT",
    "SGLANG_RELEASES",
    "is_sglang",
    "resolve_compat",
]
