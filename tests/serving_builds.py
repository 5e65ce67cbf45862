"""The replay's cells on whichever build loads, as JSON.

`python tests/serving_builds.py REQUESTS MEMORIES` runs the first REQUESTS requests of the
bundled Mooncake trace through every default policy at each memory point (GB,
comma-separated), as the main job does. It prints on its first line the build (what
`mambaradix.BUILD` says, then what the module files are) and the modules of
`mambaradix._build.COMPILED` the run did not import; on its second, every cell's full
result (each request's hits too; the wall-clock fields left out) as JSON.

tests/test_compiled.py runs it twice, once with MAMBARADIX_PURE=1: the two JSON lines
must be equal (the compiled modules decide within the replay as the pure ones).
"""

from __future__ import annotations

import json
import sys

import mambaradix
from mambaradix._build import COMPILED, loaded_build
from mambaradix.geometry.profile import load_profile
from mambaradix.policies import DEFAULT_RUN
from mambaradix.replay.run import replay_checked
from mambaradix.replay.serving import ServingConfig
from mambaradix.replay.workloads import load

WALL_CLOCK = ("replay_s", "requests_per_s")


def cells(requests: int, memories: list[float]) -> dict[str, object]:
    trace = load("mooncake")
    trace.requests = trace.requests[:requests]
    profile = load_profile("nemotron-h-8b")
    out: dict[str, object] = {}
    for memory in memories:
        for policy in DEFAULT_RUN:
            cfg = ServingConfig(memory_gb=memory)
            result = replay_checked(trace, profile, policy, cfg, per_request=True).to_json()
            out[f"{policy} at {memory:g} GB"] = {
                k: v for k, v in result.items() if k not in WALL_CLOCK
            }
    return out


def main(argv: list[str]) -> int:
    requests, memories = int(argv[0]), [float(m) for m in argv[1].split(",")]
    result = cells(requests, memories)
    print(mambaradix.BUILD, loaded_build(), *(n for n in COMPILED if n not in sys.modules))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
