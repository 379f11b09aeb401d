"""The cluster-module base: the client comes from kubernetes.core's auth options, once; the collection's errors end in
fail_json with their field and fix. Modules run in-process as ansible-core's runner runs them (tests/module_run.py)."""

import contextlib
import http.server
import io
import json
import tempfile

import pytest
import yaml

from ansible.module_utils.testing import patch_module_args

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import module as kube_module
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import KubeModule
from ansible_collections.kubernetes.core.plugins.module_utils.k8s import client as k8s_client_module

from tests.loopback_http import serving
from tests.module_run import run_module


VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "gitCommit": "0", "gitTreeState": "clean", "buildDate": "2024-01-01T00:00:00Z",
           "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64"}
# What kubernetes.core's discovery reads while it builds the client: a core API without resources and no groups.
DISCOVERY = {"/api": {"kind": "APIVersions", "versions": ["v1"]}, "/apis": {"kind": "APIGroupList", "groups": []},
             "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": []}}


@pytest.fixture
def api_servers(monkeypatch, tmp_path):
    """Three loopback stand-ins for API servers; each records the Authorization header of every request it gets."""
    from kubernetes.client import Configuration  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # kubernetes.core's discovery cache goes there, not /tmp
    # A kubeconfig load sets the kubernetes library's process-wide default configuration; a module run is a process of its
    # own, these tests are not: each starts without one.
    monkeypatch.setattr(Configuration, "_default", None)
    seen = {}
    with contextlib.ExitStack() as stack:
        urls = []
        for _i in range(3):
            calls = []

            class Handler(http.server.BaseHTTPRequestHandler):
                record = calls

                def log_message(self, *args):  # pylint: disable=arguments-differ
                    pass

                def do_GET(self):  # pylint: disable=invalid-name
                    self.record.append((self.path, self.headers.get("Authorization")))
                    body = json.dumps(DISCOVERY.get(self.path, VERSION)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            url = stack.enter_context(serving(Handler))
            urls.append(url)
            seen[url] = calls
        yield urls, seen


def _kubeconfig(path, first, second):
    """Two clusters, two contexts, each with its own bearer token."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "first", "preferences": {},
        "clusters": [{"name": "one", "cluster": {"server": first}}, {"name": "two", "cluster": {"server": second}}],
        "users": [{"name": "alice", "user": {"token": "token-of-alice"}}, {"name": "bob", "user": {"token": "token-of-bob"}}],
        "contexts": [{"name": "first", "context": {"cluster": "one", "user": "alice"}},
                     {"name": "second", "context": {"cluster": "two", "user": "bob"}}],
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture
def builds(monkeypatch):
    """Counts kubernetes.core's get_api_client calls (the real function still builds the client)."""
    calls = []
    real = k8s_client_module.get_api_client

    def counting(*args, **kwargs):
        calls.append(kwargs.get("module"))
        return real(*args, **kwargs)

    monkeypatch.setattr(k8s_client_module, "get_api_client", counting)
    return calls


def _run(args, execute, **run_kwargs):
    """The JSON a KubeModule printed when it ran `execute` through run(), and the module."""
    holder = {}

    def body(module):
        holder["module"] = module
        return execute(module)

    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out):
        module = KubeModule(kube_module.argspec(kube_module.INFERENCE_SERVICE_ARG_SPEC), supports_check_mode=True)
        with pytest.raises(SystemExit):
            module.run(body, **run_kwargs)
    text = out.getvalue()
    return json.loads(text[text.index("{"):]), holder["module"]


def _ask_version(module):
    """Two reads of the module's client and one request through each."""
    from kubernetes.client import VersionApi  # pylint: disable=import-outside-toplevel
    first, second = module.api_client, module.api_client
    return {"changed": False, "same": first is second, "versions": [VersionApi(c).get_code().git_version for c in (first, second)]}


def test_client_is_built_once_from_the_kubeconfig_context(tmp_path, builds, api_servers):
    (one, two, _three), seen = api_servers
    result, module = _run({"name": "a", "namespace": "b", "kubeconfig": _kubeconfig(tmp_path / "kubeconfig", one, two), "context": "second"},
                          _ask_version)
    assert result["same"] is True and result["versions"] == ["v1.30.0", "v1.30.0"]
    assert builds == [module]
    assert seen[one] == []
    assert {auth for _path, auth in seen[two]} == {"Bearer token-of-bob"}
    assert [path for path, _auth in seen[two]].count("/version/") == 2  # the module's own two requests


