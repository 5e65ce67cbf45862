"""Tests for `mambaradix.replay.workloads`: trace loaders, format detection,
bundled data, text workloads through a real tokenizer, synthetic generators."""

from __future__ import annotations

import doctest
import gzip
import hashlib
import json
import math
import random
from array import array
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

from mambaradix.replay import workloads
from mambaradix.replay.trace import Trace, TraceRequest
from mambaradix.replay.workloads import (
    BUNDLED,
    TraceFormatError,
    agent_loop,
    detect_format,
    load,
    load_jsonl,
    load_mooncake,
    load_trace,
    multi_turn,
    save_jsonl,
    shared_prefix,
)
from mambaradix.replay.workloads._io import data_file
from mambaradix.replay.workloads.arrivals import chain_times, start_times
from mambaradix.replay.workloads.sources import (
    extract_swe_agent,
    read_traj,
    swe_agent_conversations,
)
from mambaradix.replay.workloads.text import real_schedule

MOONCAKE_SHA256 = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"

# ---------------------------------------------------------------- helpers


def write_lines(path: Path, records: Iterable[object]) -> Path:
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) for r in records))
    return path


def jl(*objs: object) -> list[str]:
    return [(o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs]


def by_session(trace: Trace) -> dict[int | str, list[TraceRequest]]:
    sessions: dict[int | str, list[TraceRequest]] = defaultdict(list)
    for r in trace.requests:
        sessions[r.session_id].append(r)
    for rs in sessions.values():
        rs.sort(key=lambda r: r.turn_id)
    return sessions


def assert_exact_prefix_chains(trace: Trace) -> int:
    """Each turn's input extends the previous turn's input + output; returns the
    number of checked turn pairs."""
    pairs = 0
    for sid, rs in by_session(trace).items():
        assert [r.turn_id for r in rs] == list(range(len(rs))), sid
        for prev, cur in zip(rs, rs[1:], strict=False):
            history = prev.input_units + prev.output_units
            assert len(cur.input_units) > len(history), (sid, cur.turn_id)
            assert cur.input_units[: len(history)] == history, (sid, cur.turn_id)
            assert cur.ts >= prev.ts
            pairs += 1
    return pairs


def rows(t: Trace) -> list[tuple[object, ...]]:
    return [
        (
            r.session_id,
            r.turn_id,
            r.ts,
            r.input_units,
            r.output_units,
            r.input_tokens,
            r.output_tokens,
        )
        for r in t.requests
    ]


def same_requests(a: Trace, b: Trace) -> bool:
    return rows(a) == rows(b)


# ---------------------------------------------------------------- Mooncake


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return load("mooncake")


def test_bundled_mooncake_file_is_the_original() -> None:
    raw = gzip.decompress(data_file("mooncake", "conversation_trace.jsonl.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == MOONCAKE_SHA256
    for name in ("LICENSE", "ATTRIBUTION.md"):
        assert data_file("mooncake", name).stat().st_size > 500


def test_bundled_mooncake(mooncake: Trace) -> None:
    with gzip.open(data_file("mooncake", "conversation_trace.jsonl.gz"), "rt") as f:
        raw = [json.loads(line) for line in f]
    assert len(mooncake) == len(raw) == 12_031
    assert mooncake.unit_tokens == 512 and mooncake.name == "mooncake"
    assert "Apache-2.0" in mooncake.source
    inputs: set[int] = set()
    outputs: list[int] = []
    turns: dict[tuple[int | str, int], list[int]] = {}
    for i, (r, rec) in enumerate(zip(mooncake.requests, raw, strict=True)):
        prev = turns.get((r.session_id, r.turn_id - 1))
        if r.turn_id == 0:  # a session's first request names it
            assert r.session_id == i
        else:  # an inferred next turn extends its previous prompt's full blocks
            assert prev is not None and r.input_units.tolist()[: len(prev) - 1] == prev[:-1]
        turns[r.session_id, r.turn_id] = r.input_units.tolist()
        assert r.ts == rec["timestamp"] / 1000
        assert r.input_units.tolist() == rec["hash_ids"]
        assert r.input_tokens == rec["input_length"]
        assert len(r.input_units) == math.ceil(rec["input_length"] / 512)
        assert r.output_tokens == rec["output_length"]
        assert len(r.output_units) == math.ceil(rec["output_length"] / 512)
        assert len(r.output_units) >= 1 or rec["output_length"] == 0
        inputs.update(r.input_units)
        outputs.extend(r.output_units)
    assert all(x < 0 for x in outputs)
    assert len(set(outputs)) == len(outputs)
    assert not inputs & set(outputs)
    ts = [r.ts for r in mooncake.requests]
    assert ts == sorted(ts) and ts[0] >= 0 and 3_500 < ts[-1] < 3_600
    assert 288_000 < sum(len(r.input_units) for r in mooncake.requests) < 289_000
    assert sum(r.turn_id > 0 for r in mooncake.requests) == 3_305  # module docstring


def test_mooncake_without_session_inference(tmp_path: Path) -> None:
    # two prompts: b extends a's full blocks (1, 2) and a introduced them
    a = {"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3]}
    b = {"timestamp": 5000, "input_length": 2000, "output_length": 10, "hash_ids": [1, 2, 4, 5]}
    c = {"timestamp": 6000, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 6]}
    path = write_lines(tmp_path / "mc.jsonl", jl(a, b, c))
    inferred = [(r.session_id, r.turn_id) for r in load_mooncake(path).requests]
    assert inferred == [(0, 0), (0, 1), (2, 0)]  # c shares a's prefix, but a has its next turn
    plain = [(r.session_id, r.turn_id) for r in load_mooncake(path, sessions=False).requests]
    assert plain == [(0, 0), (1, 0), (2, 0)]


def test_tiny_mooncake_file(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path / "tiny.jsonl",
        jl(
            {"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0, 1]},
            "",
            {"timestamp": 1500, "input_length": 512, "output_length": 0, "hash_ids": [0]},
            {"timestamp": 2500, "input_length": 1025, "output_length": 1025, "hash_ids": [0, 1, 7]},
        ),
    )
    t = load_mooncake(p)
    assert t.name == "tiny" and t.unit_tokens == 512 and len(t) == 3
    assert [r.ts for r in t.requests] == [0.0, 1.5, 2.5]
    assert [r.input_units.tolist() for r in t.requests] == [[0, 1], [0], [0, 1, 7]]
    assert [r.output_units.tolist() for r in t.requests] == [[-1], [], [-2, -3, -4]]
    assert [r.input_tokens for r in t.requests] == [1000, 512, 1025]
    assert [r.output_tokens for r in t.requests] == [1, 0, 1025]
    # the third prompt extends the first one's full block (0, first seen there): its next turn
    assert [(r.session_id, r.turn_id) for r in t.requests] == [(0, 0), (1, 0), (0, 1)]
    assert load_mooncake(p, limit=2).requests[-1].input_units.tolist() == [0]


def test_mooncake_output_ids_stay_below_negative_input_ids(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path / "neg.jsonl",
        jl({"timestamp": 0, "input_length": 600, "output_length": 600, "hash_ids": [-5, 3]}),
    )
    (r,) = load_mooncake(p).requests
    assert r.output_units.tolist() == [-6, -7]


def test_mooncake_ids_with_no_room_for_output_ids_below(tmp_path: Path) -> None:
    # Output ids are fresh ids below every input id: with an input id at the 64-bit
    # minimum there are none, a TraceFormatError naming its line (not an OverflowError).
    low = {"timestamp": 1, "input_length": 600, "output_length": 600, "hash_ids": [-(2**63), 3]}
    p = write_lines(tmp_path / "low.jsonl", jl(MC, low))
    with pytest.raises(TraceFormatError, match="line 2: .*no room below"):
        load_mooncake(p)
    low["hash_ids"] = [-(2**63) + 3, 3]  # room for exactly the three output blocks
    (first, r) = load_mooncake(write_lines(tmp_path / "ok.jsonl", jl(MC, low))).requests
    assert first.output_units.tolist() == [-(2**63) + 2]
    assert r.output_units.tolist() == [-(2**63) + 1, -(2**63)]


def test_mooncake_gz_and_load_trace(tmp_path: Path) -> None:
    rec = {"timestamp": 10, "input_length": 3, "output_length": 2, "hash_ids": [9]}
    p = tmp_path / "t.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps(rec) + "\n")
    assert detect_format(p) == "mooncake"
    t = load_trace(p)
    assert t.name == "t" and t.unit_tokens == 512 and t.requests[0].input_units.tolist() == [9]


def damaged_gzip_files(tmp_path: Path) -> dict[str, Path]:
    """A valid gzip trace cut in half, one with its deflate data flipped, one
    that is not gzip at all, and one whose text is not UTF-8."""
    good = tmp_path / "good.jsonl.gz"
    with gzip.open(good, "wt") as f:
        f.write("".join(jl(*[NEU] * 200)))
    raw = good.read_bytes()
    files = {
        "truncated": raw[: len(raw) // 2],
        "corrupt": raw[:20] + bytes(b ^ 0x55 for b in raw[20:]),
        "not gzip": b"".join(x.encode() for x in jl(NEU)),
        "not utf-8": gzip.compress(b'{"session_id": "\xe9"}\n'),
    }
    out = {}
    for what, data in files.items():
        out[what] = tmp_path / f"{what.replace(' ', '-')}.jsonl.gz"
        out[what].write_bytes(data)
    return out


def test_damaged_gzip_is_a_trace_format_error(tmp_path: Path) -> None:
    # a damaged file is bad input (TraceFormatError naming the file), not a crash
    for what, path in damaged_gzip_files(tmp_path).items():
        with pytest.raises(TraceFormatError, match=str(path)) as e:
            load_trace(path)
        assert e.value.path == str(path), what


# ---------------------------------------------------------------- neutral format


def test_neutral_round_trip(tmp_path: Path) -> None:
    p = write_lines(
        tmp_path / "n.jsonl",
        jl(
            {
                "session_id": "a",
                "turn_id": 0,
                "ts": 0.0,
                "input_tokens": [1, 2, 3],
                "output_tokens": [4],
            },
            {
                "session_id": "a",
                "turn_id": 1,
                "ts": 2.25,
                "input_tokens": [1, 2, 3, 4, 5],
                "output_tokens": [],
            },
            {"session_id": 7, "turn_id": 0, "ts": 1, "input_tokens": [9], "output_tokens": [8, 8]},
        ),
    )
    assert detect_format(p) == "neutral"
    t = load_trace(p)
    assert t.unit_tokens == 1 and len(t) == 3
    assert [(r.session_id, r.turn_id, r.ts) for r in t.requests] == [
        ("a", 0, 0.0),
        (7, 0, 1.0),
        ("a", 1, 2.25),
    ]
    assert [r.input_tokens for r in t.requests] == [3, 1, 5]
    assert t.requests[1].output_units == array("q", [8, 8])
    for name in ("copy.jsonl", "copy.jsonl.gz"):
        save_jsonl(t, tmp_path / name)
        assert same_requests(load_jsonl(tmp_path / name), t)


def test_save_jsonl_round_trips_synthetic_and_rejects_block_traces(tmp_path: Path) -> None:
    t = agent_loop(sessions=3, seed=5)
    save_jsonl(t, tmp_path / "a.jsonl")
    assert same_requests(load(str(tmp_path / "a.jsonl")), t)
    block = Trace("b", [TraceRequest(0, 0, 0.0, array("q", [1]), array("q"), 300, 0)], 512)
    with pytest.raises(ValueError, match="token-level"):
        save_jsonl(block, tmp_path / "b.jsonl")


# ---------------------------------------------------------------- errors

MC = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
NEU = {"session_id": 0, "turn_id": 0, "ts": 0.0, "input_tokens": [1], "output_tokens": [2]}


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "line 3: invalid JSON"),
        ("[1, 2]", "line 3: expected a JSON object"),
        ({**MC, "hash_ids": "1,2"}, "line 3: 'hash_ids' must be a list of integers"),
        ({**MC, "hash_ids": [1, 2.5]}, r"line 3: 'hash_ids' must hold only integers, found 2\.5"),
        ({**MC, "hash_ids": []}, "line 3: 'hash_ids' must not be empty"),
        ({k: v for k, v in MC.items() if k != "output_length"}, "line 3: missing field"),
        ({**MC, "input_length": 600}, r"line 3: 1 hash_ids do not cover input_length=600"),
        ({**MC, "output_length": -1}, "line 3: 'output_length' must be an integer >= 0"),
        # a typo of 10**18 would make 2 x 10**15 output ids (16 PB): 2**24 blocks at most
        ({**MC, "output_length": 10**18}, "line 3: 'output_length' must be at most 8,589,934,592"),
        ({**MC, "timestamp": "soon"}, "line 3: 'timestamp' must be a finite number"),
        # json.dumps writes float("inf") as the non-standard Infinity, which json.loads reads
        ({**MC, "timestamp": float("inf")}, "line 3: 'timestamp' must be a finite number"),
    ],
)
def test_malformed_mooncake_names_the_line(tmp_path: Path, bad_line: object, message: str) -> None:
    p = write_lines(tmp_path / "bad.jsonl", jl(MC, MC, bad_line, MC))
    with pytest.raises(TraceFormatError, match=message) as e:
        load_mooncake(p)
    assert e.value.line == 3 and e.value.path == str(p)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ({**NEU, "input_tokens": []}, "line 2: 'input_tokens' must not be empty"),
        ({**NEU, "output_tokens": [1, "2"]}, "line 2: 'output_tokens' must hold only integers"),
        ({**NEU, "session_id": None}, "line 2: 'session_id' must be an integer or a string"),
        ({**NEU, "turn_id": -1}, "line 2: 'turn_id' must be an integer >= 0"),
        ({**NEU, "input_tokens": [2**70]}, "line 2: 'input_tokens' holds an integer outside"),
        ({**NEU, "ts": float("inf")}, "line 2: 'ts' must be a finite number >= 0, got inf"),
        ({**NEU, "ts": float("nan")}, "line 2: 'ts' must be a finite number >= 0, got nan"),
    ],
)
def test_malformed_neutral_names_the_line(tmp_path: Path, bad_line: object, message: str) -> None:
    p = write_lines(tmp_path / "bad.jsonl", jl(NEU, bad_line))
    with pytest.raises(TraceFormatError, match=message):
        load_trace(p)


