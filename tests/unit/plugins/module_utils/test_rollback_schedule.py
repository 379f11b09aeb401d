"""plugins/module_utils/ops/rollback_schedule.py: the rollback_schedule role's settings, checked before anything is rendered.

The settings are the role's own defaults and what roles/canary/tasks/schedule.yml passes; the cron rules are what the
API server accepts for a CronJob's schedule (robfig/cron v3 ParseStandard: five fields, day of week 0-6, names for months
and days, `?` as `*`)."""
import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import rollback_schedule
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

CRON_FIX = 'Fix: write a standard 5-field cron expression, e.g. "0 3 * * *"'
# roles/rollback_schedule/defaults/main.yml with one name to roll back and an output directory (GitOps)
DEFAULTS = {"name": "spec-decoding-rollback", "namespace": "default", "target_namespaces": ["default"], "names": ["llama-eagle3"],
            "label_selector": "", "cron": "0 3 * * *", "output_dir": "gitops-out/rollback", "apply": False,
            "resource_kind": "InferenceService", "kserve_namespace": "kserve", "kserve_presets_role": True}


def _with(**more):
    return dict(DEFAULTS, **more)


@pytest.mark.parametrize("settings", [
    DEFAULTS,
    # what the canary role's schedule passes (roles/canary/tasks/schedule.yml, canary_schedule_cron default)
    _with(name="spec-decoding-canary", namespace="models", target_namespaces=["models"], names=["models/llama-eagle3"],
          cron="0 10 * * 1", output_dir="", apply=True),
    _with(names=[], label_selector="spec-decoding.alauda.io/rollback=nightly"),
    _with(resource_kind="LLMInferenceService", kserve_namespace="kserve"),
    _with(resource_kind="LLMInferenceService", kserve_presets_role=False, kserve_namespace="Not_Used"),
    _with(names=["a" * 63, "models/" + "b" * 63], target_namespaces=["models", "team-a"]),
], ids=["defaults", "canary", "label-selector", "llmisvc", "llmisvc-no-presets-role", "longest-names"])
def test_settings_a_schedule_renders_with_have_no_problems(settings):
    assert rollback_schedule.messages(settings) == []


@pytest.mark.parametrize("cron", ["0 3 * * *", "*/15 * * * *", "0-59/5 0,12 1-15 * *", "0 0 1 jan *", "0 0 * JAN-MAR MON-FRI",
                                  "0 0 * * 0", "0 0 * * 6", "0 0 ? * ?", "30 2 * * sun", "5/15 * * * *", "0 0 31 12 *"])
def test_cron_expressions_a_cronjob_takes_pass(cron):
    assert rollback_schedule.cron_problems(cron) == []


@pytest.mark.parametrize("cron, message", [
    ("61 3 * * *", "rollback_schedule_cron: minute field 61 is outside 0-59. " + CRON_FIX),
    ("0 24 * * *", "rollback_schedule_cron: hour field 24 is outside 0-23. " + CRON_FIX),
    ("0 0 0 * *", "rollback_schedule_cron: day of month field 0 is outside 1-31. " + CRON_FIX),
    ("0 0 32 * *", "rollback_schedule_cron: day of month field 32 is outside 1-31. " + CRON_FIX),
    ("0 0 * 13 *", "rollback_schedule_cron: month field 13 is outside 1-12. " + CRON_FIX),
    ("0 0 * * 7", "rollback_schedule_cron: day of week field 7 is outside 0-6. " + CRON_FIX),
    ("5,10,70 * * * *", "rollback_schedule_cron: minute field 5,10,70 is outside 0-59. " + CRON_FIX),
    ("a * * * *", "rollback_schedule_cron: minute field a is not a cron value (0-59, *, lists a,b, ranges a-b, steps */n). " + CRON_FIX),
    ("*/0 * * * *", "rollback_schedule_cron: minute field */0 is not a cron value (0-59, *, lists a,b, ranges a-b, steps */n). " + CRON_FIX),
    ("10-5 * * * *", "rollback_schedule_cron: minute field 10-5 is not a cron value (0-59, *, lists a,b, ranges a-b, steps */n). " + CRON_FIX),
    ("0 0 L * *", "rollback_schedule_cron: day of month field L is not a cron value (1-31, *, lists a,b, ranges a-b, steps */n). " + CRON_FIX),
    ("0 0 * * FOO", "rollback_schedule_cron: day of week field FOO is not a cron value (0-6, *, lists a,b, ranges a-b, steps */n). " + CRON_FIX),
    ("0 3 * *", "rollback_schedule_cron: '0 3 * *' has 4 field(s), a CronJob schedule has 5 (minute hour day-of-month month "
                "day-of-week). " + CRON_FIX),
    ("@daily", "rollback_schedule_cron: '@daily' has 1 field(s), a CronJob schedule has 5 (minute hour day-of-month month "
               "day-of-week). " + CRON_FIX),
    ("", "rollback_schedule_cron: '' has 0 field(s), a CronJob schedule has 5 (minute hour day-of-month month day-of-week). " + CRON_FIX),
    (None, "rollback_schedule_cron: None is not a cron expression. " + CRON_FIX),
])
def test_wrong_cron_names_the_field_and_the_fix(cron, message):
    problems = rollback_schedule.cron_problems(cron)
    assert [str(p) for p in problems] == [message]
    assert all(isinstance(p, ValidationError) and p.field == "rollback_schedule_cron" for p in problems)


