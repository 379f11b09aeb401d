"""The process-mode kubelet's pure parts (tests/testbed/pod_sandbox.py): `$(VAR)` expansion pinned to Kubernetes' own
test vectors (tests/fixtures/kubernetes/expansion.json), and the container environment built from a pod spec."""
import json
import os

import pytest

from tests.paths import REPO
from tests.testbed import pod_sandbox

with open(os.path.join(REPO, "tests", "fixtures", "kubernetes", "expansion.json"), encoding="utf-8") as _fh:
    VECTORS = json.load(_fh)


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_expand_matches_kubernetes(case):
    assert pod_sandbox.expand(case["input"], VECTORS["context"]) == case["expected"]


def test_env_values_see_the_variables_defined_before_them():
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"nodeName": "n"}}
    container = {"name": "c", "env": [{"name": n, "value": v} for n, v in VECTORS["map_reference"]["env"]]}
    assert pod_sandbox.container_env(pod, container, "198.18.0.1", lambda *a: None) == VECTORS["map_reference"]["expected"]


def test_env_from_field_refs_config_maps_and_args():
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "x"}}, "spec": {"nodeName": "n"}}
    objects = {("configmaps", "ns", "cfg"): {"data": {"MODEL": "/mnt/models", "K": "3"}}}
    container = {"name": "c", "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
                 "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                         {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "K"}}},
                         {"name": "FLAGS", "value": "--model $(CFG_MODEL) -k $(K) $(MISSING)"}],
                 "command": ["vllm", "serve", "$(CFG_MODEL)"], "args": ["$(FLAGS)", "$$(K)"]}
    env = pod_sandbox.container_env(pod, container, "198.18.0.9", lambda kind, ns, name: objects.get((kind, ns, name)))
    assert env == {"CFG_MODEL": "/mnt/models", "CFG_K": "3", "IP": "198.18.0.9", "APP": "x", "K": "3",
                   "FLAGS": "--model /mnt/models -k 3 $(MISSING)"}
    assert pod_sandbox.container_argv(container, env) == ["vllm", "serve", "/mnt/models",
                                                          "--model /mnt/models -k 3 $(MISSING)", "$(K)"]
    with pytest.raises(pod_sandbox.PodConfigError, match="configmaps 'gone' not found"):
        pod_sandbox.container_env(pod, {"name": "c", "envFrom": [{"configMapRef": {"name": "gone"}}]}, "", lambda *a: None)


def test_termination_message_file_then_log_tail_as_the_kubelet(tmp_path):
    path = tmp_path / "termination-log"
    path.write_text("x" * 5000)
    assert pod_sandbox.termination_message(str(path), "File", 1, ["ignored"]) == "x" * 4096
    path.write_text("")
    lines = ["line %d" % i for i in range(100)]
    assert pod_sandbox.termination_message(str(path), "File", 1, lines) == ""
    assert pod_sandbox.termination_message(str(path), "FallbackToLogsOnError", 0, lines) == ""  # only on failure
    tail = pod_sandbox.termination_message(str(path), "FallbackToLogsOnError", 2, lines)
    assert tail == "".join("line %d\n" % i for i in range(20, 100))  # the last 80 lines
    long = ["y" * 100] * 50
    assert len(pod_sandbox.termination_message(str(path), "FallbackToLogsOnError", 2, long).encode()) == 2048
    assert pod_sandbox.termination_message(str(tmp_path / "missing"), "FallbackToLogsOnError", 2, ["boom"]) == "boom\n"
