#!/usr/bin/env bash
# The GPU check in one command, for a short GPU lease of a bare image (docs/gpu.md):
#   bash tests/gpu_session.sh            # on the GPU machine, from the repository root; results in $OUT
#   DEVICE=cpu SIZES=tiny bash tests/gpu_session.sh   # the rehearsal (tests/test_gpu_session.py runs it)
# Environment: PY (default python3), OUT (default figures/gpu-check), DEVICE (cuda), DEADLINE (seconds in all,
# default 480), SIZES (full | tiny), STAGES (comma-separated, default all; see tests/gpu_session.py).
# $OUT receives two files: summary.json and gpu-check.tar.gz. Exit status 0 only if every stage passed.
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PY:-python3}" tests/gpu_session.py "$@"
