"""Feed one event stream to Dynamo's standalone indexer and to ours; print both answers.

Run inside a private network namespace (Dynamo binds its HTTP port on 0.0.0.0):

    unshare -n sh -c 'ip link set lo up && exec python tests/dynamo_driver.py \
        .venv-dynamo/bin/python'

(`scripts/dynamo-interop.sh` does this; `tests/test_dynamo_interop.py` asserts on it.)

A tree with an emitter (16-token blocks) publishes the same changes twice, in vLLM's
format (worker 1: KV group + "mamba" state group) and in SGLang's (worker 2: KV only), to
`python -m dynamo.indexer` (ai-dynamo-runtime 1.6.1) and to our `ZmqSubscriber`. The
scenario is the one of scale-out.md: A (32 tokens, state), then A+B+C (80 tokens, state);
the prompt A+B+D shares 64 tokens of KV but a state only at 32. Then A's state is
evicted (A becomes a tombstone, its KV stays). Probe blocks of tokens no prompt uses are
published and awaited to know that Dynamo has applied everything before them: ZMQ keeps
order per connection and the indexer runs single-threaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from mambaradix import MambaRadixCache
from mambaradix.events import BlockStored, EventEmitter, chain_hashes
from mambaradix.events.publisher import ZmqPublisher
from mambaradix.index import Indexer
from mambaradix.index.subscriber import ZmqSubscriber

BLOCK = 16
PORTS = {1: 5557, 2: 5559}
FORMATS = {1: "vllm", 2: "sglang"}
HTTP = 8090
A, B, C, D = (list(range(k, k + n)) for k, n in ((1000, 32), (2000, 32), (3000, 16), (4000, 16)))


def bounded(what: str, done: Callable[[], bool], timeout_s: float, step: Callable[[], Any]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"dynamo_driver: timed out waiting for {what}")
        step()


def dynamo_query(tokens: list[int]) -> dict[str, int]:
    body = json.dumps({"model_name": "default", "token_ids": tokens}).encode()
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(f"http://127.0.0.1:{HTTP}/query", body, headers)
    with urllib.request.urlopen(req, timeout=2) as r:
        answer = json.loads(r.read())
    return {w: v["longest_matched"] for w, v in answer.get("instances", {}).items()}


def dynamo_up() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{HTTP}/workers", timeout=1) as r:
            return r.status == 200
    except OSError:
        time.sleep(0.1)
        return False


class Stream:
    def __init__(self) -> None:
        self.tree = MambaRadixCache(page_size=1)
        self.emitter = EventEmitter(self.tree, BLOCK)
        self.pubs = {
            w: ZmqPublisher(f"tcp://127.0.0.1:{p}", release=FORMATS[w]) for w, p in PORTS.items()
        }
        self.ours = Indexer(BLOCK)
        self.sub = ZmqSubscriber(self.ours)
        for w, pub in self.pubs.items():
            self.sub.add(w, pub.endpoint)
        self.probes = 0

    def publish(self, events: list[Any]) -> None:
        for pub in self.pubs.values():
            pub.publish(events)

    def settle(self) -> None:
        """Publish a probe block until both indexers credit it on both workers."""
        self.probes += 1
        tokens = [90_000 + 100 * self.probes + i for i in range(BLOCK)]
        probe = [BlockStored(tuple(chain_hashes(tokens, BLOCK)), None, tokens, BLOCK)]

        def credited() -> bool:
            self.sub.poll(0.05)
            ours = self.ours.query(tokens + [0])
            theirs = dynamo_query(tokens + [0])
            return all(
                ours.get(w, None) and ours[w].longest_matched == BLOCK for w in PORTS
            ) and all(theirs.get(str(w)) == BLOCK for w in PORTS)

        bounded("a probe block", credited, 30.0, lambda: (self.publish(probe), time.sleep(0.2)))

    def answers(self, prompt: list[int]) -> dict[str, Any]:
        m = self.tree.match_prefix(prompt)
        return {
            "dynamo": dynamo_query(prompt),
            "ours": {str(w): vars_of(o) for w, o in self.ours.query(prompt).items()},
            "tree": {"prefix_len": m.prefix_len, "kv_hit_len": m.kv_hit_len},
        }


def vars_of(o: Any) -> dict[str, int]:
    return {k: getattr(o, k) for k in ("longest_matched", "usable", "tail_recompute")}


def check_alive(proc: subprocess.Popen[str], log: Any) -> None:
    if proc.poll() is not None:
        log.seek(0)
        raise SystemExit(f"dynamo_driver: dynamo.indexer exited: {log.read()[-2000:]}")


def main() -> int:
    dynamo_python = sys.argv[1]
    workers = ",".join(f"{w}=tcp://127.0.0.1:{p}" for w, p in PORTS.items())
    cmd = [dynamo_python, "-m", "dynamo.indexer", "--block-size", str(BLOCK)]
    cmd += ["--workers", workers, "--port", str(HTTP), "--threads", "1"]
    s = Stream()
    with tempfile.TemporaryFile("w+") as log:  # Dynamo's log, read back only if it dies
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
        try:
            bounded("dynamo.indexer to answer", dynamo_up, 60.0, lambda: check_alive(proc, log))
            result = scenario(s)
        finally:
            proc.terminate()
            proc.wait(10)
            s.sub.close()
            for pub in s.pubs.values():
                pub.close()
    print(json.dumps(result))
    return 0


def scenario(s: Stream) -> dict[str, Any]:
    s.settle()
    s.tree.insert(A, list(range(32)), state=0)
    s.tree.insert(A + B + C, list(range(80)), state=1, prev_prefix_len=32)
    s.publish(s.emitter.take())
    s.settle()
    prompt = A + B + D
    before = s.answers(prompt)
    s.tree.evict_state_of(s.tree.peek(A))  # A becomes a tombstone: its KV stays
    s.publish(s.emitter.take())
    s.settle()
    return {"prompt_tokens": len(prompt), "before": before, "after": s.answers(prompt)}


if __name__ == "__main__":
    sys.exit(main())
