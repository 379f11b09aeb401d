"""tests/testbed/crds.py: the one order in which the test bed finds the KServe CRDs, and the message without any."""
import os
import subprocess
import sys
import time

import pytest

from tests.paths import REPO
from tests.testbed import crds

ENV = (crds.ENV_DIR, crds.ENV_KUBECONFIG, crds.ENV_CONTEXT, "ALAUDA_SHARED")


@pytest.fixture
def nothing(tmp_path, monkeypatch):
    """No source at all: no env vars, and a ../shared without kserve-crds."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALAUDA_SHARED", str(tmp_path / "shared"))
    return tmp_path


def crd_folder(path, names=crds.REQUIRED):
    os.makedirs(path, exist_ok=True)
    for name in names:
        with open(os.path.join(path, name), "w", encoding="utf-8") as handle:
            handle.write("kind: CustomResourceDefinition\n")
    return str(path)


def assert_names_three_ways(message):
    assert "KServe CRDs not found" in message
    assert "1. ALAUDA_KSERVE_CRDS=DIR" in message and "export-crds DIR" in message
    assert "2. ../shared/kserve-crds next to the checkout" in message
    assert "3. ALAUDA_KSERVE_CRDS_KUBECONFIG=FILE [ALAUDA_KSERVE_CRDS_CONTEXT=NAME]" in message


def test_nothing_given_names_the_three_ways(nothing):
    with pytest.raises(crds.CrdsNotFound) as err:
        crds.resolve()
    assert_names_three_ways(str(err.value))
    assert str(nothing / "shared" / "kserve-crds") in str(err.value)
    assert crds.given() is None


def test_env_dir_first_then_shared(nothing, monkeypatch):
    shared = crd_folder(nothing / "shared" / "kserve-crds")
    assert crds.resolve() == shared and crds.given() == "shared"
    mine = crd_folder(nothing / "mine")
    monkeypatch.setenv(crds.ENV_DIR, mine)
    assert crds.resolve() == mine and crds.given() == "dir"
    # a kubeconfig is only the third way: with a folder given, no cluster is contacted
    monkeypatch.setenv(crds.ENV_KUBECONFIG, str(nothing / "no-such-kubeconfig"))
    assert crds.resolve() == mine


def test_env_dir_missing_a_file_is_an_error_not_a_fall_through(nothing, monkeypatch):
    crd_folder(nothing / "shared" / "kserve-crds")
    partial = crd_folder(nothing / "partial", crds.REQUIRED[:2])
    monkeypatch.setenv(crds.ENV_DIR, partial)
    with pytest.raises(crds.CrdsNotFound) as err:
        crds.resolve()
    assert "ALAUDA_KSERVE_CRDS=%s lacks %s" % (partial, ", ".join(crds.REQUIRED[2:])) in str(err.value)
    assert_names_three_ways(str(err.value))


def test_unreadable_cluster_names_the_kubeconfig_and_the_three_ways(nothing, monkeypatch):
    kubeconfig = nothing / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    monkeypatch.setenv(crds.ENV_KUBECONFIG, str(kubeconfig))
    monkeypatch.setenv(crds.ENV_CONTEXT, "kserve-prod")
    assert crds.given() == "cluster"
    with pytest.raises(crds.CrdsNotFound) as err:
        crds.resolve()
    assert "reading them from ALAUDA_KSERVE_CRDS_KUBECONFIG=%s context kserve-prod failed" % kubeconfig in str(err.value)
    assert_names_three_ways(str(err.value))


def test_manifest_drops_what_the_server_added():
    served = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
              "metadata": {"name": "inferenceservices.serving.kserve.io", "uid": "u", "resourceVersion": "7", "generation": 1,
                           "creationTimestamp": "2026-01-01T00:00:00Z", "managedFields": [{"manager": "x"}],
                           "annotations": {"controller-gen.kubebuilder.io/version": "v0.19.0",
                                           "kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
              "spec": {"group": "serving.kserve.io", "names": {"plural": "inferenceservices"},
                       "conversion": {"strategy": "Webhook", "webhook": {"clientConfig": {"service": {"name": "kserve-webhook"}}}}},
              "status": {"conditions": [{"type": "Established", "status": "True"}]}}
    out = crds.manifest(served)
    assert out == {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                   "metadata": {"name": "inferenceservices.serving.kserve.io",
                                "annotations": {"controller-gen.kubebuilder.io/version": "v0.19.0"}},
                   "spec": {"group": "serving.kserve.io", "names": {"plural": "inferenceservices"}, "conversion": {"strategy": "None"}}}
    assert served["spec"]["conversion"]["strategy"] == "Webhook"  # the input is not changed


def test_cluster_up_check_stops_in_seconds_with_the_three_ways(tmp_path):
    """What `make cluster-up` runs first: standard library only, before set-up and the Kubernetes build."""
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    env["ALAUDA_SHARED"] = str(tmp_path / "shared")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-S", "-m", "tests.testbed.crds", "check"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and time.monotonic() - started < 10
    assert proc.stderr.startswith("cluster-up: KServe CRDs not found")
    assert_names_three_ways(proc.stderr)
    env[crds.ENV_DIR] = crd_folder(tmp_path / "crds")
    assert subprocess.run([sys.executable, "-S", "-m", "tests.testbed.crds", "check"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False).returncode == 0
