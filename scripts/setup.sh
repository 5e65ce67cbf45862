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

# A venv set up from the same inputs has nothing to install (`scripts/setup_fingerprint.py`:
# the interpreter, requirements and lock, the build and the sources it compiles, these
# scripts), so `bash scripts/main.sh` starts its job at once (a full pass checking an
# installed venv took 27 s). Remove .venv/setup-done to set up again anyway.
done_mark=.venv/setup-done
inputs=$(python3 scripts/setup_fingerprint.py)
if [ -x .venv/bin/python ] && [ "$(cat "$done_mark" 2>/dev/null)" = "$inputs" ]; then
    bash scripts/fetch-event-wheels.sh
    exit 0
fi
rm -f "$done_mark"

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# requirements EXTRA...: what pyproject.toml asks for, with those extras (its ranges), one
# per line (read into an array: `dask[distributed]` must not meet the shell's globbing)
requirements() {
    .venv/bin/python -c 'import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
print(*project["dependencies"], *(r for e in sys.argv[1:] for r in extras[e]), sep="\n")' "$@"
}
# The package itself (its compiled core: half a minute of one core) is built while pip
# installs its requirements (one core too): each pip process writes files of its own.
# pyproject.toml holds ranges; constraints.txt the exact versions the tests run with
# (scripts/lock.py writes it). Its torch==2.13.0 takes the local CPU build on these machines.
build_log=$(mktemp)
.venv/bin/python -m pip install -q --no-deps -e . >"$build_log" 2>&1 &
build=$!
mapfile -t needed < <(requirements dev torch text replay engine events dask redis)
.venv/bin/python -m pip install -q -c constraints.txt "${needed[@]}" \
    || { kill "$build" 2>/dev/null; wait "$build" || true; exit 1; }
wait "$build" || { cat "$build_log" >&2; echo "setup.sh: installing the package failed" >&2; exit 1; }
cat "$build_log"
rm -f "$build_log"
# Optional: Mooncake's CPU build. Its test skips only when the package is absent.
mapfile -t needed < <(requirements mooncake)
.venv/bin/python -m pip install -q -c constraints.txt "${needed[@]}" \
    || echo "setup.sh: optional extra mooncake not installed; tests/test_tiers_mooncake.py will skip" >&2

# the wheels the differential and event tests read: vLLM 0.33.0, SGLang 0.5.23 and
# 0.5.15.post1 (`scripts/fetch-event-wheels.sh --all` fetches every release, for -m slow)
bash scripts/fetch-event-wheels.sh
echo "$inputs" >"$done_mark"
