"""The commands and stated times of the README and of the docs (`docs/**/*.md`), as data:
read by `tests/test_readme.py` (which runs every command), `tests/test_docs.py` (which builds
the site) and `bench/readme_timings.py` (which checks every time).

`docs/commands.md` ("Every command") has one section per document, headed by its path in
backquotes (such as ## `README.md` or ## `docs/reference/replay.md`), with a table that lists
each command of that document's ```bash blocks, in order, with how the test runs it
(column 2) and how long a full run takes (column 3). Column 2 is one of:
  `runs `CMD`...`       the test runs CMD instead (a script's wrapped command)
  `nothing...`          the test runs the command as written ("this test is part
                        of what it runs": not at all; "exit code 2": it must fail
                        with exit code 2 and stderr must hold the `quoted` text)
  `by the test suite...` not run here: the test files it names run in the suite
                        (a `pytest` command), or the `quoted` test runs it
  `in the background`   a server: started with the `quoted` options appended, on a
                        free port instead of the one it names, then stopped
  `against the server`  a client of the server row above it, on the server's port
  `run as ...`          a shard of a sweep: run for every i/N, with the `quoted`
                        options appended (the last quoted text)
  `on the shard files`  the merge of the shards above, checked against a serial run
  `needs a GPU`         without CUDA: exit code 2 and the `quoted` text on stderr;
                        with CUDA: run as written
  `OPTIONS`             the test appends OPTIONS
A command found in several documents is listed in each, the same way, and run once.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
COMMANDS = DOCS / "commands.md"


class Claim(NamedTuple):
    """A stated range [lo, hi] (lo == hi for a single number), in the unit measured."""

    lo: float
    hi: float

    def holds(self, measured: float) -> bool:
        """Within a factor of 2: lo/2 <= measured <= 2 hi."""
        return self.lo / 2 <= measured <= 2 * self.hi

    def __str__(self) -> str:
        return f"{self.lo:g}" if self.lo == self.hi else f"{self.lo:g}-{self.hi:g}"


class Row(NamedTuple):
    command: str
    test: str  # column 2, raw
    time: str  # column 3, raw
    doc: str = ""  # the document whose section lists it ("README.md", "docs/...")


class Tested(NamedTuple):
    words: list[str] | None  # None: the test does not run it
    exit_code: int
    stderr_has: str | None
    role: str = "command"  # or "server", "client", "shard", "merge", "gpu", "suite"


def documents() -> dict[str, str]:
    """Path (relative to the repository) -> text: the README, then every page of docs/."""
    out = {"README.md": README.read_text(encoding="utf-8")}
    for path in sorted(DOCS.rglob("*.md")):
        out[path.relative_to(REPO).as_posix()] = path.read_text(encoding="utf-8")
    return out


def fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return re.findall(r"^```([\w-]*)\n(.*?)^```", text, flags=re.S | re.M)


def bash_commands(text: str) -> list[str]:
    """Every command of the ```bash blocks (continued lines joined), without
    trailing comments."""
    out = []
    for lang, block in fences(text):
        if lang != "bash":
            continue
        for line in block.replace("\\\n", " ").splitlines():
            cmd = re.split(r"\s#\s", " " + line, maxsplit=1)[0].strip()
            if cmd:
                out.append(" ".join(cmd.split()))
    return out


def command_tables(text: str | None = None) -> dict[str, list[Row]]:
    """docs/commands.md: document path -> the rows of its section, in order."""
    text = COMMANDS.read_text(encoding="utf-8") if text is None else text
    out: dict[str, list[Row]] = {}
    for section in text.split("\n## ")[1:]:
        heading, _, body = section.partition("\n")
        m = re.fullmatch(r"`([^`]+)`", heading.strip())
        if m is None:
            continue
        if m.group(1) in out:
            raise ValueError(f"{COMMANDS.name}: two sections for {m.group(1)}")
        out[m.group(1)] = [
            Row(cells[0].strip("`"), cells[1], cells[2], m.group(1))
            for line in body.splitlines()
            if line.startswith("| `")
            for cells in [[c.strip() for c in line.strip().strip("|").split(" | ")]]
        ]
    return out


def command_rows(text: str | None = None) -> list[Row]:
    """Every listed command once (where it is first listed), in the order of docs/commands.md."""
    rows: dict[str, Row] = {}
    for section in command_tables(text).values():
        for row in section:
            rows.setdefault(row.command, row)
    return list(rows.values())


def _quoted(text: str) -> str | None:
    m = re.search(r"`([^`]+)`", text)
    return m.group(1) if m else None


def _last_quoted(text: str) -> str:
    found = re.findall(r"`([^`]+)`", text)
    return found[-1] if found else ""


def how_tested(row: Row) -> Tested:
    col = row.test
    words = shlex.split(row.command)
    if col.startswith("in the background"):
        return Tested(words + shlex.split(_quoted(col) or ""), 0, None, "server")
    if col.startswith("against the server"):
        return Tested(words, 0, None, "client")
    if col.startswith("run as"):
        return Tested(words + shlex.split(_last_quoted(col)), 0, None, "shard")
    if col.startswith("on the shard files"):
        return Tested(words, 0, None, "merge")
    if col.startswith("needs a GPU"):
        return Tested(words, 2, _quoted(col), "gpu")
    if col.startswith("by the test suite"):
        return Tested(None, 0, None, "suite")
    if col.startswith("runs "):
        words = shlex.split(_quoted(col) or "")
    elif col.startswith("nothing"):
        if "this test is part of" in col:
            return Tested(None, 0, None)
        if "exit code 2" in col:
            return Tested(words, 2, _quoted(col))
    else:
        words += shlex.split(_quoted(col) or "")
    if words[:1] == ["/usr/bin/time"]:
        words = words[1:]
    return Tested(words, 0, None)


def to_argv(words: list[str], python: str = sys.executable) -> list[str]:
    """`.venv/bin/...` as this Python; `bench/...` scripts by absolute path."""
    out: list[str] = []
    for w in words:
        if w == ".venv/bin/python":
            out.append(python)
        elif w == ".venv/bin/mambaradix":
            out += [python, "-m", "mambaradix.cli"]
        elif w == ".venv/bin/mkdocs":
            out += [python, "-m", "mkdocs"]
        elif w.startswith("bench/"):
            out.append(str(REPO / w))
        else:
            out.append(w)
    return out


_TIME = re.compile(r"(\d+(?:\.\d+)?)(?:-(\d+(?:\.\d+)?))? (s|min)\b")


def stated_seconds(time_cell: str) -> Claim | None:
    """The last `N s`, `a-b s`, `N min` of a time cell, in seconds; None if none."""
    found = _TIME.findall(time_cell)
    if not found:
        return None
    lo, hi, unit = found[-1]
    scale = 60.0 if unit == "min" else 1.0
    return Claim(float(lo) * scale, float(hi or lo) * scale)


def _int(text: str) -> float:
    return float(text.replace(",", ""))


def replay_headings(text: str) -> dict[str, tuple[Claim, Claim, Claim]]:
    """Per workload heading: (slowest run, fastest run) in requests/s, and the
    sweep's seconds (a whole number: it stands for +-0.5 s)."""
    pat = r"\*\*([\w-]+)\*\* \([^)]*?replay ([\d,]+)-([\d,]+) requests/s per run, sweep (\d+) s\)"
    out = {}
    for name, lo, hi, sweep in re.findall(pat, text):
        s = float(sweep)
        out[name] = (Claim(_int(lo), _int(lo)), Claim(_int(hi), _int(hi)), Claim(s - 0.5, s + 0.5))
    return out


def _table_after(text: str, header_start: str) -> list[list[str]]:
    lines = text.split(header_start, 1)[1].splitlines()[2:]  # skip the header's rest, |---|
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("*") for c in line.strip().strip("|").split("|")])
    return rows


