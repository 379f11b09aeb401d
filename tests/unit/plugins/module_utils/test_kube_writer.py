"""kube/writer.py (the one patch writer) and kube/service.py (the cluster service) with a real kubernetes ApiClient against
a local HTTP server that keeps one object and answers JSON patches as the API server does: a 409 for a stale
resourceVersion, a 422 for a failed ``test`` op (worded without naming the test, as some releases do)."""
import http.server
import json
import urllib.parse

import pytest

from tests.loopback_http import serving

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ConflictError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import writer
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.ssa_conflicts import ROLLBACK_FIELD_MANAGER

kubernetes = pytest.importorskip("kubernetes")

ISVC_PATH = "/apis/serving.kserve.io/v1beta1/namespaces/ns/inferenceservices/m"


def _isvc(command="vllm serve --speculative-config {}", rv="1"):
    return {"metadata": {"name": "m", "namespace": "ns", "resourceVersion": rv}, "spec": {"predictor": {"model": {"command": [command]}}}}


class _Server(http.server.BaseHTTPRequestHandler):
    objects = {}
    seen = []
    edit_before_patch = None  # another writer's change, made when the next PATCH arrives

    def log_message(self, *args):
        pass

    def _answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code, reason, message):
        self._answer(code, {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message})

    def _split(self):
        url = urllib.parse.urlsplit(self.path)
        return url.path, dict(urllib.parse.parse_qsl(url.query))

    def do_GET(self):  # noqa: N802
        path, query = self._split()
        self.seen.append(("GET", path, query, None, None))
        if path in self.objects:
            self._answer(200, self.objects[path])
        elif path + "/m" in self.objects:
            self._answer(200, {"items": [self.objects[path + "/m"]]})
        else:
            self._status(404, "NotFound", "%s not found" % path.rsplit("/", 1)[-1])

    def do_PATCH(self):  # noqa: N802
        path, query = self._split()
        ops = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("PATCH", path, query, self.headers["Content-Type"], ops))
        if type(self).edit_before_patch is not None:
            self.objects[path] = type(self).edit_before_patch(self.objects[path])
            type(self).edit_before_patch = None
        live = self.objects[path]
        for op in ops:
            if op["op"] == "test" and op["path"] == "/metadata/resourceVersion" and op["value"] != live["metadata"]["resourceVersion"]:
                return self._status(409, "Conflict", "the object has been modified")
        if not writer.tests_hold(live, ops):
            return self._status(422, "Invalid", "the server rejected our request due to an error in our request")
        after = writer.apply_patch(live, [op for op in ops if op["op"] != "test"])
        if query.get("dryRun") != "All":
            after["metadata"]["resourceVersion"] = str(int(live["metadata"]["resourceVersion"]) + 1)
            self.objects[path] = after
        return self._answer(200, after)


@pytest.fixture(name="service")
def fixture_service():
    _Server.objects = {ISVC_PATH: _isvc()}
    _Server.seen = []
    _Server.edit_before_patch = None
    with serving(_Server) as url:
        config = kubernetes.client.Configuration()
        config.host = url
        yield kube_service.ClusterService(kubernetes.client.ApiClient(config))


STRIP = [{"op": "test", "path": "/spec/predictor/model/command/0", "value": "vllm serve --speculative-config {}"},
         {"op": "replace", "path": "/spec/predictor/model/command/0", "value": "vllm serve"}]


def test_a_json_patch_goes_under_the_field_manager_and_check_mode_is_a_server_dry_run(service):
    dry = service.json_patch(kube_service.INFERENCE_SERVICE, "m", STRIP, namespace="ns", dry_run=True)
    assert dry["spec"]["predictor"]["model"]["command"] == ["vllm serve"]
    assert _Server.objects[ISVC_PATH] == _isvc()  # the dry run wrote nothing
    after = service.json_patch(kube_service.INFERENCE_SERVICE, "m", STRIP, namespace="ns")
    assert after["metadata"]["resourceVersion"] == "2" and _Server.objects[ISVC_PATH]["spec"]["predictor"]["model"]["command"] == ["vllm serve"]
    patches = [s for s in _Server.seen if s[0] == "PATCH"]
    assert [(p[1], p[2], p[3]) for p in patches] == [
        (ISVC_PATH, {"fieldManager": ROLLBACK_FIELD_MANAGER, "dryRun": "All"}, "application/json-patch+json"),
        (ISVC_PATH, {"fieldManager": ROLLBACK_FIELD_MANAGER}, "application/json-patch+json")]


