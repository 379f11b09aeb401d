"""A redeploy refuses fields another field manager took, names that manager, writes nothing; force takes them over.

What makes a server-side apply conflict (measured on this kube-apiserver 1.20.2 with the KServe CRD): an apply
conflicts only with the managers that *own* a field it sets to a different value. A foreign apply with
``force: false`` of a field the deploy owns is therefore refused to the foreign manager itself (HTTP 409 naming
``alauda-spec-decoding``); nothing changes hands and the deploy's next apply has nothing to conflict with, which is
all a plain second apply ever shows. A foreign manager owns the field after an Update (``kubectl edit``/``patch``,
any client's PUT or merge patch) or after its own apply with ``force: true``; then the deploy's apply conflicts
with it. The foreign edits below are one of each, done with the ``kubernetes`` client (the test bed's stand-ins
stay out of ``spec``), and ownership is read from the object's managedFields.

Before this test the deploy had never applied at all: ``kubernetes.core.k8s`` ignores ``server_side_apply`` unless
``apply: true`` is set, so it created the object and merge-patched it as ``OpenAPI-Generator`` (Update operations,
which never conflict): a foreign edit was silently overwritten. The first assertion on managedFields catches that.
"""
from __future__ import annotations

import time

import pytest

from tests.ansible_run import run_playbook
from tests.integration.test_deploy import _get, _script, _vars

DEPLOY_MANAGER = "alauda-spec-decoding"
COMMAND = ("f:spec", "f:predictor", "f:model", "f:command")
MAX_REPLICAS = ("f:spec", "f:predictor", "f:maxReplicas")


def _owners(isvc, path):
    """Managers whose managedFields entry holds ``path``."""
    out = []
    for entry in isvc["metadata"].get("managedFields") or []:
        node = entry.get("fieldsV1") or {}
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            out.append(entry["manager"])
    return out


def _settled(k8s_client, namespace, name, timeout=30.0):
    """The object once the KServe stand-in has written the status for its generation (no write for a second)."""
    deadline = time.monotonic() + timeout
    seen = None  # resourceVersion of the last read that had observed its generation
    while True:
        isvc = _get(k8s_client, namespace, name)
        observed = (isvc.get("status") or {}).get("observedGeneration") == isvc["metadata"]["generation"]
        if observed and seen == isvc["metadata"]["resourceVersion"]:
            return isvc
        seen = isvc["metadata"]["resourceVersion"] if observed else None
        if time.monotonic() > deadline:
            raise AssertionError("%s/%s did not settle: %s" % (namespace, name, isvc))
        time.sleep(1.0)


def test_foreign_edits_are_refused_by_name_unwritten_and_taken_over_with_force(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    from kubernetes.client.rest import ApiException  # pylint: disable=import-outside-toplevel
    from kubernetes.dynamic import DynamicClient  # pylint: disable=import-outside-toplevel

    name = "llama-foreign"
    kserve.set_behaviour(namespace, name, ready_after=0.5)
    deploy_vars = _vars(namespace, name)
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig, extra_vars=deploy_vars)
    assert run.rc == 0, run.output
    deployed = _settled(k8s_client, namespace, name)
    command = deployed["spec"]["predictor"]["model"]["command"]
    max_replicas = deployed["spec"]["predictor"]["maxReplicas"]
    assert _owners(deployed, COMMAND) == [DEPLOY_MANAGER] and _owners(deployed, MAX_REPLICAS) == [DEPLOY_MANAGER]

    isvcs = DynamicClient(k8s_client).resources.get(api_version="serving.kserve.io/v1beta1", kind="InferenceService")
    edited_command = command[:-1] + [command[-1] + " --max-model-len 4096"]
    gitops = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
              "spec": {"predictor": {"model": {"command": edited_command}}}}
    # A second manager's apply with force: false is refused to that manager, naming the deploy's; nothing changes hands.
    with pytest.raises(ApiException) as refused:
        isvcs.server_side_apply(body=gitops, namespace=namespace, field_manager="gitops-controller", force_conflicts=False)
    assert refused.value.status == 409, refused.value.body
    assert 'conflict with \\"%s\\"' % DEPLOY_MANAGER in refused.value.body and ".spec.predictor.model.command" in refused.value.body
    assert _owners(_get(k8s_client, namespace, name), COMMAND) == [DEPLOY_MANAGER]
    # With force: true it takes the command; an Update (what kubectl edit sends) takes maxReplicas.
    isvcs.server_side_apply(body=gitops, namespace=namespace, field_manager="gitops-controller", force_conflicts=True)
    isvcs.patch(body={"spec": {"predictor": {"maxReplicas": max_replicas + 2}}}, name=name, namespace=namespace,
                content_type="application/merge-patch+json", field_manager="kubectl-edit")
    edited = _settled(k8s_client, namespace, name)
    assert _owners(edited, COMMAND) == ["gitops-controller"] and _owners(edited, MAX_REPLICAS) == ["kubectl-edit"]

    # The redeploy is refused, naming both managers, and writes nothing.
    again = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig, extra_vars=deploy_vars)
    assert again.rc != 0, again.output
    msg = again.result("Refuse to overwrite fields")["msg"]
    assert "field manager(s) gitops-controller, kubectl-edit since the last deploy" in msg, msg
    assert "nothing was written" in msg and "spec_decoding_force_conflicts=true" in msg
    after = _get(k8s_client, namespace, name)
    assert after["metadata"]["resourceVersion"] == edited["metadata"]["resourceVersion"]
    assert after["spec"] == edited["spec"] and after["metadata"]["managedFields"] == edited["metadata"]["managedFields"]

    # spec_decoding_force_conflicts: true takes both fields back: the deploy's values, owned by the deploy's manager.
    forced = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", kubeconfig=kubeconfig,
                          extra_vars=dict(deploy_vars, spec_decoding_force_conflicts=True))
    assert forced.rc == 0, forced.output
    taken = _settled(k8s_client, namespace, name)
    assert _script(taken) == _script(deployed) and taken["spec"]["predictor"]["maxReplicas"] == max_replicas
    assert _owners(taken, COMMAND) == [DEPLOY_MANAGER] and _owners(taken, MAX_REPLICAS) == [DEPLOY_MANAGER]
