#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages only), then builds into build/.
# Safe to run again: it installs nothing that is there and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git clang-format clang libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgloo-dev libtorch-dev libopenblas0-pthread zlib1g-dev libseccomp-dev
  libssl-dev openssl
  libgtest-dev libgmock-dev libturbojpeg0-dev libpng-dev python3-torchvision
  prometheus-cpp-dev libmicrohttpd-dev prometheus chromium
  python3 python3-torch python3-grpcio python3-protobuf
  dataset-fashion-mnist systemd iproute2 util-linux etcd-server etcd-client
)
missing=()
# The status page's browser test drives Chromium from Node (playwright-core
# from npm). Debian's nodejs and npm only where no node/npm is there: a
# machine with another Node build (npm bundled) can't take Debian's npm.
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
