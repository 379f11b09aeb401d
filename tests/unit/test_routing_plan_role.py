"""The routing plan through the routing_plan filter and the benchmark role's step (roles/benchmark/tasks/routes.yml), run
as users run it (ansible-playbook, no cluster): the report's per-class decisions become an HTTPRoute written next to the
report, and a report without classes gives the default rule alone."""
import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.routing_plan import routing_plan
from tests.ansible_run import run_playbook

SPEC = {"name": "llama-eagle3-predictor", "port": 80}
BASE = {"name": "llama-predictor", "port": 80}
REPORT = {"schema": "alauda.spec_decoding/benchmark-report/v1", "decision": {"decision": "roll_back"},
          "classes": {"classes": [{"class": "chat", "decision": "roll_back", "outcome": "worse"},
                                  {"class": "code", "decision": "keep", "outcome": "keep"}]}}


def test_filter_renders_and_refuses_naming_the_option():
    route = routing_plan(REPORT, speculative_service=SPEC, baseline_service=BASE, namespace="models")
    assert [(r["name"], r["backendRefs"][0]["name"]) for r in route["spec"]["rules"]] == [
        ("class-chat", BASE["name"]), ("class-code", SPEC["name"]), ("default", BASE["name"])]
    assert routing_plan(REPORT["classes"], SPEC, BASE, render="plan")["speculative_classes"] == ["code"]
    assert routing_plan(REPORT, SPEC, BASE, render="llmisvc_route")["http"]["spec"]["rules"] == route["spec"]["rules"]
    with pytest.raises(AnsibleFilterError, match="routing_plan: speculative_service: must be a mapping"):
        routing_plan(REPORT, None, BASE)
    with pytest.raises(AnsibleFilterError, match="render must be one of"):
        routing_plan(REPORT, SPEC, BASE, render="yaml")


def test_the_benchmark_role_writes_the_route_next_to_the_report(tmp_path):
    tasks = ""
    for name, report in (("classes", REPORT), ("plain", {"schema": REPORT["schema"], "decision": {}})):
        path = tmp_path / ("%s.json" % name)
        path.write_text(json.dumps(report))
        tasks += """
- name: Routes of {name}
  ansible.builtin.include_role:
    name: alauda.spec_decoding.benchmark
    tasks_from: routes
  vars:
    benchmark_result: {{report_json: "{path}"}}
    benchmark_report_dir: "{dir}"
    benchmark_report_name: {name}
    benchmark_namespace: models
    benchmark_routing_plan:
      speculative_service: {{name: llama-eagle3-predictor, port: 80}}
      baseline_service: {{name: llama-predictor, port: 80}}
      parent_refs: [{{name: inference-gateway}}]
""".format(name=name, path=path, dir=tmp_path)
    run = run_playbook(tmp_path, tasks=tasks)
    assert run.rc == 0, run.output
    route = yaml.safe_load((tmp_path / "classes-httproute.yaml").read_text())
    assert route["kind"] == "HTTPRoute" and route["metadata"] == {
        "name": "classes-classes", "namespace": "models", "labels": {"app.kubernetes.io/managed-by": "alauda.spec_decoding"},
        "annotations": {"spec-decoding.alauda.io/routing-plan": '{"classes":{"chat":"baseline","code":"speculative"},"default":"baseline"}'}}
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}]
    plain = yaml.safe_load((tmp_path / "plain-httproute.yaml").read_text())
    assert [r["name"] for r in plain["spec"]["rules"]] == ["default"]
    said = [res["msg"] for _name, _host, res in run.tasks if "msg" in res and str(res["msg"]).startswith("routes: ")]
    assert said[0].startswith("routes: class-chat -> llama-predictor, class-code -> llama-eagle3-predictor, default -> llama-predictor;")
    assert said[1].startswith("routes: default -> llama-predictor;")
