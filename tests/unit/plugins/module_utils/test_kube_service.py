"""kube/service.py's reads and deletes by Resource (the troubleshooting bundle's and the load Job's): the path, the query
and the timeout each sends, and a 404 on delete is no error (error paths on a fake ``request``)."""

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service


class _ApiError(Exception):
    def __init__(self, status):
        super().__init__("HTTP %d" % status)
        self.status, self.reason, self.body = status, "status %d" % status, None


class _Api:
    """The API by path: path -> object or an HTTP status to raise; records (method, path, query, timeout)."""

    def __init__(self, objects):
        self.objects, self.calls = objects, []

    def request(self, _api_client, method, path, query=None, timeout=None, **_kwargs):
        self.calls.append((method, path, {k: v for k, v in (query or {}).items() if v is not None}, timeout))
        found = self.objects.get((method, path), 404)
        if isinstance(found, int):
            raise _ApiError(found)
        return found


@pytest.fixture
def api(monkeypatch):
    fake = _Api({})
    monkeypatch.setattr(kube_client, "request", fake.request)
    monkeypatch.setattr(kube_client, "ApiException", _ApiError)
    return fake


def test_reads_by_resource_send_the_path_the_selector_and_the_timeout(api):
    service = kube_service.ClusterService("client")
    api.objects[("GET", "/api/v1/namespaces/models/events")] = {"items": [{"reason": "BackOff"}]}
    api.objects[("GET", "/api/v1/namespaces/models/serviceaccounts/default")] = {"secrets": [{"name": "tok"}]}
    api.objects[("GET", "/apis/batch/v1/namespaces/models/jobs/load")] = {"kind": "Job"}
    assert service.list(kube_service.EVENT, "models", timeout=7) == [{"reason": "BackOff"}]
    assert service.get(kube_service.SERVICE_ACCOUNT, "default", "models", timeout=7)["secrets"] == [{"name": "tok"}]
    assert kube_service.JOB.get("client", "models", "load") == {"kind": "Job"}  # kube/wait.wait_for's read
    api.objects[("GET", "/api/v1/namespaces/models/pods")] = {"items": None}
    assert service.list(kube_service.POD, "models", selector="app=x") == []  # items null: none
    assert api.calls[:3] == [("GET", "/api/v1/namespaces/models/events", {}, 7),
                             ("GET", "/api/v1/namespaces/models/serviceaccounts/default", {}, 7),
                             ("GET", "/apis/batch/v1/namespaces/models/jobs/load", {}, None)]
    assert api.calls[3][2] == {"labelSelector": "app=x"}


def test_a_missing_secret_names_itself_and_delete_of_a_gone_object_is_no_error(api):
    service = kube_service.ClusterService("client")
    with pytest.raises(ValidationError, match="Secret models/vllm-api not found"):
        service.get(kube_service.SECRET, "vllm-api", "models")
    service.delete(kube_service.JOB, "load", "models", propagation="Background")  # 404: gone already
    assert api.calls[-1] == ("DELETE", "/apis/batch/v1/namespaces/models/jobs/load", {"propagationPolicy": "Background"}, None)
    api.objects[("DELETE", "/api/v1/namespaces/models/configmaps/load")] = 403
    with pytest.raises(_ApiError) as refused:
        service.delete(kube_service.CONFIG_MAP, "load", "models")
    assert refused.value.status == 403
