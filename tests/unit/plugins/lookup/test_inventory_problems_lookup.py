"""Lookup alauda.spec_decoding.inventory_problems, the inventory_check role's read: the filter's check on the current host's
variables, through ansible-playbook. Both run in one play on the same host: wrong values and a misspelt name must come back
the same from each (the lookup loads one plugin file, the filter all of them)."""
from tests.ansible_run import run_playbook

TASKS = """\
- name: The lookup
  ansible.builtin.debug:
    msg: "{{ query('alauda.spec_decoding.inventory_problems', method='eagle3', method_source='the test', roles=['inference_service'])
             | first }}"
- name: The filter
  ansible.builtin.debug:
    msg: "{{ hostvars[inventory_hostname] | alauda.spec_decoding.inventory_problems(method='eagle3', method_source='the test',
             roles=['inference_service']) }}"
"""


def test_the_lookup_answers_as_the_filter_on_the_hosts_variables(tmp_path):
    run = run_playbook(tmp_path, tasks=TASKS, extra_vars={
        "spec_decoding_deployment_mode": "RawDeploymnet", "spec_decoding_max_model_len": "8k", "spec_decoding_methd": "ngram"})
    assert run.rc == 0, run.output
    looked_up, filtered = run.result("The lookup")["msg"], run.result("The filter")["msg"]
    print("lookup: %s" % looked_up)
    assert looked_up == filtered
    invalid = " | ".join(looked_up["invalid"])
    assert "set spec_decoding_deployment_mode: RawDeployment" in invalid and "'8k' is not a valid int" in invalid, invalid
    (unknown,) = looked_up["unknown"]
    assert unknown.startswith("spec_decoding_methd: ") and "spec_decoding_method" in unknown, unknown
