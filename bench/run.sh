#!/usr/bin/env bash
# Builds, then runs every benchmark and writes docs/BENCHMARKS.md,
# docs/NETWORK_BENCHMARKS.md and their plots (about 20 minutes on 2 cores,
# and an hour more for the network benchmarks, which need root; --quick for a
# smoke run without them).
set -euo pipefail
cd "$(dirname "$0")/.."
./deploy/setup.sh
if ! dpkg-query -W -f='${Status}' python3-matplotlib 2>/dev/null | grep -q "install ok installed"; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q python3-matplotlib
fi
# Across test hosts (network namespaces and tc need root; about an hour
# more, ResNet-18 most of it), then the one-machine benchmarks, whose report
# sums the network targets up.
if [ "$(id -u)" = 0 ] && [ "${1:-}" != "--quick" ]; then
  /usr/bin/python3 bench/network_bench.py
  /usr/bin/python3 bench/network_bench.py --hosts 2 --per-host 2 --models mlp \
    --rates 100mbit,1gbit --compressions none --steps 80 --append
  /usr/bin/python3 bench/network_bench.py --hosts 4 --models mlp,cnn --rates 100mbit,1gbit \
    --steps 80 --append
  # PowerSGD beside PyTorch's powerSGD_hook; ResNet-18 uncompressed again on
  # 1 Gbit/s, where single runs vary most: medians of 3.
  /usr/bin/python3 bench/network_bench.py --models resnet18 --rates 100mbit,1gbit \
    --compressions powersgd --repeat 3 --append
  /usr/bin/python3 bench/network_bench.py --models resnet18 --rates 1gbit --repeat 3 --append
fi
exec /usr/bin/python3 bench/run_benchmarks.py "$@"
