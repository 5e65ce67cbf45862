"""`mambaradix trace`: check a trace file and summarise it, or write the bundled sample.

`trace check FILE` loads FILE (the neutral JSONL schema or the Mooncake
format; a bundled name works too), checks it (`workloads.check`) and prints
its summary: requests, sessions, prompt and output lengths, recorded think
times, and the ideal bound. A malformed file is one line naming the line and
the field (exit 2). `trace sample` writes the bundled sample trace
(`mambaradix/data/sample/`), the example of the schema.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mambaradix.cli.checks import UsageError, check_output, write_all

__all__ = ["add"]


def add(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    check = sub.add_parser(
        "check",
        help="validate a trace file and summarise it",
        description="Validate a trace file (neutral JSONL or Mooncake) and summarise it.",
    )
    check.add_argument("file", help="trace file, or a bundled name (sample, mooncake, ...)")
    check.add_argument("--json", type=Path, default=None, help="also write the summary here")
    check.add_argument("--no-progress", action="store_true", help="no progress bars")
    check.set_defaults(run=run_check)
    sample = sub.add_parser(
        "sample",
        help="write the bundled sample trace (the neutral JSONL schema, version 2)",
        description="Write the bundled sample trace: 6 two-turn MT-Bench sessions.",
    )
    sample.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    sample.set_defaults(run=run_sample)


def run_check(args: argparse.Namespace) -> int:
    from mambaradix.replay.progress import shown
    from mambaradix.replay.workloads import BUNDLED, load
    from mambaradix.replay.workloads.check import check_file, describe, summarize

    if args.json is not None:
        check_output(args.json, "--json")
    is_file = Path(args.file).is_file()
    if not is_file and args.file not in BUNDLED:
        raise UsageError(
            f"{args.file}: no such file, and not a bundled trace ({', '.join(sorted(BUNDLED))})"
        )
    with shown(not args.no_progress):
        try:
            trace = check_file(args.file) if is_file else load(args.file)
        except (ValueError, OSError, ImportError) as e:  # TraceFormatError is a ValueError
            raise UsageError(str(e)) from None
        summary = summarize(trace, args.file)
    print(describe(summary))
    if args.json is not None:
        data = summary.to_json()
        write_all({args.json: lambda p: p.write_text(json.dumps(data, indent=1))})
        print(f"json: {args.json}")
    return 0


def run_sample(args: argparse.Namespace) -> int:
    from mambaradix.replay.workloads import SAMPLE_FILE, data_file

    text = data_file(*SAMPLE_FILE).read_text(encoding="utf-8")
    if args.out is None:
        sys.stdout.write(text)
        return 0
    check_output(args.out, "--out")
    write_all({args.out: lambda p: p.write_text(text, encoding="utf-8")})
    print(f"sample trace: {args.out}", file=sys.stderr)
    return 0
