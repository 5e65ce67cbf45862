"""SGLang's two mamba cache strategies and the one rule that ties them to a page size.

`no_buffer` checkpoints a request's running state where the prefill stops, so a state
sits at an exact token end: it needs pages of one token (SGLang refuses anything else).
`extra_buffer` tracks states into extra slots at chunk-aligned positions: any page
size. Every entry point (the lifecycle, the engine, the replay, the CLI) asks `takes_page`
and words its error with `PAGE_RULE`, naming its own parameter.
"""

from __future__ import annotations

from mambaradix.names import Names


class Strategy(Names):
    """The two strategies (a `Names`: `Strategy.NO_BUFFER == "no_buffer"`)."""

    NO_BUFFER = "no_buffer"
    EXTRA_BUFFER = "extra_buffer"

    def takes_page(self, page_size: int) -> bool:
        """Whether this strategy can run with pages of `page_size` tokens (`takes_page`)."""
        return takes_page(self, page_size)


NO_BUFFER = Strategy.NO_BUFFER
EXTRA_BUFFER = Strategy.EXTRA_BUFFER
STRATEGIES = tuple(Strategy)

PAGE_RULE = "no_buffer keeps states at exact token ends (page size 1), as in SGLang"


def takes_page(strategy: str, page_size: int) -> bool:
    """Whether `strategy` (a `Strategy` or its name) can run with pages of `page_size`
    tokens (or trace units): the one home of the rule."""
    return strategy == EXTRA_BUFFER or page_size == 1


def check_strategy(strategy: object, name: str = "strategy") -> str:
    """`strategy` if it is one of STRATEGIES, else ValueError naming `name`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"{name} must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    return str(strategy)
