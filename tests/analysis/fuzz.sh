#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer and UBSan) and runs
# each for a bounded time on its corpus in tests/fuzz/corpus (new inputs go
# to a temporary folder, not into the repository). The build is configured
# without LibTorch (-DDDP_WORKER=OFF, Torch hidden) and also builds
# ddp-coordinator: CI's proof that the coordinator needs no LibTorch.
#   tests/analysis/fuzz.sh SOURCE_DIR BUILD_ROOT [SECONDS_EACH]
set -euo pipefail
src=$(cd "$1" && pwd)
out="$2/fuzz"
seconds=${3:-20}
cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-O1 -gline-tables-only -DNDEBUG -fsanitize=address,undefined -fno-sanitize-recover=undefined -fsanitize=fuzzer-no-link" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DDDP_ANALYSIS=ON -DDDP_FUZZ=ON -DDDP_WORKER=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON >/dev/null
cmake --build "$out" --target job_spec_fuzzer coordinator_fuzzer image_fuzzer transform_fuzzer \
  pack_index_fuzzer ddp-coordinator
for name in job_spec_fuzzer coordinator_fuzzer image_fuzzer transform_fuzzer pack_index_fuzzer; do
  corpus=$(mktemp -d)
  trap 'rm -rf "$corpus"' EXIT
  # -close_fd_mask=2: the targets' own logging is not wanted (libFuzzer and
  # the sanitizers still report on a duplicate of stderr).
  "$out/bin/$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -close_fd_mask=2 -print_funcs=0 -print_final_stats=1 \
    "$corpus" "$src/tests/fuzz/corpus/${name%_fuzzer}" 2>&1 | grep -v '^#[0-9]'
  rm -rf "$corpus"
done