def test_unknown_and_empty_formats(tmp_path: Path) -> None:
    unknown = write_lines(tmp_path / "u.jsonl", jl("", {"prompt": "hi", "input_tokens": 5}))
    with pytest.raises(TraceFormatError, match="line 2: unknown trace format.*input_tokens"):
        load_trace(unknown)
    empty = write_lines(tmp_path / "e.jsonl", ["\n", "  \n"])
    with pytest.raises(TraceFormatError, match="no records"):
        load(str(empty))
    with pytest.raises(ValueError, match="neither a bundled workload"):
        load("no-such-workload")
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.load_bundled("nope")


def test_registry_and_doctest() -> None:
    assert {
        "mooncake",
        "swe-agent",
        "mt-bench",
        "chitchat",
        "synthetic-multi-turn",
        "synthetic-shared-prefix",
        "synthetic-agent",
        "sample",
    } == BUNDLED
    for name in ("synthetic-multi-turn", "synthetic-shared-prefix", "synthetic-agent"):
        t = load(name)
        assert t.name == name and len(t) > 0 and t.unit_tokens == 1
    assert doctest.testmod(workloads).failed == 0


# ---------------------------------------------------------------- synthetic


@pytest.mark.parametrize("gen", [shared_prefix, multi_turn, agent_loop])
def test_synthetic_seeded(gen: object) -> None:
    assert callable(gen)
    a, b, c = gen(seed=1), gen(seed=1), gen(seed=2)
    assert same_requests(a, b)
    assert not same_requests(a, c)
    ts = [r.ts for r in a.requests]
    assert ts == sorted(ts) and ts[0] == 0.0


