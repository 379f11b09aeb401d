"""server_side_apply's own paths without a cluster: an incomplete definition is refused by field before any client is
built, and a failure of kubernetes.core's apply carries kubernetes.core.k8s's failure keys (msg, reason, and what the
exception's result holds). Against the real API server: tests/integration/test_controller_actions.py (the apply, a
dry run, a conflict) and every deploy of the integration tier."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import apply as kube_apply
from tests.module_run import run_module

DEFINITION = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
              "metadata": {"name": "llama", "namespace": "models"}, "spec": {}}


@pytest.mark.parametrize("drop, named", [("kind", "kind"), ("apiVersion", "apiVersion"), ("metadata", "metadata.name")])
def test_an_incomplete_definition_is_refused_before_a_client_is_built(drop, named):
    definition = {k: v for k, v in DEFINITION.items() if k != drop}
    res = run_module("server_side_apply", {"definition": definition, "field_manager": "deploy",
                                           "kubeconfig": "/nonexistent/kubeconfig"})
    assert res.failed and res["field"] == "definition" and named in res.msg and "Fix:" in res.msg, res


class _ApiError(Exception):
    """The kubernetes client's ApiException as kubernetes.core chains it (its `reason` is the API server's)."""
    reason = "Conflict"


class _Failing(Exception):
    def __init__(self):
        super().__init__("Failed to apply object: b'{\"reason\":\"Conflict\"}'")
        self.result = {"status": 409}


class _Module:
    def __init__(self):
        self.params = {"definition": DEFINITION, "field_manager": "deploy", "force_conflicts": False}
        self.check_mode, self._diff, self.failed = True, False, None

    def warn(self, text):
        raise AssertionError(text)

    def fail_json(self, **kwargs):
        self.failed = kwargs
        raise SystemExit(1)


def test_a_failed_apply_fails_with_kubernetes_cores_keys(monkeypatch):
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s import runner  # pylint: disable=import-outside-toplevel
    seen = {}

    def perform_action(svc, definition, params):
        seen.update(params=params, dry_run=svc.client.dry_run, definition=definition)
        raise _Failing() from _ApiError()

    monkeypatch.setattr(runner, "perform_action", perform_action)
    module = _Module()
    with pytest.raises(SystemExit):
        kube_apply.server_side_apply(module, k8s_client=SimpleNamespace(dry_run=False))
    assert module.failed == {"status": 409, "reason": "Conflict", "msg": "Failed to apply object: b'{\"reason\":\"Conflict\"}'"}
    # kubernetes.core.k8s's parameters for apply + server_side_apply, and check mode as a server-side dry run
    assert seen["params"]["apply"] is True and seen["params"]["state"] == "present"
    assert seen["params"]["server_side_apply"] == {"field_manager": "deploy", "force_conflicts": False}
    assert seen["dry_run"] is True and seen["definition"] == DEFINITION and seen["definition"] is not DEFINITION


class _NotFound(Exception):
    """The kubernetes client's ApiException for an apply into a namespace that does not exist (kube-apiserver's Status body)."""
    status, reason = 404, "Not Found"
    body = (b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces \\"models\\" not found",'
            b'"reason":"NotFound","details":{"name":"models","kind":"namespaces"},"code":404}')


class _ObjectNotFound(_NotFound):
    body = (b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"inferenceservices.serving.kserve.io \\"llama\\" not found",'
            b'"reason":"NotFound","details":{"name":"llama","group":"serving.kserve.io","kind":"inferenceservices"},"code":404}')


def _fail_with(monkeypatch, cause):
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s import runner  # pylint: disable=import-outside-toplevel

    def perform_action(svc, definition, params):  # pylint: disable=unused-argument
        raise Exception("Failed to apply object: %s" % cause.body) from cause  # pylint: disable=broad-exception-raised

    monkeypatch.setattr(runner, "perform_action", perform_action)
    module = _Module()
    with pytest.raises(SystemExit):
        kube_apply.server_side_apply(module, k8s_client=SimpleNamespace(dry_run=False))
    return module.failed


def test_a_missing_namespace_is_one_line_with_the_fix(monkeypatch):
    failed = _fail_with(monkeypatch, _NotFound())
    assert failed["missing_namespace"] == "models" and failed["reason"] == "Not Found"
    assert failed["msg"] == ("Namespace models does not exist, so InferenceService llama was not applied (nothing was written). "
                             "Fix: create it (kubectl create namespace models) or apply into an existing namespace."), failed
    # any other 404 keeps kubernetes.core's message
    other = _fail_with(monkeypatch, _ObjectNotFound())
    assert "missing_namespace" not in other and other["msg"].startswith("Failed to apply object: b'{\"kind\":\"Status\""), other
