#!/bin/bash
# Soak (bounded, not in CI): one long job with N random faults, then a
# summary table and the final checks. See tests/chaos/soak.py.
#
#   tests/chaos/soak.sh [N=20] [SEED=now] [soak.py options: --loopback, --epochs E, --kinds ...]
#
# The whole run is bounded by SOAK_TIMEOUT seconds (default 120 per fault +
# 300); on the timeout soak.py gets SIGTERM and cleans up (processes,
# namespaces), then SIGKILL 60 s later.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
n="${1:-20}"
seed="${2:-$(date +%s)}"
shift $(( $# < 2 ? $# : 2 ))
limit="${SOAK_TIMEOUT:-$(( n * 120 + 300 ))}"
exec timeout --kill-after=60 "$limit" /usr/bin/python3 "$here/soak.py" --faults "$n" --seed "$seed" "$@"