ENGINE_HEADER = "| model | workload | req/s cache on / off |"


def engine_table(text: str) -> dict[tuple[str, str], dict[str, Claim]]:
    """(model, workload) -> req/s and mean TTFT (s) with the cache on and off,
    from the columns so named."""
    header = ENGINE_HEADER + text.split(ENGINE_HEADER, 1)[1].splitlines()[0]
    names = [c.strip() for c in header.strip().strip("|").split("|")]
    req, ttft = names.index("req/s cache on / off"), names.index("mean TTFT on / off")
    out = {}
    for cells in _table_after(text, ENGINE_HEADER):
        req_on, req_off = (float(x) for x in cells[req].split("/"))
        ttft_on, ttft_off = (float(x) / 1e3 for x in cells[ttft].removesuffix("ms").split("/"))
        out[cells[0], cells[1]] = {
            "req/s on": Claim(req_on, req_on),
            "req/s off": Claim(req_off, req_off),
            "TTFT on (s)": Claim(ttft_on, ttft_on),
            "TTFT off (s)": Claim(ttft_off, ttft_off),
        }
    return out


CORE_SIDES = ("upstream", "ours_sglang")


def core_table(text: str) -> dict[str, dict[str, Claim]]:
    """op -> median µs per side (upstream, ours_sglang)."""
    out = {}
    for cells in _table_after(text, "| op | count | SGLang median µs |"):
        meds = [float(x) for x in cells[2:4]]
        out[cells[0]] = {s: Claim(m, m) for s, m in zip(CORE_SIDES, meds, strict=True)}
    return out


def _number(pattern: str, text: str) -> Claim:
    m = re.search(pattern, text)
    if m is None:
        raise ValueError(f"neither the README nor the docs say {pattern!r} any more")
    lo = _int(m.group(1))
    hi = _int(m.group(2)) if m.lastindex and m.lastindex > 1 else lo
    return Claim(lo, hi)


def indexer_claims(text: str) -> dict[str, Claim]:
    """The indexer's speed paragraph: events/s in-process (one block per
    event), events/s through SGLang's wire format, vLLM's blocks/s (a range:
    through the wire to in-process) and the 16k-token query in µs."""
    return {
        "apply_1block events/s": _number(r"applies ([\d,]+) events/s in-process", text),
        "feed_sglang events/s": _number(r"handles\s+([\d,]+) events/s in SGLang's format", text),
        "vllm blocks/s": _number(r"events go at ([\d,]+)-([\d,]+)\s+blocks/s", text),
        "query µs": _number(r"cached on 8 workers takes ([\d,]+) µs", text),
    }


def read() -> str:
    """The README and every page of docs/, as one text (where the stated numbers are found)."""
    return "\n\n".join(documents().values())
