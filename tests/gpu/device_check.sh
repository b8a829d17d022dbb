#!/usr/bin/env bash
# The GPU proof, in one command on a machine with an NVIDIA GPU, CUDA
# PyTorch 2.x (its LibTorch and CMake package), NCCL's wheel, cmake and
# ninja, and no package registry (README's "GPUs"):
#   tests/gpu/pack.sh                       # here, once: .gpu-pack/
#   tests/gpu/device_check.sh OUT           # there, carrying .gpu-pack
# Unpacks the packages into a private prefix, builds against the wheel's
# LibTorch on every core, runs each check with its own time limit, and
# writes OUT/results.json (one entry per step: ok, seconds, what it
# measured) and OUT/GPU.md (the same, to commit as docs/GPU.md) plus
# OUT/device_check.log. A failed step is recorded and the rest still run.
# DDP_CHECK_ONLY=configure stops after configuring (how it is tried on a
# CPU machine, against Debian's LibTorch); DDP_CHECK_SKIP_BUILD=1 reruns
# the checks over a build a warm machine still has. The limits below keep
# the whole run under the GPU machine's 10 minutes a command.
set -uo pipefail
out=${1:?usage: device_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
prefix=${DDP_DEPS_PREFIX:-/tmp/ddp-deps}
build=${DDP_GPU_BUILD:-$root/build-gpu}
log=$out/device_check.log
steps=$out/steps.jsonl
: >"$log"
: >"$steps"
python=${PYTHON:-python3}
arch=$(uname -m)-linux-gnu

# step NAME LIMIT_SECONDS COMMAND...: runs it, logs its output, records the outcome.
step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name" | tee -a "$log"
  local start=$SECONDS
  # Through bash, so that a step may be one of the functions below.
  timeout "$limit" bash -c '"$@"' "$name" "$@" >>"$log" 2>&1
  local rc=$?
  local took=$((SECONDS - start))
  printf '{"step": "%s", "ok": %s, "rc": %d, "seconds": %d}\n' "$name" \
    "$([ $rc = 0 ] && echo true || echo false)" "$rc" "$took" >>"$steps"
  echo "    rc $rc after ${took}s" | tee -a "$log"
  return $rc
}

unpack() {
  "$python" "$root/tests/gpu/unpack_debs.py" "$prefix" "$root"/.gpu-pack/*.deb || return 1
  # Development links to libraries the machine has itself (libssl, libz...):
  # point them at the machine's copy.
  local link soname found
  for link in $(find "$prefix" -xtype l -name '*.so'); do
    soname=$(basename "$link")
    found=$(ldconfig -p | awk -v n="$soname" '$1 ~ "^"n"\\." {print $NF; exit}')
    [ -n "$found" ] && ln -sf "$found" "$link" && echo "linked $link -> $found"
  done
  return 0
}

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available(), "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)'
}

configure() {
  local torch_prefix
  torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)') || return 1
  export PKG_CONFIG="$prefix/usr/bin/pkgconf"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"
  export PKG_CONFIG_PATH="$prefix/usr/lib/$arch/pkgconfig:$prefix/usr/share/pkgconfig"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_PREFIX_PATH=$torch_prefix;$prefix/usr;$prefix/usr/lib/$arch/cmake" \
    -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc" \
    -DGRPC_CPP_PLUGIN="$prefix/usr/bin/grpc_cpp_plugin" \
    -DCMAKE_CXX_FLAGS="-D_GLIBCXX_USE_CXX11_ABI=$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)"
}

export -f unpack machine configure
export root prefix build python arch

# The libraries the build links from the prefix, and NCCL from its wheel.
nccl_dir=$("$python" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$prefix/usr/lib/$arch${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

step machine 60 machine
step unpack 120 unpack
step configure 120 configure || { "$python" "$root/tests/gpu/report.py" "$out"; exit 1; }
[ "${DDP_CHECK_ONLY:-}" = configure ] && { "$python" "$root/tests/gpu/report.py" "$out"; exit 0; }
if [ -z "${DDP_CHECK_SKIP_BUILD:-}" ]; then
  step build 300 cmake --build "$build" -j "$(nproc)" --target ddp-coordinator ddp-worker \
    ddp-validate ddp-run ddp_torch_tests ddp_unit_tests ||
    { "$python" "$root/tests/gpu/report.py" "$out"; exit 1; }
fi
# On cuda:0: NCCL at world 1 (all-reduce, broadcast, abort mid-collective),
# staging at world 2 on the one GPU, the reducer on device parameters.
step gpu_tests 60 "$build/bin/ddp_torch_tests" --gtest_filter='Gpu*:DevicePlacement*'
step gpu_unit_tests 30 "$build/bin/ddp_unit_tests" --gtest_filter='Nccl*:TransportChoice*'
# Training on the GPU through the real daemons, against PyTorch.
# Against PyTorch too: parity, the single-GPU ceiling, ResNet-18's speed.
step gpu_jobs 200 "$python" "$root/tests/gpu/gpu_jobs.py" "$build" "$out"
"$python" "$root/tests/gpu/report.py" "$out"