def test_multi_turn_is_exact_prefix_chains() -> None:
    t = multi_turn(sessions=10, turns=(3, 5), seed=3)
    assert len(by_session(t)) == 10
    assert assert_exact_prefix_chains(t) == len(t) - 10
    system = t.requests[0].input_units[:200]
    assert all(r.input_units[:200] == system for r in t.requests)  # shared system prompt


def test_shared_prefix_tenants() -> None:
    t = shared_prefix(requests=300, tenants=3, system_tokens=(100, 100), rate=10, seed=4)
    heads = {r.input_units[:100].tobytes() for r in t.requests}
    assert len(heads) == 3
    assert all(r.turn_id == 0 for r in t.requests)
    assert len({r.session_id for r in t.requests}) == 300
    assert 20 < t.requests[-1].ts < 40  # 300 requests at 10/s
    uniform = shared_prefix(requests=5, rate=2, arrival="uniform")
    assert [r.ts for r in uniform.requests] == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_agent_loop_branches() -> None:
    t = agent_loop(sessions=20, steps=(6, 10), branch_prob=0.3, seed=6)
    branches = t.meta["branches"]
    assert isinstance(branches, list) and branches
    rerun = {(s, k): j for s, k, j in branches}
    for sid, rs in by_session(t).items():
        for k in range(1, len(rs)):
            cur = rs[k]
            if (sid, k) in rerun:  # re-runs an earlier call's prompt, a different answer
                earlier = rs[rerun[sid, k]]
                assert cur.input_units == earlier.input_units
                assert cur.input_units is not earlier.input_units
            else:  # extends the (possibly branched) previous call + a tool result
                prev = rs[k - 1]
                history = prev.input_units + prev.output_units
                assert cur.input_units[: len(history)] == history
                assert len(cur.input_units) >= len(history)
    with pytest.raises(ValueError, match="branch_prob"):
        agent_loop(branch_prob=1.5)


