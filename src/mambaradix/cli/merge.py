"""`mambaradix merge`: the shard files of a `replay --shard` sweep, as one sweep.

Checks its output before reading anything: `--json` may be `-` (stdout: the JSON
alone, the table goes to stderr) and is never one of the shard files it reads."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mambaradix.cli.checks import UsageError, check_output, is_stdout, write_all


def add(sub: Any) -> None:
    p = sub.add_parser("merge", help="merge the shard files of a `replay --shard` sweep")
    p.add_argument("shards", nargs="+", help="shard files (replay --shard i/N --json FILE)")
    p.add_argument("--json", default=None, help="write the merged results here (-: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mambaradix.replay.cluster_cli import table
    from mambaradix.replay.shards import ShardError, merge
    from mambaradix.replay.sweep import table as sweep_table

    try:
        if args.json is not None:  # before any work; never onto a shard file
            shards = [(name, f"the shard file {name}") for name in args.shards]
            check_output(Path(args.json), "--json", inputs=shards)
        parts = [(name, _read_json(name)) for name in args.shards]
        data = merge(parts)
    except (ShardError, ValueError, UsageError) as e:
        print(f"mambaradix merge: error: {e}", file=sys.stderr)
        return 2
    report = sys.stderr if is_stdout(args.json) else sys.stdout  # stdout: the JSON alone
    has_router = any("router" in r for r in data["results"])
    print(table(data) if has_router else sweep_table(data), file=report)
    text = json.dumps(data, indent=1)
    if is_stdout(args.json):
        print(text)
    elif args.json:
        write_all({Path(args.json): lambda p: p.write_text(text)})
        print(f"json: {args.json}")
    return 0


def _read_json(name: str) -> Any:
    try:
        return json.loads(Path(name).read_text())
    except OSError as e:
        raise ValueError(f"cannot read {name}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not JSON (not UTF-8 text)") from None
