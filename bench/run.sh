#!/usr/bin/env bash
# Builds, then runs every benchmark and writes docs/BENCHMARKS.md and its plots
# (about 20 minutes on 2 cores; --quick for a smoke run).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/setup.sh
if ! dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q python3-matplotlib
fi
exec /usr/bin/python3 bench/run_benchmarks.py "$@"
