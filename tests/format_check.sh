#!/usr/bin/env bash
# The C++ sources follow .clang-format (fix with: clang-format -i FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "clang-format is not installed"; exit 1; }
bad=0
for f in $(git ls-files '*.cc' '*.h' 2>/dev/null || find common coordinator worker deploy tests -name '*.cc' -o -name '*.h'); do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f"
    bad=1
  fi
done
exit $bad
