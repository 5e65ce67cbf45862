"""The Dask backend (`replay/executors.py`, the `dask` extra): a sweep on a local
two-process Dask cluster on 127.0.0.1 equals a serial sweep, through the API and
through `mambaradix replay --executor dask://HOST:PORT`. Every wait is bounded: the
whole test is cut off by an alarm after 240 s, and the cluster is closed on the way out."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from mambaradix.cli import main
from mambaradix.geometry.profile import get_profile
from mambaradix.replay.cluster import ClusterSpec
from mambaradix.replay.executors import DaskExecutor, dask_address
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.sweep import sweep
from mambaradix.replay.workloads import multi_turn

pytestmark = pytest.mark.slow  # a local Dask cluster: seconds to start

WALL_CLOCK = frozenset({"replay_s", "requests_per_s"})


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"the Dask test took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in data["results"]]


def test_a_sweep_on_a_local_dask_cluster_equals_a_serial_one(tmp_path: Path) -> None:
    from distributed import LocalCluster

    trace = multi_turn(sessions=4, seed=9)
    profile = get_profile("nemotron-h-8b")
    args: dict[str, Any] = {
        "policies": ["sglang", "mambaradix"],
        "memories": [0.5, 1.0],
        "base": ServingConfig(memory_gb=0.5),
        "progress": False,
        "routers": ["round-robin", "hybrid"],
        "cluster": ClusterSpec(2),
    }
    serial = sweep(trace, profile, workers=1, **args)
    trace_file = tmp_path / "t.jsonl"
    trace_file.write_text(
        "".join(
            json.dumps(
                {
                    "session_id": r.session_id,
                    "turn_id": r.turn_id,
                    "ts": r.ts,
                    "input_tokens": r.input_units.tolist(),
                    "output_tokens": r.output_units.tolist(),
                    "think_s": r.think_s,  # closed loop waits it (absent: the arrival gap)
                }
            )
            + "\n"
            for r in trace.requests
        )
    )
    with (
        deadline(240),
        LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
        ) as local,
    ):
        url = local.scheduler_address.replace("tcp://", "dask://")
        executor = DaskExecutor(url)
        try:
            remote = sweep(trace, profile, executor=executor, **args)
        finally:
            executor.shutdown()
        out = tmp_path / "dask.json"
        cli = ["replay", "--trace", str(trace_file), "--memory", "0.5,1", "--no-progress"]
        cli += ["--policy", "sglang,mambaradix", "--instances", "2"]
        cli += ["--router", "round-robin,hybrid", "--executor", url, "--json", str(out)]
        assert main(cli) == 0
    assert rows(remote) == rows(serial)
    assert rows(json.loads(out.read_text())) == rows(serial)


def test_dask_addresses_are_checked() -> None:
    assert dask_address("dask://127.0.0.1:8786") == "tcp://127.0.0.1:8786"
    for bad in ("tcp://127.0.0.1:8786", "dask://127.0.0.1", "dask://127.0.0.1:99999", "dask://:1"):
        with pytest.raises(ValueError, match="--executor must be dask://HOST:PORT"):
            dask_address(bad)
    unreachable = "^--executor dask://127.0.0.1:9: cannot reach the Dask scheduler"
    with deadline(60), pytest.raises(ValueError, match=unreachable):
        DaskExecutor("dask://127.0.0.1:9", timeout_s=2.0)  # nothing listens on port 9
