#!/usr/bin/env bash
# Speed targets, measured as ratios against a baseline in one run (not timed tests). Each script prints its
# numbers and exits non-zero when a target is missed. `hack/bench.sh verify` runs one of them (`deploy` starts a test bed).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/${VENV:-.venv}/bin:$PATH"
export PYTHONPATH="$PWD/.build/collections:$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=()
for script in tests/bench/bench_*.py; do
  name=$(basename "$script" .py); name=${name#bench_}
  if [[ $# -gt 0 && " $* " != *" $name "* ]]; then continue; fi
  printf '\n===== bench %s =====\n' "$name"
  python "$script" || failed+=("$name")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "bench: targets missed in: ${failed[*]}" >&2
  exit 1
fi
echo "bench: every target met"
