#!/usr/bin/env bash
# Create the virtualenv, install the pinned toolchain, and link this checkout as the collection
# alauda.spec_decoding so ansible-playbook, ansible-doc and pytest find it without an install step.
# Idempotent: a rerun with unchanged requirements takes well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${VENV:-.venv}
python=${PYTHON:-python3}

# Several shells (developers, helper sessions, CI) may run this at once: serialise on a lock.
mkdir -p .build
exec 9>.build/setup.lock
flock 9

stamp="$venv/.requirements.sha256"
want=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)
if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup: creating virtualenv $venv with $($python --version 2>&1)"
  "$python" -m venv "$venv"
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "setup: installing requirements-dev.txt into $venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  if ! "$venv/bin/python" -m pip install --quiet -r requirements-dev.txt 2> >(grep -v "^WARNING: Location" >&2); then
    echo "setup: pip could not install requirements-dev.txt (see the error above); fix the package index access and rerun" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

# The collection is found through ansible.cfg's collections_path.
link_dir=.build/collections/ansible_collections/alauda
mkdir -p "$link_dir"
if [[ "$(readlink "$link_dir/spec_decoding" 2>/dev/null)" != "$root" ]]; then
  ln -sfn "$root" "$link_dir/spec_decoding"
fi
