"""HTTP front of the indexer, shaped like Dynamo's standalone indexer (`dynamo.indexer`).

* `POST /query {"model_name": "default", "token_ids": [...]}` ->
  `{"instances": {"<worker>": {"longest_matched", "gpu", "usable", "tail_recompute"}},
  "block_size": B}`; `longest_matched` and `gpu` are the KV overlap Dynamo reports, the
  other two what a hybrid worker can actually reuse. Every registered worker is listed.
  With `"tiers": true` (or a list of media, e.g. `["device", "host"]`) each instance
  also carries `"tiers": {"<medium>": {"longest_matched", "usable", "tail_recompute",
  "load", "state_medium"}}` (`Indexer.query_tiers`: cumulative, device <= host <= disk)
  and Dynamo's cumulative `"cpu"` / `"disk"` overlaps for the lower tiers asked for.
* `GET /workers`: per worker, its stream position and counts.
* `GET /dump`: per worker, the events that rebuild what it holds.

Bad requests get status 400 (404 for an unknown path or model, 408 for a body that does
not arrive within `read_timeout_s`, 413 for a body over `MAX_BODY`, 501 for another
method) and `{"error": "..."}`: a body that is not JSON, nests too deep for the parser,
or holds the wrong types is answered, never a dropped connection. After a bad body the
connection closes (what is left of the body must not be read as a next request).
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from mambaradix.events.model import (
    DISK,
    HOST,
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
)
from mambaradix.events.releases import release
from mambaradix.index.indexer import Indexer, TierOverlap, check_media
from mambaradix.index.subscriber import ZmqSubscriber

MAX_BODY = 64 << 20


class _BadBody(ValueError):
    """A request body the server refuses (`status`: the HTTP status to answer)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class IndexServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        indexer: Indexer,
        lock: threading.Lock,
        subscriber: ZmqSubscriber | None = None,
        model_name: str = "default",
        read_timeout_s: float = 10.0,
    ) -> None:
        self.indexer, self.lock, self.subscriber = indexer, lock, subscriber
        self.model_name, self.read_timeout_s = model_name, read_timeout_s
        # every read on a connection times out: a stalled client does not hold a thread
        handler = type("_Handler", (_Handler,), {"timeout": read_timeout_s})
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    server: IndexServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: no access log
        return

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server finds itself (a bad request line, an unsupported
        method) answered as JSON too."""
        self.close_connection = True
        self._send(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def do_GET(self) -> None:
        if self.path == "/workers":
            return self._send(200, self._workers())
        if self.path == "/dump":
            return self._send(200, self._dump())
        self._send(404, {"error": f"unknown path {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/query":
            self.close_connection = True  # its body is not read
            return self._send(404, {"error": f"unknown path {self.path}"})
        try:
            body = self._body()
        except _BadBody as e:
            self.close_connection = True
            return self._send(e.status, {"error": str(e)})
        except TimeoutError:
            self.close_connection = True
            wait = self.server.read_timeout_s
            return self._send(408, {"error": f"the body did not arrive within {wait:g} s"})
        model = body.get("model_name", self.server.model_name)
        if not isinstance(model, str):
            return self._send(400, {"error": f"model_name must be a string, got {_kind(model)}"})
        if model != self.server.model_name:
            return self._send(404, {"error": f"unknown model_name {model[:200]!r}"})
        tokens = body.get("token_ids")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            return self._send(400, {"error": "token_ids must be a list of ints"})
        try:
            media = _tiers_asked(body.get("tiers", False))
            with self.server.lock:
                result = self.server.indexer.query(tokens)
                tiers = None if media is None else self.server.indexer.query_tiers(tokens, media)
        except (TypeError, ValueError) as e:
            return self._send(400, {"error": str(e)})
        instances = {
            str(w): {
                "longest_matched": o.longest_matched,
                "gpu": o.longest_matched,
                "usable": o.usable,
                "tail_recompute": o.tail_recompute,
            }
            for w, o in result.items()
        }
        if tiers is not None:
            for w, per in tiers.items():
                instances[str(w)].update(_tier_fields(per))
        self._send(200, {"instances": instances, "block_size": self.server.indexer.block_size})

    def _body(self) -> dict[str, Any]:
        text = self.headers.get("Content-Length")
        if text is None or not text.strip().isdigit():
            raise _BadBody(f"Content-Length must be a number of bytes, got {text!r}", 411)
        length = int(text)
        if length > MAX_BODY:
            raise _BadBody(f"body must be at most {MAX_BODY} bytes, got {length}", 413)
        if length == 0:
            raise _BadBody("body is empty: expected a JSON object")
        data = self.rfile.read(length)
        if len(data) < length:
            raise TimeoutError  # the client closed before sending it all
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _BadBody(f"body is not JSON: {e}") from None
        except RecursionError:
            raise _BadBody("body nests too deep to be a query") from None
        if not isinstance(body, dict):
            raise _BadBody(f"body must be a JSON object, got {_kind(body)}")
        return body

    def _workers(self) -> list[dict[str, Any]]:
        server = self.server
        feeds = server.subscriber.feeds if server.subscriber is not None else {}
        with server.lock:
            out = []
            for w in server.indexer.worker_ids():
                info = server.indexer.worker_info(w).to_json()
                if w in feeds:
                    info.update(feeds[w].status(), counts=dict(feeds[w].counts))
                out.append(info)
        return out

    def _dump(self) -> dict[str, Any]:
        ix = self.server.indexer
        with self.server.lock:
            workers = {str(w): [event_json(e) for e in ix.dump(w)] for w in ix.worker_ids()}
        return {"block_size": ix.block_size, "workers": workers}

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _tiers_asked(value: Any) -> tuple[str, ...] | None:
    """The media a query's `tiers` field asks for (None: the plain answer)."""
    if value is False or value is None:
        return None
    if value is True:
        return MEDIA
    if not isinstance(value, list):
        raise ValueError(f"tiers must be true, false or a list of media; got {_kind(value)}")
    try:
        return check_media(value)
    except ValueError as e:
        raise ValueError(f"tiers: {e}") from None


def _tier_fields(per: dict[str, TierOverlap]) -> dict[str, Any]:
    out: dict[str, Any] = {"tiers": {m: asdict(o) for m, o in per.items()}}
    for medium, name in ((HOST, "cpu"), (DISK, "disk")):  # Dynamo's cumulative overlaps
        if medium in per:
            out[name] = per[medium].longest_matched
    return out


def _kind(value: Any) -> str:
    """A JSON value's type, as JSON names it."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


_MEDIA_OUT = release("vllm").media  # medium names as the newest vLLM spells them


def event_json(e: Event) -> dict[str, Any]:
    """An event as a JSON object, with the newest vLLM's field and medium names."""
    if isinstance(e, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(e.block_hashes),
            "parent_block_hash": e.parent_block_hash,
            "token_ids": list(e.token_ids),
            "block_size": e.block_size,
            "group_idx": e.group,
            "kv_cache_spec_kind": e.kind,
            "medium": _MEDIA_OUT.get(e.medium, e.medium),  # type: ignore[arg-type]
        }
    if isinstance(e, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(e.block_hashes),
            "group_idx": e.group,
            "medium": _MEDIA_OUT.get(e.medium, e.medium),  # type: ignore[arg-type]
        }
    assert isinstance(e, AllBlocksCleared)
    return {"type": "AllBlocksCleared"}
