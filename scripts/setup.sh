#!/usr/bin/env bash
# Creates .venv with the project, its extras and the test tools, and fetches the
# vLLM 0.33.0 and SGLang 0.5.15.post1 / 0.5.23 wheels that the differential tests,
# event tests and benchmarks read.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages for the tier-store tests, installed only when missing: redis-server
# (RedisStore's tests start one), iproute2 (the Mooncake test's network namespace), g++ and
# libssl-dev (build SGLang's page-hash extension from its wheel), libibverbs1 (Mooncake's
# transfer engine links it). A failed install fails set-up: those tests never skip.
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v ip >/dev/null || need+=(iproute2)
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/openssl/sha.h ] || need+=(libssl-dev)
{ /sbin/ldconfig -p 2>/dev/null || true; } | grep -q 'libibverbs\.so\.1' || need+=(libibverbs1)
if [ ${#need[@]} -gt 0 ]; then
    echo "setup.sh: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# pyproject.toml holds ranges; constraints.txt the exact versions the tests run with
# (scripts/lock.py writes it). Its torch==2.13.0 takes the local CPU build on these machines.
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev,torch,text,replay,engine,events,dask,redis]"
# Optional: Mooncake's CPU build. Its test skips only when the package is absent. The
# extra's requirements alone: `-e ".[mooncake]"` would build the package (and its compiled
# core) a second time.
mooncake=$(.venv/bin/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["mooncake"])')
.venv/bin/python -m pip install -q -c constraints.txt $mooncake \
    || echo "setup.sh: optional extra mooncake not installed; tests/test_tiers_mooncake.py will skip" >&2

# the wheels the differential and event tests read: vLLM 0.33.0, SGLang 0.5.23 and
# 0.5.15.post1 (`scripts/fetch-event-wheels.sh --all` fetches every release, for -m slow)
bash scripts/fetch-event-wheels.sh