def test_arrivals() -> None:
    rng = random.Random(0)
    assert start_times(3, 4.0, rng, "uniform") == [0.0, 0.25, 0.5]
    chain = chain_times(1.0, [100, 50, 7], rng, think_time_s=0, decode_tps=50)
    assert chain == ([1.0, 3.0, 4.0], [None, 0.0, 0.0])
    # the think time drawn is the gap minus the answer's decode time
    chain = chain_times(0.0, [100, 50], random.Random(3), think_time_s=5, decode_tps=50)
    assert chain.thinks[1] is not None and chain.times[1] == 100 / 50 + chain.thinks[1]
    with pytest.raises(ValueError):
        start_times(3, 0.0, rng)
    real = real_schedule([[100.0, 110.0, 10_000.0], [200.0], []], window_s=50, max_gap_s=60)
    assert [c.times for c in real] == [[0.0, 10.0, 70.0], [50.0], []]
    assert [c.thinks for c in real] == [[None, None, None], [None], []]  # no answer times
    answered = [[104.0, 150.0, 10_001.0], [201.0], []]
    real = real_schedule([[100.0, 110.0, 10_000.0]], window_s=50, max_gap_s=60, answered=answered)
    assert real[0].thinks == [None, 110.0 - 104.0, 60.0]  # the pause after the answer, capped


