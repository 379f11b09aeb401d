"""Many InferenceServices (one inventory host each) roll out in batches (`serial`, default 1;
`-e spec_decoding_serial=N`) with `max_fail_percentage: 0`: the first failure stops the rollout, and hosts of
later batches are never written to the API server.

The playbooks' `serial` is a play keyword, templated before any host exists: it sees extra vars (`-e`), not
inventory or group variables.
"""
from __future__ import annotations

import json
import sys

import pytest
import yaml

from tests.ansible_run import run_playbook
from tests.integration.test_deploy import BASE_VARS, _get


def _inventory(tmp_path, hosts, host_vars=None):
    """An inventory whose group spec_decoding_targets holds `hosts` (the playbooks' default hosts pattern)."""
    host_vars = host_vars or {}
    entries = {h: dict({"ansible_connection": "local", "ansible_python_interpreter": sys.executable}, **host_vars.get(h, {}))
               for h in hosts}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"spec_decoding_targets": {"hosts": entries}}}}))
    return str(path)


def _extra(namespace, **more):
    out = {k: v for k, v in BASE_VARS.items() if k != "spec_decoding_hosts"}  # the inventory's group, not localhost
    out.update(spec_decoding_namespace=namespace, spec_decoding_wait_timeout=8)
    out.update(more)
    return out


def _batches(run):
    """The hosts of each batch, in order: the json callback reports every serial batch as a play of its own."""
    plays = json.loads(run.stdout)["plays"]
    return [sorted({h for t in p["tasks"] for h in t["hosts"]}) for p in plays]


def _host_results(run, host):
    return [(name, res) for name, h, res in run.tasks if h == host]


def _ready_at_generation(isvc):
    ready = [c for c in isvc.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    return bool(ready) and ready[0]["status"] == "True" and isvc["status"].get("observedGeneration") == isvc["metadata"]["generation"]


@pytest.mark.parametrize("failure", ["never_ready", "invalid"])
def test_serial_rollout_stops_at_the_first_failure(tmp_path, kubeconfig, k8s_client, kserve, namespace, failure):
    hosts = ["llama-1", "llama-2", "llama-3"]
    kserve.set_behaviour(namespace, "llama-1-eagle3", ready_after=0.5)
    kserve.set_behaviour(namespace, "llama-2-eagle3", never_ready=True)
    kserve.set_behaviour(namespace, "llama-3-eagle3", ready_after=0.5)
    # "invalid": the second model asks for a speculative config vLLM would reject.
    bad = {"llama-2": {"spec_decoding_speculative": {"num_speculative_tokens": 0}}} if failure == "invalid" else {}
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=_extra(namespace), kubeconfig=kubeconfig,
                       inventory=_inventory(tmp_path, hosts, bad), timeout=900)
    assert run.rc != 0, run.output
    assert _batches(run) == [["llama-1"], ["llama-2"]], run.output

    # The first InferenceService is applied and Ready at its generation.
    first = _get(k8s_client, namespace, "llama-1-eagle3")
    assert first is not None and _ready_at_generation(first), first.get("status")
    assert not [n for n, res in _host_results(run, "llama-1") if res.get("failed")]

    # The second fails with a message that names what is wrong.
    failed = [(n, res) for n, res in _host_results(run, "llama-2") if res.get("failed")]
    assert len(failed) == 1, failed
    name, res = failed[0]
    second = _get(k8s_client, namespace, "llama-2-eagle3")
    if failure == "never_ready":
        assert "Wait for Ready" in name and res["ready"] is False
        assert "llama-2-eagle3" in res["msg"] and "conditions" in res["msg"] and "predictor pods" in res["msg"], res["msg"]
        assert second is not None and not _ready_at_generation(second)
    else:
        assert "Render the InferenceService" in name
        assert res["msg"].startswith("speculative.num_speculative_tokens") and "Fix:" in res["msg"], res["msg"]
        assert second is None

    # The third was never touched: no task ran for it and nothing exists on the API server.
    assert _host_results(run, "llama-3") == []
    assert _get(k8s_client, namespace, "llama-3-eagle3") is None
    assert run.stats["llama-1"]["failures"] == 0 and "llama-3" not in run.stats


def test_serial_two_rolls_out_in_batches_and_a_failure_stops_its_batch(tmp_path, kubeconfig, k8s_client, kserve, namespace):
    hosts = ["llama-1", "llama-2", "llama-3", "llama-4"]
    for host in hosts:
        kserve.set_behaviour(namespace, host + "-eagle3", ready_after=0.5)
    # The third model (second batch) asks for an unknown speculative key.
    bad = {"llama-3": {"spec_decoding_speculative": {"tensor_parallel_size": 2}}}
    run = run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=_extra(namespace, spec_decoding_serial=2),
                       kubeconfig=kubeconfig, inventory=_inventory(tmp_path, hosts, bad), timeout=900)
    assert run.rc != 0, run.output
    assert _batches(run) == [["llama-1", "llama-2"], ["llama-3", "llama-4"]], run.output

    # First batch: both applied together (one Apply task served both hosts) and Ready.
    for host in ("llama-1", "llama-2"):
        isvc = _get(k8s_client, namespace, host + "-eagle3")
        assert isvc is not None and _ready_at_generation(isvc), host
    plays = json.loads(run.stdout)["plays"]
    apply_tasks = [t for t in plays[0]["tasks"] if "Apply the InferenceService" in t["task"]["name"]]
    assert len(apply_tasks) == 1 and sorted(apply_tasks[0]["hosts"]) == ["llama-1", "llama-2"]

    # Second batch: llama-3 fails at the render with the field; the batch stops at that task, so llama-4
    # (rendered fine in the same task) is not applied either, and neither exists on the API server.
    failed = [(n, res) for n, res in _host_results(run, "llama-3") if res.get("failed")]
    assert len(failed) == 1 and "Render the InferenceService" in failed[0][0]
    assert "speculative.tensor_parallel_size" in failed[0][1]["msg"] and "Fix:" in failed[0][1]["msg"]
    assert not [n for n, _res in _host_results(run, "llama-4") if "Apply the InferenceService" in n]
    assert _get(k8s_client, namespace, "llama-3-eagle3") is None
    assert _get(k8s_client, namespace, "llama-4-eagle3") is None
