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
trap 'rm -rf "$work"' EXIT
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
ansible-test sanity --venv --python 3.11 --color no "$@"
