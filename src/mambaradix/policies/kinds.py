"""The kinds of checkpoint the scheduler asks a policy about (`Policy.cache_at`,
`Policy.on_cached`): where in a request's life a state could be cached.

    CHUNK       a prefill chunk ended there (the request is stashed)
    STOP        a planned stop (`Policy.stops`, no_buffer)
    PROMPT_END  the prompt is done and decoding goes on
    DECODED     after a decode step (`Policy.decode_interval`, no_buffer)
    FINISH      the finished sequence (`Policy.insert_at_finish`)
"""

from __future__ import annotations

from mambaradix.names import Names

__all__ = ["CHUNK", "DECODED", "FINISH", "PROMPT_END", "STOP", "Kind"]


class Kind(Names):
    """The checkpoint kinds (a `Names`: `Kind.CHUNK == "chunk"`)."""

    CHUNK = "chunk"
    STOP = "stop"
    PROMPT_END = "prompt_end"
    DECODED = "decoded"
    FINISH = "finish"


CHUNK, STOP, PROMPT_END, DECODED, FINISH = Kind
