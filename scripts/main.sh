#!/usr/bin/env bash
# Main job on bundled default data: the replay of the Mooncake conversation trace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/mambaradix replay "$@"
