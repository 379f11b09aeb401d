#!/usr/bin/env bash
# Build the collection tarball and prove it installs offline (no Galaxy) and its docs render from it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/${VENV:-.venv}/bin:$PATH"
out=$(mktemp -d /tmp/alauda-build.XXXXXX)
trap 'rm -rf "$out"' EXIT
ansible-galaxy collection build --output-path "$out" --force . >/dev/null
tarball=$(ls "$out"/alauda-spec_decoding-*.tar.gz)
echo "build: $(basename "$tarball") $(du -h "$tarball" | cut -f1)"
# --no-deps: kubernetes.core comes from the `ansible` package; --offline: never contact a server.
ansible-galaxy collection install --offline --no-deps -p "$out/installed" "$tarball" >/dev/null
printf '[defaults]\n' > "$out/ansible.cfg"
ANSIBLE_COLLECTIONS_PATH="$out/installed" ANSIBLE_CONFIG="$out/ansible.cfg" \
  ansible-doc -t module alauda.spec_decoding.speculative_config >/dev/null
if tar -tzf "$tarball" | grep -E '(^|/)(tests/output|\.venv|\.build|__pycache__)/' ; then
  echo "build: the tarball carries build or cache files listed above; extend build_ignore in galaxy.yml" >&2
  exit 1
fi
echo "build: installed offline from the tarball and ansible-doc rendered from it"