def test_every_wrong_field_of_one_cron_is_named():
    assert [str(p).split(" is ", maxsplit=1)[0] for p in rollback_schedule.cron_problems("61 24 0 13 9")] == [
        "rollback_schedule_cron: minute field 61", "rollback_schedule_cron: hour field 24", "rollback_schedule_cron: day of month field 0",
        "rollback_schedule_cron: month field 13", "rollback_schedule_cron: day of week field 9"]


@pytest.mark.parametrize("settings, messages", [
    (_with(names=["Bad_Name"]),
     ["rollback_schedule_names[0]: Bad_Name is not an InferenceService name or namespace/name. Fix: use lowercase DNS-1123 names, "
      "e.g. llama-eagle3 or models/llama-eagle3"]),
    (_with(names=["ok", "a/b/c", "Models/llama", "models/", "x" * 64]),
     ["rollback_schedule_names[%d]: %s is not an InferenceService name or namespace/name. Fix: use lowercase DNS-1123 names, "
      "e.g. llama-eagle3 or models/llama-eagle3" % (i, v) for i, v in ((1, "a/b/c"), (2, "Models/llama"), (3, "models/"), (4, "x" * 64))]),
    (_with(namespace="Models"),
     ["rollback_schedule_namespace: 'Models' is not a valid DNS-1123 label (lowercase letters, digits and '-', starting and ending "
      "with a letter or digit, at most 63 characters). Fix: use e.g. 'models'"]),
    (_with(name="nightly_rollback"),
     ["rollback_schedule_name: 'nightly_rollback' is not a valid DNS-1123 label (lowercase letters, digits and '-', starting and "
      "ending with a letter or digit, at most 63 characters). Fix: use e.g. 'nightly-rollback'"]),
    (_with(name=""), ["rollback_schedule_name: is required. Fix: give a lowercase DNS-1123 name such as 'llama-eagle3'"]),
    (_with(target_namespaces=["default", "-team"]),
     ["rollback_schedule_target_namespaces[1]: '-team' is not a valid DNS-1123 label (lowercase letters, digits and '-', starting "
      "and ending with a letter or digit, at most 63 characters). Fix: use e.g. 'team'"]),
    (_with(resource_kind="LLMInferenceService", kserve_namespace="KServe"),
     ["rollback_schedule_kserve_namespace: 'KServe' is not a valid DNS-1123 label (lowercase letters, digits and '-', starting "
      "and ending with a letter or digit, at most 63 characters). Fix: use e.g. 'kserve'"]),
    (_with(names=[], label_selector=""),
     ["rollback_schedule_names: nothing to roll back. Fix: set rollback_schedule_names and/or rollback_schedule_label_selector "
      "(what to roll back)"]),
    (_with(target_namespaces=[]),
     ["rollback_schedule_target_namespaces: is empty. Fix: list the namespaces the job may roll back in (by default its own "
      "namespace)"]),
    (_with(output_dir="", apply=False),
     ["rollback_schedule_output_dir: is empty and rollback_schedule_apply is false: the manifests would go nowhere. Fix: set "
      "rollback_schedule_output_dir and/or rollback_schedule_apply: true (where the manifests go)"]),
], ids=["bad-name", "bad-refs", "bad-namespace", "bad-cronjob-name", "empty-name", "bad-target", "bad-kserve-namespace",
        "nothing-to-roll-back", "no-target", "nowhere-to-go"])
def test_wrong_settings_name_the_variable_and_the_fix(settings, messages):
    assert rollback_schedule.messages(settings) == messages


def test_all_problems_of_one_run_are_reported_together():
    messages = rollback_schedule.messages(_with(names=[], namespace="Bad", cron="0 3 * *", output_dir=""))
    assert [m.split(":")[0] for m in messages] == ["rollback_schedule_names", "rollback_schedule_output_dir",
                                                   "rollback_schedule_namespace", "rollback_schedule_cron"]
    assert all("Fix:" in m for m in messages)
    # settings a role leaves out count as empty
    assert [m.split(":")[0] for m in rollback_schedule.messages({})] == [
        "rollback_schedule_names", "rollback_schedule_target_namespaces", "rollback_schedule_output_dir", "rollback_schedule_name",
        "rollback_schedule_namespace", "rollback_schedule_cron"]
