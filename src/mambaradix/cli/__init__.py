"""Command line: `mambaradix replay` (the main job), `mambaradix explain`, `mambaradix plan`,
`mambaradix trace`, `mambaradix engine`, `mambaradix demo`, `mambaradix index` and
`mambaradix merge`.

Every command checks all of its input before it starts any work. Exit codes:
0 done; 1 the run failed (e.g. it served nothing); 2 bad input (one line on
stderr naming the option); 130 interrupted (Ctrl-C); 143 and 129 ended by SIGTERM
and SIGHUP (as Ctrl-C: workers stopped, nothing written). No traceback is printed
unless `--debug` is given. Outputs named `-` go to stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from mambaradix.cli.checks import Parser, UsageError
from mambaradix.cli.signals import as_interrupts, exit_code, said

__all__ = ["main"]

COMMANDS: dict[str, str] = {
    "replay": "what a hybrid prefix cache saves on a workload, per policy",
    "explain": "why each request hit short of the ideal bound, per policy and memory",
    "plan": "the memory, state share and policy that meet a target hit rate or TTFT",
    "trace": "check a trace file and summarise it, or write the bundled sample",
    "demo": "multi-turn sessions through the cache, both tree behaviours",
    "engine": "a real hybrid model served on the cache, on vs off",
}


def parser() -> Parser:
    # imported here, inside main's Ctrl-C handling: they take a tenth of a second
    from mambaradix import __version__
    from mambaradix.cli import demo, engine, explain, merge, plan, replay, trace
    from mambaradix.index.cli import add_parser as add_index_parser

    adders: dict[str, Callable[[argparse.ArgumentParser], None]] = {
        "replay": replay.add,
        "explain": explain.add,
        "plan": plan.add,
        "trace": trace.add,
        "demo": demo.add,
        "engine": engine.add,
    }
    top = Parser(prog="mambaradix", description=__doc__)
    top.add_argument("--version", action="version", version=f"mambaradix {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        adders[name](p)
    add_index_parser(sub)  # these two have their own checks and exit codes
    merge.add(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (argparse's own errors included).
    SIGTERM and SIGHUP end it as Ctrl-C does (cli/signals.py)."""
    with as_interrupts():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # --help, or a bad argument (already reported on one line)
        return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt as e:
        print(f"\nmambaradix: {said(e)}", file=sys.stderr)
        return exit_code(e)
    if args.command in ("index", "merge"):
        try:
            return int(args.func(args))
        except KeyboardInterrupt as e:  # before the command's own handling of signals
            print(f"\nmambaradix {args.command}: {said(e)}", file=sys.stderr)
            return exit_code(e)
    prog = f"mambaradix {args.command}"
    try:
        return int(args.run(args))
    except UsageError as e:
        if args.debug:
            raise
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        print(f"\n{prog}: {said(e)}; nothing written", file=sys.stderr)
        return exit_code(e)
    except Exception as e:  # a failure that is not bad input: say what, not where
        if args.debug:
            raise
        what = f"{type(e).__name__}: {one_line(e)}"
        print(f"{prog}: failed: {what} (--debug shows where)", file=sys.stderr)
        return 1


def one_line(e: BaseException) -> str:
    """An exception's message on one line (a KeyError's without its quotes)."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return " ".join(text.split())
