"""The GitOps stand-ins' pure rules (tests/testbed/argocd_standin.py, flux_standin.py, gitops_standin.py), pinned to the
forms Argo CD and Flux document; the controllers themselves run in tests/integration/test_gitops_standins.py."""
import pytest

from tests.testbed.argocd_standin import automated_policy, tracking_id
from tests.testbed.flux_standin import artifact_revision, inventory_id, revision_sha
from tests.testbed.gitops_standin import differences, parse_duration

SHA = "0123456789abcdef0123456789abcdef01234567"
ISVC = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "llm", "namespace": "ml"}}
CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}}


@pytest.mark.parametrize("text,seconds", [("1s", 1.0), ("500ms", 0.5), ("1m30s", 90.0), ("2h", 7200.0), ("", 60.0),
                                          ("10", 60.0), ("1x", 60.0)])
def test_parse_duration_go_forms(text, seconds):
    assert parse_duration(text, 60.0) == seconds


@pytest.mark.parametrize("ref,revision", [({"branch": "main"}, f"main@sha1:{SHA}"), ({}, f"master@sha1:{SHA}"),
                                          ({"tag": "v1.0.0"}, f"v1.0.0@sha1:{SHA}"), ({"commit": SHA}, f"sha1:{SHA}"),
                                          ({"branch": "main", "commit": SHA}, f"main@sha1:{SHA}"),
                                          ({"name": "refs/heads/dev"}, f"refs/heads/dev@sha1:{SHA}")])
def test_flux_artifact_revision_forms(ref, revision):
    assert artifact_revision(ref, SHA) == revision
    assert revision_sha(revision) == SHA


def test_flux_inventory_id():
    assert inventory_id(ISVC) == "ml_llm_serving.kserve.io_InferenceService"
    assert inventory_id(CM) == "ml_c__ConfigMap"


def test_argocd_tracking_id_forms():
    assert tracking_id("app", "argocd", "argocd", ISVC) == "app:serving.kserve.io/InferenceService:ml/llm"
    assert tracking_id("app", "team", "argocd", CM) == "team_app:/ConfigMap:ml/c"
    assert tracking_id("app", "argocd", "argocd", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}) == \
        "app:/Namespace:/ml"


@pytest.mark.parametrize("policy,expected", [(None, (False, False, False)), ({}, (True, False, False)),
                                             ({"selfHeal": True, "prune": True}, (True, True, True)),
                                             ({"enabled": False, "selfHeal": True}, (False, False, False)),
                                             ({"enabled": True, "selfHeal": True}, (True, True, False))])
def test_argocd_automated_policy(policy, expected):
    app = {"spec": {"syncPolicy": {} if policy is None else {"automated": policy}}}
    assert automated_policy(app) == expected


def test_differences_compare_only_rendered_fields():
    desired = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}, "status": {"x": 1}}
    live = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "uid": "u", "managedFields": []},
            "data": {"a": "1", "extra": "kept"}}
    assert not differences(desired, live)
    assert differences(desired, dict(live, data={"a": "2"})) == [".data.a"]
    args = {"spec": {"args": ["--a", "--b"]}}
    assert differences(args, {"spec": {"args": ["--a"]}}) == [".spec.args"]
    assert differences(args, {"spec": {"args": ["--a", "--c"]}}) == [".spec.args[1]"]
