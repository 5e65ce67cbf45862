#!/usr/bin/env bash
# Main job on bundled default data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/mambaradix demo "$@"
