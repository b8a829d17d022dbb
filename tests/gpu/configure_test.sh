#!/usr/bin/env bash
# What of the GPU check runs on a CPU machine: pack.sh downloads the
# packages, device_check.sh unpacks them into a private prefix and
# configures the project against them and Debian's (CPU) LibTorch, finding
# gRPC, Protobuf, Abseil, Gloo and GoogleTest in the prefix, not the system.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/ddp-gpu-configure-XXXXXX)
trap 'rm -rf "$work"' EXIT
# 77: skipped (ctest's SKIP_RETURN_CODE) when the archive can't be reached.
"$root/tests/gpu/pack.sh" || { rc=$?; [ $rc = 3 ] && exit 77; exit $rc; }
PYTHON=/usr/bin/python3 DDP_CHECK_ONLY=configure DDP_GPU_BUILD="$work/build" \
  DDP_DEPS_PREFIX="$work/deps" "$root/tests/gpu/device_check.sh" "$work/out"
/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
results = json.load(open(work + "/out/results.json"))
steps = {s["step"]: s["ok"] for s in results["steps"]}
assert steps.get("unpack") and steps.get("configure"), steps
cache = open(work + "/build/CMakeCache.txt").read()
for entry in ("gRPC_DIR:PATH=", "absl_DIR:PATH=", "Gloo_DIR:PATH=", "Protobuf_PROTOC_EXECUTABLE:FILEPATH="):
    line = next(l for l in cache.splitlines() if l.startswith(entry))
    assert line.split("=", 1)[1].startswith(work + "/deps/"), line
print("configured against the unpacked packages:", steps)
PY
