"""Air gap (issue 10): with `spec_decoding_air_gapped: true` a full deploy + verify inside a network namespace that
has only loopback (the test bed API server and a loopback registry live in it too) makes no connection attempt to
anything but loopback or a unix socket, proven with `strace -f -e trace=connect` on every ansible-playbook process;
a step that needs an unreachable host fails fast with a clear message; and an air-gapped inventory whose sources
are on the internet fails before anything is written, naming the field and the fix."""
from __future__ import annotations

import json
import os
import types

import pytest

from tests.ansible_run import DID_NOT_FAIL, PlaybookRun, run_cases, run_playbook
from tests.integration.test_deploy import _get, _vars, engine_log
from tests.testbed import airgap
from tests.testbed.fixtures import module_namespace
from tests.testbed.registry import ensure_tools

NAME = "llama-eagle3"


def _model_dirs(tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    for directory, name in ((target, "model.safetensors"), (draft, "draft.safetensors")):
        directory.mkdir()
        (directory / name).write_bytes(name.encode() * 2048)
        (directory / "config.json").write_text(json.dumps({"name": name}))
    return str(target), str(draft)


def _run(step):
    """A netns step result as a PlaybookRun (per-task results from the json callback)."""
    return PlaybookRun(types.SimpleNamespace(returncode=step["rc"] if isinstance(step["rc"], int) else -1,
                                             stdout=step["stdout"], stderr=step["stderr"]))


def _task_seconds(step, name_fragment):
    """Wall time of the last task named like `name_fragment` (the json callback's duration)."""
    found = [(start, end) for _play, tasks in _run(step).timeline for name, start, end, _hosts in tasks if name_fragment in name]
    assert found, "no task %r ran" % name_fragment
    start, end = found[-1]
    return end - start


def _report(step):
    local = [c for c in step["connects"] if airgap.is_local(c)]
    dests = sorted({airgap.destination(c) for c in step["connects"]})
    print("%s: rc=%s in %.1f s, %d connect() calls (%d loopback/unix), destinations: %s"
          % (step["name"], step["rc"], step["seconds"], len(step["connects"]), len(local), ", ".join(dests)))


def test_air_gapped_deploy_and_verify_only_touch_loopback(tmp_path, k8s_binaries, kserve_crd_dir):
    ensure_tools(extra={"strace": "strace", "ip": "iproute2", "unshare": "util-linux"})
    target, draft = _model_dirs(tmp_path)
    log_file = tmp_path / "engine.log"
    log_file.write_text(engine_log("/mnt/models/target", "/mnt/models/draft"))
    namespace = "airgap"
    deploy_vars = _vars(namespace, NAME, spec_decoding_verify=True, spec_decoding_air_gapped=True,
                        spec_decoding_artifact_mode="modelcar",
                        spec_decoding_artifacts={"modelcar_image": "@REGISTRY@/models/llama-eagle3:v1"},
                        spec_decoding_modelcar_build={"target_dir": target, "draft_dir": draft, "tls_verify": False})
    unreachable = _vars(namespace, "unreachable", spec_decoding_air_gapped=True, spec_decoding_artifact_mode="modelcar",
                        spec_decoding_artifacts={"modelcar_image": "registry.internal.example:5000/models/llama-eagle3:v1"},
                        spec_decoding_modelcar_build={"target_dir": target, "draft_dir": draft, "tls_verify": False})
    spec = {
        "bin_dir": k8s_binaries, "crd_dir": kserve_crd_dir, "workdir": str(tmp_path / "netns"), "registry": True,
        "namespace": namespace, "behaviours": [{"name": NAME, "ready_after": 0.5, "log_file": str(log_file)}],
        "steps": [
            {"name": "deploy", "playbook": "playbooks/deploy-eagle3.yml", "extra_vars": deploy_vars},
            {"name": "verify", "playbook": "playbooks/verify.yml",
             "extra_vars": {"verify_name": NAME, "verify_namespace": namespace, "verify_wait_timeout": 60, "verify_wait_interval": 1,
                            "spec_decoding_air_gapped": True}},
            {"name": "unreachable-registry", "playbook": "playbooks/deploy-eagle3.yml", "extra_vars": unreachable, "timeout": 900},
        ],
    }
    result = airgap.run_in_netns(spec)
    assert result["interfaces"] == ["lo"], result["interfaces"]
    steps = {s["name"]: s for s in result["steps"]}
    for step in result["steps"]:
        _report(step)

    deploy, verify = steps["deploy"], steps["verify"]
    for step in (deploy, verify):
        run = _run(step)
        assert step["rc"] == 0, run.output
        assert step["connects"], "strace saw no connect() at all: the trace is not working"
        outside = [c for c in step["connects"] if not airgap.is_local(c)]
        assert not outside, "%s tried to reach %s" % (step["name"], sorted({airgap.destination(c) for c in outside}))
    registry_port = int(result["registry"].rsplit(":", 1)[1])
    ports = {c["port"] for c in deploy["connects"] if c["family"] in ("AF_INET", "AF_INET6")}
    assert registry_port in ports, "the deploy never talked to the loopback registry: %s" % ports
    pushed = _run(deploy).result("Build and push the Modelcar image")
    assert pushed["changed"] is True and pushed["layers_pushed"] >= 2
    assert "models/llama-eagle3" in result["registry_catalog"]["repositories"]
    engine = _run(deploy).result("engine-config line")
    assert engine["speculative_config"] == {"method": "eagle3", "model": "/mnt/models/draft", "num_spec_tokens": 3}
    checked = _run(verify).result("Check the engine-config line")
    assert checked["speculative_config"]["method"] == "eagle3" and [p["found"] for p in checked["pods"]] == [True]
    assert NAME in result["inferenceservices"]

    # A step that needs a host the namespace cannot reach fails fast with a message naming it, and writes nothing.
    down = steps["unreachable-registry"]
    assert down["rc"] not in (0, "timeout"), "rc %s after %s s: %s" % (down["rc"], down["seconds"], _run(down).output)
    failed = _run(down).failed[-1]
    assert "registry.internal.example" in failed["msg"] and "Fix:" in failed["msg"], failed["msg"]
    took = _task_seconds(down, "Build and push the Modelcar image")
    print("unreachable registry: the push task failed after %.1f s: %s" % (took, failed["msg"]))
    assert took < 90, took
    assert "unreachable" not in result["inferenceservices"]


EARLY = [
    ("hf-storage-uris", {"spec_decoding_artifact_mode": "storage_uris",
                         "spec_decoding_artifacts": {"target_uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                                                     "draft_uri": "pvc://models/eagle3"}},
     "artifacts.target_uri", "hf://"),
    ("huggingface-url", {"spec_decoding_artifact_mode": "storage_uris",
                         "spec_decoding_artifacts": {"target_uri": "pvc://models/llama",
                                                     "draft_uri": "https://huggingface.co/yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}},
     "artifacts.draft_uri", "huggingface.co"),
    ("public-hf-endpoint", {"spec_decoding_env": {"HF_ENDPOINT": "https://huggingface.co"}}, "env.HF_ENDPOINT", "HF_ENDPOINT"),
    ("docker-hub-image", {"spec_decoding_artifact_mode": "modelcar",
                          "spec_decoding_artifacts": {"modelcar_image": "docker.io/acme/llama-eagle3:v1"}},
     "artifacts.modelcar_image", "docker.io"),
    ("quay-image-with-build", {"spec_decoding_artifact_mode": "modelcar",
                               "spec_decoding_artifacts": {"modelcar_image": "quay.io/acme/llama-eagle3:v1"},
                               "spec_decoding_modelcar_build": {"target_dir": "/nonexistent/target", "draft_dir": "/nonexistent/draft"}},
     "artifacts.modelcar_image", "quay.io"),
    ("image-without-registry", {"spec_decoding_artifact_mode": "modelcar",
                                "spec_decoding_artifacts": {"modelcar_image": "acme/llama-eagle3:v1"}},
     "artifacts.modelcar_image", "Docker Hub"),
    ("oci-on-ghcr", {"spec_decoding_artifact_mode": "storage_uris",
                     "spec_decoding_artifacts": {"target_uri": "oci://ghcr.io/acme/llama:v1", "draft_uri": "oci://ghcr.io/acme/eagle3:v1"}},
     "artifacts.target_uri", "ghcr.io"),
    ("hf-staging-without-mirror", {"spec_decoding_stage_pvc": True,
                                   "spec_decoding_stage_pvc_items": [{"name": "target", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
                                                                     {"name": "draft", "source": "/srv/models/eagle3"}]},
     "stage_pvc_items[0].source", "stage_pvc_hf_endpoint"),
]


@pytest.fixture(scope="module")
def early_runs(tmp_path_factory, kubeconfig, controlplane):
    """Every EARLY case in one ansible-playbook run (a block/rescue per case, the role included as deploy-eagle3.yml
    does), in a namespace of its own: (run, {case: {msg, task}}, namespace)."""
    with module_namespace(controlplane, "airgap-early") as namespace:
        cases = [(cid, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"},
                        "vars": dict(_vars(namespace, "airgap-bad-%d" % index, spec_decoding_air_gapped=True, **overrides),
                                     inference_service_method="eagle3")})
                 for index, (cid, overrides, _field, _mentions) in enumerate(EARLY)]
        run, results = run_cases(tmp_path_factory.mktemp("airgap-early"), cases, kubeconfig=kubeconfig)
        yield run, results, namespace


@pytest.mark.parametrize("index,overrides,field,mentions", [(i,) + c[1:] for i, c in enumerate(EARLY)], ids=[c[0] for c in EARLY])
def test_air_gapped_inventory_with_internet_sources_fails_before_any_write(early_runs, k8s_client, index, overrides, field,  # pylint: disable=unused-argument
                                                                           mentions):
    run, results, namespace = early_runs
    cid = EARLY[index][0]
    assert results[cid]["msg"] != DID_NOT_FAIL, run.output
    # the very first task refuses: nothing was read from or written to the cluster or a registry before it
    ran = [name for name in run.case_tasks(cid) if "Validating arguments against arg spec" not in name]
    assert ran == ["Refuse sources that need the internet (air-gapped inventory), before anything is read or written"], run.output
    msg = results[cid]["msg"]
    assert msg.startswith(field + ":") or (" | " + field + ":") in msg, msg
    assert "air_gapped" in msg and "Fix:" in msg and mentions in msg, msg
    assert _get(k8s_client, namespace, "airgap-bad-%d" % index) is None


def test_air_gapped_gitops_render_writes_no_file_and_connected_inventory_is_not_checked(tmp_path):
    out = tmp_path / "gitops"
    hub = {"spec_decoding_target": "gitops", "spec_decoding_gitops_dir": str(out), "spec_decoding_hosts": "localhost",
           "spec_decoding_namespace": "models", "spec_decoding_isvc_name": NAME, "spec_decoding_artifact_mode": "storage_uris",
           "spec_decoding_artifacts": {"target_uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                                       "draft_uri": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}
    refused = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=dict(hub, spec_decoding_air_gapped=True))
    assert refused.rc != 0
    msg = refused.failed[-1]["msg"]
    assert "artifacts.target_uri:" in msg and "artifacts.draft_uri:" in msg and msg.count("Fix:") == 2, msg
    assert not out.exists() or not os.listdir(out)
    # the same inventory without the flag is a connected one: hub URIs render as they are
    rendered = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=hub)
    assert rendered.rc == 0, rendered.output
    assert any("hf://meta-llama/Llama-3.1-8B-Instruct" in p.read_text() for p in out.iterdir())


def test_strace_connect_parser_classifies_destinations():
    text = "\n".join([
        '101 connect(3, {sa_family=AF_INET, sin_port=htons(6443), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
        '101 connect(4, {sa_family=AF_UNIX, sun_path="/run/nscd/socket"}, 110) = -1 ENOENT (No such file or directory)',
        '102 connect(5, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::1", &sin6_addr), '
        'sin6_scope_id=0}, 28) = 0',
        '103 connect(6, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.2")}, 16) = -1 ENETUNREACH (Network is unreachable)',
        '104 connect(7, {sa_family=AF_UNSPEC, sa_data="\\0\\0\\0\\0"}, 16) = 0',
    ])
    connects = airgap.parse_connects(text)
    assert [airgap.destination(c) for c in connects] == ["127.0.0.1:6443", "unix:/run/nscd/socket", "::1:443", "10.0.0.2:53", "AF_UNSPEC"]
    assert [airgap.is_local(c) for c in connects] == [True, True, True, False, True]
    assert connects[3]["result"] == "ENETUNREACH"
