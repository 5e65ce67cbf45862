"""Workloads: loaders that turn request traces and real text into `Trace`s.

    >>> from mambaradix.replay.workloads import load
    >>> trace = load("mooncake")          # a bundled workload by name
    >>> trace.unit_tokens, len(trace)
    (512, 12031)

`load(name_or_path)` takes a name from `BUNDLED` or the path of a JSONL trace in
either format (Mooncake block hashes or neutral token lists, told apart by
their fields). Modules:

* `mooncake`  -- Mooncake-format block traces (`load_mooncake`);
* `jsonl`     -- the neutral token-level format (`load_jsonl`, `save_jsonl`,
                 `load_trace` with format detection); `sample` is its bundled sample;
* `check`     -- `check_file` and `summarize` behind `mambaradix trace check`;
* `text`      -- real text through a real tokenizer: `load_swe_agent`,
                 `load_mt_bench`, `load_chitchat` (need the `text` extra);
* `synthetic` -- seeded generators: shared prefixes, multi-turn, agent loops;
* `chat`, `sources`, `arrivals` -- the chat template, dataset readers and
  arrival-time helpers behind them.

Bundled data lives in `mambaradix/data/` with its licenses and attribution.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..trace import Trace
from ._io import TraceFormatError, data_file
from .jsonl import detect_format, load_jsonl, load_trace, save_jsonl
from .mooncake import load_bundled_mooncake, load_mooncake
from .synthetic import agent_loop, multi_turn, shared_prefix
from .text import load_chitchat, load_mt_bench, load_swe_agent

SAMPLE_FILE = ("sample", "sample_trace.jsonl")


def load_sample() -> Trace:
    """The bundled sample of the neutral JSONL schema (`mambaradix/data/sample/`)."""
    return load_jsonl(data_file(*SAMPLE_FILE), name="sample")


_LOADERS: dict[str, Callable[[], Trace]] = {
    "sample": load_sample,
    "mooncake": load_bundled_mooncake,
    "swe-agent": load_swe_agent,
    "mt-bench": load_mt_bench,
    "chitchat": load_chitchat,
    "synthetic-multi-turn": multi_turn,
    "synthetic-shared-prefix": shared_prefix,
    "synthetic-agent": agent_loop,
}
BUNDLED: frozenset[str] = frozenset(_LOADERS)
"""Workload names `load` accepts; the text ones need the `text` extra."""


def load_bundled(name: str) -> Trace:
    """A bundled workload by name, with its default parameters."""
    try:
        loader = _LOADERS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; bundled: {sorted(BUNDLED)}") from None
    return loader()


def load(name_or_path: str | os.PathLike[str]) -> Trace:
    """A bundled workload (a name in `BUNDLED`) or a JSONL trace file in either format."""
    if isinstance(name_or_path, str) and name_or_path in _LOADERS:
        return load_bundled(name_or_path)
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"{str(name_or_path)!r} is neither a bundled workload {sorted(BUNDLED)} nor a file"
        )
    return load_trace(path)


__all__ = [
    "BUNDLED",
    "TraceFormatError",
    "agent_loop",
    "detect_format",
    "load",
    "load_bundled",
    "load_chitchat",
    "load_jsonl",
    "load_mooncake",
    "load_mt_bench",
    "load_sample",
    "SAMPLE_FILE",
    "data_file",
    "load_swe_agent",
    "load_trace",
    "multi_turn",
    "save_jsonl",
    "shared_prefix",
]
