"""Readers for the text datasets, turning each into `Conversation`s (no tokenizer).

* SWE-agent `.traj` files (`history`: the messages of one agent session), or
  the compact bundled extraction of their histories;
* MT-Bench questions with GPT-4 reference answers (bundled);
* chitchat (PyPI `chitchat-dataset`): real human-human conversations with
  per-message timestamps.
"""

from __future__ import annotations

import gzip
import json
import random
from calendar import timegm
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from time import strptime
from typing import cast

from ._io import PathLike, data_file
from .chat import INSTALL_HINT, Message, Role, ToolCall

SWE_AGENT_FILE = ("swe_agent", "histories.json.gz")
MT_BENCH_QUESTIONS = ("mt_bench", "question.jsonl")
MT_BENCH_ANSWERS = ("mt_bench", "reference_answer_gpt-4.jsonl")
_ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class Conversation:
    """One session's messages; `times[i]`, when known, is the real time (s) at
    which assistant message i was requested (its prompt complete), and
    `answered[i]` when it was complete (its last part sent)."""

    session_id: int | str
    messages: tuple[Message, ...]
    times: tuple[float, ...] | None = None
    answered: tuple[float, ...] | None = None


# ---------------------------------------------------------------- SWE-agent


def _text(content: object) -> str:
    """Message content: a string, or a list of `{"type": "text", "text": ...}` chunks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return "" if content is None else str(content)


def _message(raw: dict[str, object], where: str) -> Message:
    role = raw.get("role")
    if role not in _ROLES:
        raise ValueError(f"{where}: unknown message role {role!r}")
    calls = raw.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ValueError(f"{where}: tool_calls must be a list")
    tool_calls = []
    for c in calls:
        fn = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise ValueError(f"{where}: malformed tool call {c!r}")
        tool_calls.append(ToolCall(str(fn.get("name", "")), str(fn.get("arguments", ""))))
    return Message(cast(Role, role), _text(raw.get("content")), tuple(tool_calls))


def read_traj(path: PathLike) -> list[Message]:
    """The `history` of a SWE-agent `.traj` file as messages."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    history = doc.get("history") if isinstance(doc, dict) else None
    if not isinstance(history, list):
        raise ValueError(f"{path}: no 'history' list (not a SWE-agent trajectory)")
    return [_message(m, f"{path}, history[{i}]") for i, m in enumerate(history)]


def _message_json(m: Message) -> dict[str, object]:
    d: dict[str, object] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    return d


def extract_swe_agent(traj_paths: Iterable[PathLike], out: PathLike) -> None:
    """Write the compact bundle: `{"sessions": [{"file", "messages"}]}`, gzipped.

    This is how `data/swe_agent/histories.json.gz` was made from the 22 `.traj`
    files; only each message's role, text and tool calls are kept.
    """
    sessions = [
        {"file": Path(p).name, "messages": [_message_json(m) for m in read_traj(p)]}
        for p in sorted(traj_paths, key=lambda p: Path(p).name)
    ]
    blob = json.dumps({"format": 1, "sessions": sessions}, ensure_ascii=False, indent=0)
    with gzip.GzipFile(out, "wb", compresslevel=9, mtime=0) as f:
        f.write(blob.encode("utf-8"))


def swe_agent_conversations(paths: Sequence[PathLike] | None = None) -> list[Conversation]:
    """SWE-agent sessions: the bundled extraction, or the given `.traj` files.

    Session ids are the trajectory file names.
    """
    if paths is not None:
        return [Conversation(Path(p).name, tuple(read_traj(p))) for p in paths]
    with gzip.open(data_file(*SWE_AGENT_FILE), "rt", encoding="utf-8") as f:
        doc = json.load(f)
    return [
        Conversation(
            s["file"],
            tuple(_message(m, f"{s['file']}[{i}]") for i, m in enumerate(s["messages"])),
        )
        for s in doc["sessions"]
    ]


# ---------------------------------------------------------------- MT-Bench


def _read_jsonl(path: Path) -> Iterator[dict[str, object]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _synthetic_answer(rng: random.Random, words: list[str], lengths: list[int]) -> str:
    """Words drawn from the reference answers, with a reference answer's length."""
    return " ".join(rng.choices(words, k=rng.choice(lengths)))


def mt_bench_conversations(seed: int = 0) -> list[Conversation]:
    """MT-Bench: 80 two-turn questions (session id = question id).

    Answers are the GPT-4 reference answers where the data has them (30
    questions: math, reasoning, coding); the others get a seeded synthetic
    answer: as many words as a randomly chosen reference answer of the same
    turn, drawn at random from the reference answers' words.
    """
    refs: dict[object, list[str]] = {
        a["question_id"]: cast(list[str], cast(list[dict[str, object]], a["choices"])[0]["turns"])
        for a in _read_jsonl(data_file(*MT_BENCH_ANSWERS))
    }
    words = [w for turns in refs.values() for t in turns for w in t.split()]
    lengths = [[len(turns[k].split()) for turns in refs.values()] for k in (0, 1)]
    convs = []
    for q in _read_jsonl(data_file(*MT_BENCH_QUESTIONS)):
        qid = cast(int, q["question_id"])
        rng = random.Random(f"mt-bench:{seed}:{qid}")
        turns = cast(list[str], q["turns"])
        answers = refs.get(qid) or [_synthetic_answer(rng, words, lengths[k]) for k in (0, 1)]
        msgs: list[Message] = []
        for question, answer in zip(turns, answers, strict=True):
            msgs += [Message("user", question), Message("assistant", answer)]
        convs.append(Conversation(qid, tuple(msgs)))
    return convs


# ---------------------------------------------------------------- chitchat


def _chitchat_path() -> Path:
    try:
        return Path(str(resources.files("chitchat_dataset") / "dataset.json"))
    except ModuleNotFoundError as e:
        raise ImportError(f"{INSTALL_HINT} ({e})") from e


def _epoch(stamp: str) -> float:
    return float(timegm(strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def chitchat_conversations(n: int = 300, path: PathLike | None = None) -> list[Conversation]:
    """The first `n` chitchat conversations in file order (id = conversation uuid);
    those without a reply are skipped.

    Each turn-group (consecutive utterances of one sender, joined by newlines)
    is one message; the first sender is the user, the other the assistant.
    `times` holds, per assistant message, the real epoch time of the user's
    last utterance before it; `answered` the time of its own last utterance.
    """
    with open(path or _chitchat_path(), encoding="utf-8") as f:
        data: dict[str, dict[str, object]] = json.load(f)
    convs = []
    for conv_id, conv in list(data.items())[:n]:
        groups = cast(list[list[dict[str, str]]], conv["messages"])
        turns: list[tuple[Role, str, float]] = []  # (role, text, time of its last utterance)
        for g in groups:
            role: Role = "user" if g[0]["sender"] == groups[0][0]["sender"] else "assistant"
            text, ts = "\n".join(u["text"] for u in g), _epoch(g[-1]["timestamp"])
            if turns and turns[-1][0] == role:
                text = turns[-1][1] + "\n" + text
                turns.pop()
            turns.append((role, text, ts))
        asked = range(1, len(turns))
        times = tuple(turns[i - 1][2] for i in asked if turns[i][0] == "assistant")
        answered = tuple(turns[i][2] for i in asked if turns[i][0] == "assistant")
        if times:
            msgs = tuple(Message(role, text) for role, text, _ in turns)
            convs.append(Conversation(conv_id, msgs, times, answered))
    return convs