# ---------------------------------------------------------------- text workloads


def test_swe_agent_bundle_reads_like_traj_files(tmp_path: Path) -> None:
    traj = {
        "history": [
            {"role": "system", "content": "sys", "agent": "main"},
            {"role": "user", "content": [{"type": "text", "text": "issue"}]},
            {
                "role": "assistant",
                "content": "look",
                "tool_calls": [{"function": {"name": "find", "arguments": '{"x": 1}'}, "id": "c1"}],
            },
            {"role": "tool", "content": "found", "tool_call_ids": ["c1"]},
        ]
    }
    p = tmp_path / "one.traj"
    p.write_text(json.dumps(traj))
    msgs = read_traj(p)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[1].content == "issue" and msgs[2].tool_calls[0].name == "find"
    extract_swe_agent([p], tmp_path / "bundle.json.gz")
    doc = json.loads(gzip.decompress((tmp_path / "bundle.json.gz").read_bytes()))
    assert doc["sessions"][0]["file"] == "one.traj"
    bundled = swe_agent_conversations()
    assert len(bundled) == 22
    assert sum(m.role == "assistant" for c in bundled for m in c.messages) == 230
    assert data_file("swe_agent", "LICENSE").read_text().startswith("MIT License")


@pytest.fixture(scope="module")
def text_traces() -> dict[str, Trace]:
    return {name: load(name) for name in ("swe-agent", "mt-bench", "chitchat")}


