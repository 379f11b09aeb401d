"""The routing plan written where the deploy writes (roles/benchmark/tasks/routes_gitops.yml, benchmark_routing_plan.write):
the HTTPRoute as a file next to the InferenceService's manifest in the GitOps directory, kustomization.yaml listing both, the
directory committed to a real Git server on loopback (tests/testbed/git_server.py) as the deploy's GitOps mode does; a rerun
with the same decisions changes nothing and pushes nothing. No cluster."""
import json

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.alauda.spec_decoding.plugins.filter.routing_gitops_file import routing_gitops_file
from ansible_collections.alauda.spec_decoding.plugins.filter.routing_plan import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_gitops
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from tests.ansible_run import run_playbook
from tests.testbed.git_server import GitServer
from tests.unit.test_routing_plan_role import BASE, REPORT, SPEC

ISVC_FILE = "models-llama-eagle3.yaml"  # what the deploy wrote before (roles/inference_service/tasks/gitops.yml)
ISVC_TEXT = "apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\nmetadata:\n  name: llama-eagle3\n  namespace: models\n"


def _route(**over):
    return routing_plan(REPORT, speculative_service=SPEC, baseline_service=BASE, **dict({"namespace": "models", "name": "llama-classes"}, **over))


def test_the_file_is_named_next_to_the_manifest_and_written_deterministically():
    route = _route()
    out = routing_gitops_file(route)
    assert out["filename"] == "models-llama-classes.httproute.yaml"
    assert yaml.safe_load(out["content"]) == route
    assert routing_gitops_file(json.loads(json.dumps(route)))["content"] == out["content"]  # same decisions, same bytes
    assert out["content"].startswith("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n")
    assert routing_gitops.route_filename(_route(namespace=None)) == "llama-classes.httproute.yaml"
    with pytest.raises(ValidationError) as err:
        routing_gitops.route_filename({"kind": "HTTPRoute", "metadata": {"name": "Bad_Name"}})
    assert err.value.field == "benchmark_routing_plan.name"
    with pytest.raises(AnsibleFilterError, match="routing_gitops_file: route: is not an HTTPRoute manifest"):
        routing_gitops_file({"kind": "InferenceService"})


def _tasks(report_path, report_dir, gitops_dir, repo_url, write="gitops"):
    return """
- name: Routes
  ansible.builtin.include_role:
    name: alauda.spec_decoding.benchmark
    tasks_from: routes
  vars:
    benchmark_result: {{report_json: "{report}"}}
    benchmark_report_dir: "{dir}"
    benchmark_report_name: llama
    benchmark_namespace: models
    benchmark_gitops_dir: "{gitops}"
    benchmark_gitops_repo_url: "{repo}"
    benchmark_gitops_repo_path: deploy/llm
    benchmark_routing_plan:
      write: {write}
      speculative_service: {{name: llama-eagle3-predictor, port: 80}}
      baseline_service: {{name: llama-predictor, port: 80}}
      parent_refs: [{{name: inference-gateway}}]
""".format(report=report_path, dir=report_dir, gitops=gitops_dir, repo=repo_url, write=write)


def test_write_gitops_puts_the_route_next_to_the_manifest_commits_it_and_a_rerun_changes_nothing(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(REPORT))
    gitops = tmp_path / "gitops-out"
    gitops.mkdir()
    (gitops / ISVC_FILE).write_text(ISVC_TEXT)
    with GitServer() as server:
        server.create_repo("serving", {"README.md": "serving\n"})
        tasks = _tasks(report, tmp_path, gitops, server.git_url("serving"))
        first = run_playbook(tmp_path, tasks=tasks)
        assert first.rc == 0, first.output
        name = "models-llama-classes.httproute.yaml"
        route = yaml.safe_load((gitops / name).read_text())
        assert route == yaml.safe_load((tmp_path / "llama-httproute.yaml").read_text())  # the file next to the report, too
        assert [(r["name"], r["backendRefs"][0]["name"]) for r in route["spec"]["rules"]] == [
            ("class-chat", "llama-predictor"), ("class-code", "llama-eagle3-predictor"), ("default", "llama-predictor")]
        assert yaml.safe_load((gitops / "kustomization.yaml").read_text())["resources"] == sorted([ISVC_FILE, name])
        assert (gitops / ISVC_FILE).read_text() == ISVC_TEXT  # the deploy's manifest is left as it was
        published = first.result("Commit the routes")
        assert published["changed"] is True and published["commit"] == server.head("serving")
        assert server.show("serving", "main", "deploy/llm/" + name) == (gitops / name).read_text()
        assert sorted(server.changed_files("serving", published["commit"])) == sorted([
            "deploy/llm/kustomization.yaml", "deploy/llm/" + ISVC_FILE, "deploy/llm/" + name])
        said = first.result("Routing plan")["msg"]
        assert said.endswith("and %s/%s" % (gitops, name)), said

        again = run_playbook(tmp_path, tasks=tasks)
        assert again.rc == 0, again.output
        assert again.changed == 0, [n for n, _h, res in again.tasks if res.get("changed")]
        assert again.result("Commit the routes")["commit"] is None and server.head("serving") == published["commit"]


def test_an_unknown_write_is_refused_naming_the_key(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(REPORT))
    run = run_playbook(tmp_path, tasks=_tasks(report, tmp_path, tmp_path / "g", "", write="git"))
    assert run.rc != 0
    [failed] = run.failed
    assert "value of write must be one of: gitops, apply, none, got: git" in failed["msg"] and "benchmark_routing_plan" in failed["msg"]
    assert not (tmp_path / "g").exists() and not (tmp_path / "llama-httproute.yaml").exists()  # refused before anything is written
