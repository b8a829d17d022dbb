#!/usr/bin/env bash
# Builds the project with clang, -Wthread-safety as an error (every lock
# annotation checked) and ThreadSanitizer, then runs the unit tests and the
# communicator and reducer tests under it.
#   tests/analysis/clang_tsan.sh SOURCE_DIR BUILD_ROOT
set -euo pipefail
src=$(cd "$1" && pwd)
out="$2/clang-tsan"
# -O1 and line tables only (what TSan's reports need): the build is CI's
# largest single item, and full debug info of LibTorch's templates doubles
# its objects and links.
cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="-O1 -gline-tables-only -DNDEBUG -Wthread-safety -Werror=thread-safety -fsanitize=thread" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DDDP_ANALYSIS=ON -DDDP_TSAN=ON >/dev/null
# The two test binaries, and every object of the daemons and libddp.so
# (-Wthread-safety sees all the code: those add the etcd client, the
# election, the server and the mains), but not their links: nothing here
# runs them, and the main build links them.
objects=$(ninja -C "$out" -t inputs ddp-coordinator ddp-worker ddp-run ddp | grep '\.o$')
cmake --build "$out" --target ddp_unit_tests ddp_tsan_torch_tests $objects
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$src/tests/analysis/tsan.supp"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# First, that TSan sees through absl's locks and still catches a race.
clang++ -std=c++17 -fsanitize=thread -O1 -g "$src/tests/analysis/tsan_canary.cc" \
  "$src/tests/analysis/tsan_absl.cc" -o "$out/tsan_canary" -ldl $(pkg-config --libs absl_synchronization)
"$out/tsan_canary" locked
if "$out/tsan_canary" unlocked 2>"$out/canary.log"; then
  echo "ThreadSanitizer missed the canary's race: the set-up can't fail"; exit 1
fi
grep -q "WARNING: ThreadSanitizer: data race" "$out/canary.log"
# Not the in-process gRPC tests: with a server and its clients in one
# process, gRPC (built without TSan) hands buffers and callbacks between its
# own threads through synchronization TSan can't see, and every handover
# reads as a race inside gRPC (dozens a run). What they drive beneath gRPC
# (the Coordinator, the Outbox, the watchers' decisions) has tests of its
# own here. Nor the etcd tests: gRPC hands its own absl::Status values and
# its epoll descriptor between its threads there too (the election's locking
# is checked by -Wthread-safety above). Nor ShmSegment's and ImageDecode's: they
# fork a child (a rank to signal, a process whose peak memory is its own).
"$out/bin/ddp_unit_tests" --gtest_brief=1 \
  --gtest_filter='-CoordinatorServiceTest.*:AuthorizedServiceTest.*:CoordinatorLinkTest.*:LeaderHint.*:CoordinatorTargetsOverGrpc.*:StoreClient.*:ShmSegment.*:ImageDecode.*'
"$out/bin/ddp_tsan_torch_tests" --gtest_brief=1 --gtest_filter='*Reducer*:*Communicator*:Trainer.*'
echo "clang -Wthread-safety: clean; ThreadSanitizer: no report"
