"""Which release speaks which event dialect: the wire schema of vLLM 0.24.0-0.33.0 and
SGLang 0.5.15-0.5.23, read from each release's wheel (docs/events.md has the table
with file:line for every change).

A `Release` says how that release lays out its `EventBatch` and events (tagged maps or
tagged arrays, which fields in which order, whether fields at their default are left
out), how its replay socket frames replies (a topic frame or not), how it names storage
media, and whether it coalesces consecutive stores. `release(name)` looks one up; the
engine names alone ("vllm", "sglang") mean that engine's newest release.

Standard library only: the encoder and decoder live in `wire.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mambaradix.events.model import DEVICE, DISK, HOST

# ------------------------------------------------------------------ the schemas

# BlockStored as vLLM 0.24.0 defines it: the first `required` fields have no default
# (always written), the rest default to None (left out when None: omit_defaults).
VLLM_STORED = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
VLLM_REMOVED = ("block_hashes", "medium", "group_idx")
_SGLANG_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id")


@dataclass(frozen=True, slots=True)
class Schema:
    """One event type's fields in order; the first `required` have no default."""

    fields: tuple[str, ...]
    required: int


@dataclass(frozen=True, slots=True)
class Release:
    """How one release puts events on the wire."""

    name: str  # "vllm-0.33.0"
    engine: str  # "vllm" or "sglang"
    event_maps: bool  # events are tagged maps ({"type": ...}); else tagged arrays
    omit_defaults: bool  # fields at their default (None) are left out
    stored: Schema
    removed: Schema
    replay_topic: bool  # replay replies carry the topic frame before (seq, payload)
    media: Mapping[str, str]  # our medium (DEVICE, HOST, DISK) -> the release's name
    per_page: bool  # one BlockStored per block (else consecutive stores coalesce)
    states: bool  # the schema can say "a recurrent state" (group_idx + kind)

    def medium_name(self, medium: str | None) -> str | None:
        """The release's name of `medium` (None stays None). Raises ValueError for a
        medium the release cannot name."""
        if medium is None:
            return None
        name = self.media.get(medium)
        if name is None:
            raise ValueError(
                f"{self.name} has no medium for {medium!r} (it names {sorted(self.media)})"
            )
        return name


def _vllm(
    version: str,
    extra_stored: tuple[str, ...],
    extra_removed: tuple[str, ...],
    topic: bool,
    media: dict[str, str],
) -> Release:
    return Release(
        name=f"vllm-{version}",
        engine="vllm",
        event_maps=True,
        omit_defaults=True,
        stored=Schema(VLLM_STORED + extra_stored, 7),
        removed=Schema(VLLM_REMOVED + extra_removed, 2),
        replay_topic=topic,
        media=MappingProxyType(media),
        per_page=False,
        states=True,
    )


def _sglang(
    version: str, maps: bool, omit: bool, extra_stored: tuple[str, ...], topic: bool, per_page: bool
) -> Release:
    return Release(
        name=f"sglang-{version}",
        engine="sglang",
        event_maps=maps,
        omit_defaults=omit,
        stored=Schema(_SGLANG_STORED + ("medium",) + extra_stored, 5),
        removed=Schema(("block_hashes", "medium"), 1),
        replay_topic=topic,
        media=_SGLANG_MEDIA,
        per_page=per_page,
        states=False,
    )


_GPU_CPU = {DEVICE: "GPU", HOST: "CPU"}  # vLLM 0.24-0.25: MEDIUM_GPU; offload specs say "CPU"
_SGLANG_MEDIA = MappingProxyType({DEVICE: "GPU", HOST: "CPU_PINNED", DISK: "DISK"})
_LOC = ("locality",)  # vLLM 0.26.0
_OWN = ("locality", "ownership")  # vLLM 0.29.0
_SESSION = (*_OWN, "session_id")  # vLLM 0.30.0 (BlockStored only)
_LOOKAHEAD = (*_SESSION, "lookahead_token_ids")  # vLLM 0.33.0
_SALT = ("cache_salt", "session_id")  # SGLang 0.5.20

_TABLE = (
    _vllm("0.24.0", (), (), False, _GPU_CPU),
    _vllm("0.25.0", (), (), False, _GPU_CPU),
    _vllm("0.25.1", (), (), False, _GPU_CPU),
    _vllm("0.26.0", _LOC, _LOC, True, {**_GPU_CPU, DISK: "FS"}),
    _vllm("0.27.0", _LOC, _LOC, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _vllm("0.27.1", _LOC, _LOC, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _vllm("0.28.0", _LOC, _LOC, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _vllm("0.29.0", _OWN, _OWN, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _vllm("0.30.0", _SESSION, _OWN, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _vllm("0.31.0", _SESSION, _OWN, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _vllm("0.32.0", _SESSION, _OWN, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _vllm("0.33.0", _LOOKAHEAD, _OWN, True, {**_GPU_CPU, DISK: "STORAGE"}),
    _sglang("0.5.15", False, True, (), False, True),
    _sglang("0.5.15.post1", False, True, (), False, True),
    _sglang("0.5.16", False, True, (), False, True),
    _sglang("0.5.17", False, False, (), False, True),
    _sglang("0.5.18", False, False, (), False, False),
    _sglang("0.5.19", False, False, (), False, False),
    _sglang("0.5.20", True, True, _SALT, False, False),
    _sglang("0.5.21", True, True, _SALT, False, False),
    _sglang("0.5.22", True, True, (*_SALT, "lora_name"), True, False),
    _sglang("0.5.23", True, True, (*_SALT, "lora_name"), True, False),
)

RELEASES: Mapping[str, Release] = MappingProxyType({r.name: r for r in _TABLE})
NEWEST: Mapping[str, str] = MappingProxyType({"vllm": "vllm-0.33.0", "sglang": "sglang-0.5.23"})
AUTO = "auto"  # ingest only: read every release above (they never contradict each other)

# Every medium name any release above sends, as ours. SGLang's EXTERNAL (a shared pool
# such as Mooncake) and vLLM's FS / OBJ / STORAGE are all below host memory: DISK.
MEDIA_IN: Mapping[str, str] = MappingProxyType(
    {
        "GPU": DEVICE,
        "CPU": HOST,
        "CPU_PINNED": HOST,
        "DISK": DISK,
        "EXTERNAL": DISK,
        "FS": DISK,
        "OBJ": DISK,
        "STORAGE": DISK,
    }
)


def release(name: Any) -> Release:
    """The release called `name` ("vllm-0.33.0", ..., or "vllm" / "sglang" for the
    newest). Raises ValueError naming it and listing the known ones."""
    if isinstance(name, Release):
        return name
    if isinstance(name, str):
        found = RELEASES.get(NEWEST.get(name, name))
        if found is not None:
            return found
    known = ", ".join([*NEWEST, *RELEASES])
    raise ValueError(f"release must be one of {known}; got {name!r}")


def ingest_release(name: Any) -> Release | None:
    """A release to expect on ingest, or None for "auto" (every release)."""
    if name is None or name == AUTO:
        return None
    try:
        return release(name)
    except ValueError as e:
        raise ValueError(str(e).replace("one of ", f"one of {AUTO}, ", 1)) from None