def test_host_and_api_key_options_override_the_kubeconfig(tmp_path, builds, api_servers):
    (one, two, three), seen = api_servers
    result, _module = _run({"name": "a", "namespace": "b", "kubeconfig": _kubeconfig(tmp_path / "kubeconfig", one, two),
                            "host": three, "api_key": "other-token"}, _ask_version)
    assert result["versions"] == ["v1.30.0", "v1.30.0"] and len(builds) == 1
    assert seen[one] == [] and seen[two] == []
    assert {auth for _path, auth in seen[three]} == {"Bearer other-token"}


def test_a_run_that_needs_no_cluster_builds_no_client(builds):
    result, _module = _run({"name": "a", "namespace": "b"}, lambda module: {"changed": False, "seen": module.params["name"]})
    assert result["seen"] == "a" and not result.get("failed")
    assert builds == []


def test_spec_decoding_error_fails_with_its_field_and_fix(builds):
    def execute(module):
        raise ValidationError("must be at least 1, got 0", field="retries", hint="use the default (4)")

    result, _module = _run({"name": "a", "namespace": "b"}, execute)
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == "retries: must be at least 1, got 0. Fix: use the default (4)"
    assert (result["field"], result["fix"]) == ("retries", "use the default (4)")
    assert builds == []


def test_wait_timeout_returns_the_object_and_its_pods():
    isvc = {"metadata": {"name": "a", "generation": 3}, "status": {"observedGeneration": 2}}

    def execute(module):
        raise isvc_wait.WaitTimeout("InferenceService b/a not Ready at generation 3 after 5 s", isvc, [{"name": "a-pod", "phase": "Pending"}])

    result, _module = _run({"name": "a", "namespace": "b"}, execute, failed={"ready": False, "resource": {}}, timed_out={"changed": True})
    assert result["failed"] is True and result["msg"].startswith("InferenceService b/a not Ready")
    assert result["resource"] == isvc and result["pods"] == [{"name": "a-pod", "phase": "Pending"}]
    assert result["changed"] is True and result["ready"] is False


def test_a_kubeconfig_kubernetes_core_cannot_load_fails_as_in_kubernetes_core(tmp_path):
    result, _module = _run({"name": "a", "namespace": "b", "kubeconfig": str(tmp_path / "missing")}, lambda module: module.api_client)
    assert result["failed"] is True
    assert result["msg"].startswith("Could not create API client: Invalid kube-config file")


def test_unexpected_errors_carry_the_module_name_only_when_asked():
    def execute(module):
        raise RuntimeError("socket closed")

    result, _module = _run({"name": "a", "namespace": "b"}, execute, unexpected="isvc_speculative")
    assert result["failed"] is True and result["msg"] == "isvc_speculative: socket closed"
    with pytest.raises(RuntimeError, match="socket closed"):
        _run({"name": "a", "namespace": "b"}, execute)


def test_argspec_puts_kubernetes_core_auth_options_last_in_fresh_dicts():
    first = kube_module.argspec(kube_module.INFERENCE_SERVICE_ARG_SPEC, kube_module.wait_arg_spec(wait=True),
                                password=dict(type="str", no_log=True), retries=dict(type="int", default=0))
    second = kube_module.argspec(kube_module.INFERENCE_SERVICE_ARG_SPEC)
    assert list(first)[:7] == ["name", "namespace", "wait", "wait_timeout", "wait_sleep", "wait_crash_loop_restarts", "password"]
    assert first["wait"]["default"] is True and second["name"] == {"type": "str", "required": True}
    assert first["kubeconfig"] == {"type": "raw", "no_log": True} and first["password"] == {"no_log": True}
    first["name"]["required"] = False
    assert kube_module.INFERENCE_SERVICE_ARG_SPEC["name"]["required"] is True and second["name"]["required"] is True


def test_a_real_module_refuses_before_it_needs_a_cluster(builds):
    result = run_module("isvc_speculative", {"name": "llama", "namespace": "models", "state": "present"})
    assert result.failed and result["field"] == "config"
    assert result.msg == ("config: state=present needs config (a mapping or JSON string). "
                          "Fix: pass config, or restore_backup: true to roll forward from the backup")
    assert result["fix"] == "pass config, or restore_backup: true to roll forward from the backup"
    assert builds == []
