"""The indexer's HTTP server under bad input: every malformed request is answered with a 4xx
and a JSON error (never a dropped connection), and the server keeps answering good ones.

Bodies: nesting past the JSON parser's recursion limit (which used to drop the
connection), bodies over the size limit, lengths that lie, wrong JSON types, bytes that
are not JSON, and seeded random bytes."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mambaradix.events import BlockStored
from mambaradix.index import Indexer
from mambaradix.index.server import MAX_BODY, IndexServer

B = 4
GOOD = {"model_name": "default", "token_ids": [1, 2, 3, 4, 0]}


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    ix = Indexer(B)
    ix.apply(1, [BlockStored((7,), None, [1, 2, 3, 4], B)])
    srv = IndexServer(("127.0.0.1", 0), ix, threading.Lock(), read_timeout_s=2.0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield "127.0.0.1", srv.server_port
    srv.shutdown()
    thread.join(5)
    srv.server_close()


def post(address: tuple[str, int], body: bytes, headers: dict[str, str] | None = None) -> Any:
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.putrequest("POST", "/query")
        sent = {"Content-Length": str(len(body))} if headers is None else headers
        for key, value in sent.items():
            conn.putheader(key, value)
        conn.endheaders()
        conn.send(body)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def still_serving(address: tuple[str, int]) -> None:
    status, body = post(address, json.dumps(GOOD).encode())
    assert status == 200 and body["instances"]["1"]["longest_matched"] == 4


DEEP = 100_000
BODIES = [
    (b"[" * DEEP + b"]" * DEEP, 400, "nests too deep"),
    (b'{"token_ids": ' + b"[" * DEEP + b"]" * DEEP + b"}", 400, "nests too deep"),
    (b'{"token_ids": [1, ' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"]}", 400, "nests too deep"),
    (b"", 400, "empty"),
    (b"\xff\xfe\x00garbage", 400, "not JSON"),
    (b'"a string"', 400, "got string"),
    (b"null", 400, "got null"),
    (b"12", 400, "got number"),
    (b'{"token_ids": 5}', 400, "token_ids"),
    (b'{"token_ids": {"0": 1}}', 400, "token_ids"),
    (b'{"token_ids": [[1], [2]]}', 400, "token_ids"),
    (b'{"token_ids": [1.5]}', 400, "token_ids"),
    (b'{"token_ids": [NaN]}', 400, "token_ids"),
    (b'{"token_ids": [1e400]}', 400, "token_ids"),
    (b'{"token_ids": null}', 400, "token_ids"),
    (b'{"token_ids": [1, 2], "model_name": ["default"]}', 400, "model_name must be a string"),
    (b'{"token_ids": [1, 2], "model_name": 7}', 400, "model_name must be a string"),
    (b'{"token_ids": [1, 2], "model_name": "x' + b"y" * 10_000 + b'"}', 404, "unknown model"),
    (b'{"token_ids": [' + b"1, " * 100_000 + b"18446744073709551616]}", 400, "64-bit"),
]


@pytest.mark.parametrize(("body", "status", "message"), BODIES, ids=range(len(BODIES)))
def test_a_malformed_body_gets_a_4xx(
    address: tuple[str, int], body: bytes, status: int, message: str
) -> None:
    got, answer = post(address, body)
    assert got == status and message in answer["error"]
    still_serving(address)


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"Content-Length": str(MAX_BODY + 1)}, 413, "at most"),
        ({"Content-Length": "99999999999999999999"}, 413, "at most"),
        ({"Content-Length": "-5"}, 411, "Content-Length"),
        ({"Content-Length": "ten"}, 411, "Content-Length"),
        ({}, 411, "Content-Length"),
        ({"Transfer-Encoding": "chunked"}, 411, "Content-Length"),
    ],
)
def test_a_bad_length_gets_a_4xx(
    address: tuple[str, int], headers: dict[str, str], status: int, message: str
) -> None:
    got, answer = post(address, b'{"token_ids": [1]}', headers)
    assert got == status and message in answer["error"]
    still_serving(address)


def test_a_body_shorter_than_its_length_is_answered(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(b"POST /query HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        s.shutdown(socket.SHUT_WR)  # the client gives up writing: the read comes up short
        reply = s.recv(4096)
    assert reply.split(b"\r\n")[0].split()[1] == b"408"
    still_serving(address)


def test_random_bytes_get_a_4xx(address: tuple[str, int]) -> None:
    rng = random.Random(16)
    alphabet = b'{}[]",:0123456789-.eE tnrufalsx\\\xff'
    for _ in range(60):
        body = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        got, answer = post(address, body)
        assert 400 <= got < 500 and "error" in answer, body
    still_serving(address)
