#!/usr/bin/env bash
# ansible-test sanity needs the tree at ansible_collections/alauda/spec_decoding: copy the checkout's
# files (tracked plus untracked-but-not-ignored) into a temp dir of that shape, never moving the repo.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/${VENV:-.venv}/bin:$PATH"
root=$PWD

# ansible-test bootstraps pip in each sanity venv with a get-pip script it downloads from a host this
# network cannot reach; it looks for a cached copy first. The stand-in installs pip with ensurepip (in a
# subprocess, so the machine's pip config and CA bundle still apply) and then the pinned packages.
pip_version=$(python - <<'PY'
import re, ansible_test, pathlib
src = (pathlib.Path(ansible_test.__file__).parent / "_internal/python_requirements.py").read_text()
print(re.search(r"pip='([0-9.]+)'", src).group(1))
PY
)
cache=~/.ansible/test/cache/get_pip_${pip_version//./_}.py
mkdir -p "$(dirname "$cache")"
cat > "$cache" <<'PY'
"""Offline stand-in for get-pip.py (see hack/sanity.sh)."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
PY

work=$(mktemp -d /tmp/alauda-sanity.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
dest="$work/ansible_collections/alauda/spec_decoding"
mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [[ -e $f ]] && printf '%s\0' "$f"
done | tar --null --no-recursion -T - -cf - | tar -xf - -C "$dest"
# Collections this one builds on (doc fragments, module_utils) sit beside it, as ansible-test expects.
kc=$(python -c 'import ansible_collections.kubernetes.core as m, os; print(list(m.__path__)[0])')
mkdir -p "$work/ansible_collections/kubernetes"
cp -a "$kc" "$work/ansible_collections/kubernetes/core"
cd "$dest"
# ansible-test wants a git-free tree or a real repo; a fresh repo keeps its file listing exact.
git init -q && git add -A && git -c user.email=ci@localhost -c user.name=ci commit -qm sanity
sanity() { ansible-test sanity --venv --python 3.11 --color no "$@"; }

# With arguments (one test, some paths): one run, as asked.
if [[ $# -gt 0 ]]; then
  sanity "$@"
  exit
fi

# The whole of sanity in two streams, one a core. pylint is two thirds of its CPU (about 120 of 175 s, one file set
# after another: ansible-test's contexts modules, module_utils, units, collection) and ansible-test runs one test at a
# time. Stream A: pylint over the contexts modules, module_utils and units (about 80 s); stream B: every other test,
# then pylint over the rest, ansible-test's `collection` context (about 55 + 35 s). The targets follow the contexts'
# own boundaries, so every pylint call sees the same files it sees in one run. Each stream has its own copy of the tree
# (ansible-test keeps its scratch and results under tests/output of the tree it runs in).
pylint_a=(plugins/modules/ plugins/module_utils/ tests/unit/)
mapfile -t pylint_b < <(git ls-files '*.py' | grep -v -E '^(plugins/modules|plugins/module_utils|tests/unit)/')
copy_b="$work/b/ansible_collections/alauda"
mkdir -p "$copy_b" && cp -a "$work/ansible_collections/kubernetes" "$work/b/ansible_collections/"
cp -a "$dest" "$copy_b/"
logs="$work/logs" && mkdir -p "$logs"

started=$(date +%s)
sanity --test pylint "${pylint_a[@]}" > "$logs/a" 2>&1 &
pid_a=$!
(
  cd "$copy_b/spec_decoding"
  rc=0
  sanity --skip-test pylint || rc=$?
  # ansible-test recreates a sanity venv it finds without its marker, so stream B's pylint must not start while stream
  # A is still creating the pylint venv (a cold machine): wait until A has touched the marker (it does when the venv is
  # ready, created or reused) or has ended.
  until compgen -G ~/.ansible/test/venv/sanity.pylint/3.11/'*'/marker.txt >/dev/null &&
        [[ $(stat -c %Y ~/.ansible/test/venv/sanity.pylint/3.11/*/marker.txt | sort -n | tail -1) -ge $started ]]; do
    kill -0 "$pid_a" 2>/dev/null || break
    sleep 1
  done
  sanity --test pylint "${pylint_b[@]}" || rc=$?
  exit "$rc"
) > "$logs/b" 2>&1 &
pid_b=$!

rc_a=0 rc_b=0
wait "$pid_a" || rc_a=$?
wait "$pid_b" || rc_b=$?
echo "--- sanity, stream A (pylint: ${pylint_a[*]}) ---"
cat "$logs/a"
echo "--- sanity, stream B (every other test, then pylint on the other ${#pylint_b[@]} Python files) ---"
cat "$logs/b"
if [[ $rc_a -ne 0 || $rc_b -ne 0 ]]; then
  echo "sanity: FAILED (stream A exit $rc_a, stream B exit $rc_b; their output above)" >&2
  exit 1
fi