def test_another_writers_edit_between_read_and_patch_is_a_patch_conflict_and_nothing_is_written(service):
    def edited(obj):
        obj = writer.apply_patch(obj, [{"op": "replace", "path": "/spec/predictor/model/command/0", "value": "vllm serve --x"}])
        obj["metadata"]["resourceVersion"] = "7"
        return obj
    _Server.edit_before_patch = edited
    with pytest.raises(writer.PatchConflict) as caught:
        service.json_patch(kube_service.INFERENCE_SERVICE, "m", STRIP, namespace="ns")
    assert isinstance(caught.value, ConflictError) and caught.value.status == 422
    assert "nothing was written" in str(caught.value) and "HTTP 422" in str(caught.value)
    assert _Server.objects[ISVC_PATH]["spec"]["predictor"]["model"]["command"] == ["vllm serve --x"]
    assert [s[0] for s in _Server.seen] == ["PATCH", "GET"]  # the fresh read judged the failed test
    # a resourceVersion guard: the API server's 409 is a conflict without a read
    _Server.seen = []
    with pytest.raises(writer.PatchConflict) as caught:
        service.json_patch(kube_service.INFERENCE_SERVICE, "m", [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}],
                           namespace="ns")
    assert caught.value.status == 409 and [s[0] for s in _Server.seen] == ["PATCH"]


def test_a_422_whose_tests_still_hold_is_the_api_error_not_a_conflict():
    class Invalid(Exception):
        status = 422
        body = '{"message": "spec.predictor: Invalid value"}'
    assert not writer.refused_by_a_test(Invalid(), STRIP, read=_isvc)
    assert writer.refused_by_a_test(Invalid(), STRIP, read=lambda: _isvc(command="edited"))
    assert not writer.refused_by_a_test(Invalid(), [{"op": "add", "path": "/a", "value": 1}], read=lambda: _isvc(command="x"))

    def gone():
        raise ValidationError("InferenceService ns/m not found", field="name")
    assert writer.refused_by_a_test(Invalid(), STRIP, read=gone)  # gone since the read: it changed


def test_reads_name_the_missing_object_and_the_custom_object_reads_answer_like_the_typed_class(service):
    assert service.get(kube_service.INFERENCE_SERVICE, "m", "ns") == _isvc()
    assert service.get(kube_service.CONFIG_MAP, "cm", "ns", missing="none") is None
    with pytest.raises(ValidationError, match="LLMInferenceService ns/x not found") as caught:
        service.get(kube_service.LLM_INFERENCE_SERVICE.at("v1alpha1"), "x", "ns")
    assert "kubectl get llminferenceservices -n ns" in str(caught.value)
    assert _Server.seen[-1][1] == "/apis/serving.kserve.io/v1alpha1/namespaces/ns/llminferenceservices/x"
    reads = service.custom_objects()
    assert reads.get_namespaced_custom_object("serving.kserve.io", "v1beta1", "ns", "inferenceservices", "m") == _isvc()
    assert reads.list_namespaced_custom_object("serving.kserve.io", "v1beta1", "ns", "inferenceservices")["items"] == [_isvc()]
    with pytest.raises(kube_client.ApiException) as caught:
        reads.get_cluster_custom_object("serving.kserve.io", "v1alpha1", "clusterservingruntimes", "rt")
    assert caught.value.status == 404
    assert _Server.seen[-1][1] == "/apis/serving.kserve.io/v1alpha1/clusterservingruntimes/rt"


def test_paths_of_core_namespaced_and_cluster_scoped_kinds():
    assert kube_service.PERSISTENT_VOLUME_CLAIM.path("p", "ns") == "/api/v1/namespaces/ns/persistentvolumeclaims/p"
    assert kube_service.DEPLOYMENT.path(None, "ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert kube_service.CLUSTER_SERVING_RUNTIME.path("rt", "ignored") == "/apis/serving.kserve.io/v1alpha1/clusterservingruntimes/rt"
    service = kube_service.ClusterService(object())
    assert kube_service.service_of(service) is service and kube_service.service_of(service.api_client).api_client is service.api_client


def test_a_module_builds_its_cluster_service_once_on_its_own_client():
    class Module:
        _cluster = None
        api_client = object()
    module = Module()
    service = kube_service.of_module(module)
    assert service is kube_service.of_module(module) and service.api_client is Module.api_client