@pytest.mark.parametrize(
    ("name", "requests", "sessions"),
    [("swe-agent", 230, 22), ("mt-bench", 160, 80), ("chitchat", 2594, 170)],
)
def test_text_workload_exact_prefix(
    text_traces: dict[str, Trace], name: str, requests: int, sessions: int
) -> None:
    t = text_traces[name]
    assert t.unit_tokens == 1 and len(t) == requests and len(by_session(t)) == sessions
    assert assert_exact_prefix_chains(t) == requests - sessions
    for r in t.requests:
        assert r.input_units[0] == 1  # <s>
        assert r.input_units[-1] in (4, 9)  # a prompt ends with [/INST] or [/TOOL_RESULTS]
        assert r.output_units[-1] == 2  # </s>
        assert r.input_tokens == len(r.input_units) and r.output_tokens == len(r.output_units)
    ts = [r.ts for r in t.requests]
    assert ts == sorted(ts) and ts[0] == 0.0


def test_text_workload_stats(text_traces: dict[str, Trace]) -> None:
    swe = text_traces["swe-agent"]
    lengths = [r.input_tokens for r in swe.requests]
    assert min(lengths) > 1_000 and 5_500 < sum(lengths) / len(lengths) < 7_000
    assert 15_000 < max(lengths) < 20_000
    chit = text_traces["chitchat"]
    assert max(r.input_tokens for r in chit.requests) <= 16_384
    assert "real" in str(chit.meta["timestamps"])


def test_text_loaders_seeded(text_traces: dict[str, Trace]) -> None:
    from mambaradix.replay.workloads import load_mt_bench

    again, other = load_mt_bench(seed=0), load_mt_bench(seed=1)
    assert same_requests(again, text_traces["mt-bench"])
    assert not same_requests(other, again)


@pytest.mark.slow  # renders every conversation through mistral-common's template
def test_chat_template_matches_mistral_common(text_traces: dict[str, Trace]) -> None:
    """Our per-message template is token-for-token mistral-common's v7 chat
    template on every conversation without tool messages."""
    from importlib import resources

    from mistral_common.protocol.instruct import messages as mm
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    from mambaradix.replay.workloads.chat import TOKENIZER_FILE
    from mambaradix.replay.workloads.sources import (
        chitchat_conversations,
        mt_bench_conversations,
    )

    ref = MistralTokenizer.from_file(
        str(resources.files("mistral_common") / "data" / TOKENIZER_FILE)
    )
    kinds = {"system": mm.SystemMessage, "user": mm.UserMessage, "assistant": mm.AssistantMessage}
    convs = {
        "swe-agent": swe_agent_conversations(),
        "mt-bench": mt_bench_conversations(),
        "chitchat": chitchat_conversations(40),
    }
    checked = 0
    for name, cs in convs.items():
        prompts = {(r.session_id, r.turn_id): r.input_units for r in text_traces[name].requests}
        for c in cs:
            if any(m.role == "tool" or m.tool_calls for m in c.messages):
                continue
            calls = [i for i, m in enumerate(c.messages) if m.role == "assistant"]
            for k, i in enumerate(calls):
                if (c.session_id, k) not in prompts:
                    break
                msgs = [kinds[m.role](content=m.content) for m in c.messages[:i]]
                want = ref.encode_chat_completion(ChatCompletionRequest(messages=msgs)).tokens
                assert prompts[c.session_id, k].tolist() == want, (name, c.session_id, k)
                checked += 1
    assert checked > 550  # 186 SWE-agent + 160 MT-Bench + 248 chitchat calls
