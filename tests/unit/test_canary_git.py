"""ops/canary_git: one plan for both write modes - each step's plan (canary_steps.plan_step, Knative and Standard mode) read
as what the definition in Git must say (git_intent) - and the live step's refusal of a managed object, naming the canary's
own fixes (canary_mode: git, canary_gitops_owner: ignore)."""

from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import canary, canary_git, canary_steps

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
KNATIVE_ISVC = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
                "metadata": {"name": "llm", "namespace": "models", "annotations": {"serving.kserve.io/deploymentMode": "Serverless"}},
                "spec": {"predictor": {"minReplicas": 1, "model": {"modelFormat": {"name": "vllm"}, "args": ["--model", "/mnt/models"]}}}}


def _params(**more):
    params = {"canary_name": "spec", "state": "present", "speculative_config": NGRAM, "vllm_version": None, "percent": 10}
    params.update(more)
    return params


def _intent(isvc, **params):
    mode, patch, _pred = canary_steps.plan_step(_params(**params), isvc, "v0.20.0")
    return canary_git.git_intent(mode, patch, "spec"), patch


def test_each_knative_step_plan_reads_as_the_edit_git_needs():
    start, patch = _intent(KNATIVE_ISVC)
    assert start["canaryTrafficPercent"] == 10 and json.loads(start["speculative_config"]) == NGRAM
    # the step after it, on the object as the start left it
    at_ten = canary.merge_patch(KNATIVE_ISVC, patch)
    step, _patch = _intent(at_ten, percent=50)
    assert step == {"canaryTrafficPercent": 50, "speculative_config": start["speculative_config"]}
    promote, _patch = _intent(at_ten, state="promoted", speculative_config=None, percent=None)
    assert promote == {"canaryTrafficPercent": None}
    # the abort: live it is canaryTrafficPercent 0 on the predictor without the flag; in Git both go
    abort, live_patch = _intent(at_ten, state="absent", speculative_config=None, percent=None)
    assert live_patch["spec"]["predictor"]["canaryTrafficPercent"] == 0
    assert abort == {"canaryTrafficPercent": None, "speculative_config": None}
    # no canary: nothing to write
    assert _intent(KNATIVE_ISVC, state="absent", speculative_config=None, percent=None)[0] == {}


def test_each_standard_step_plan_reads_as_the_spec_canary_edit():
    standard = copy.deepcopy(KNATIVE_ISVC)
    standard["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = "RawDeployment"
    start, patch = _intent(standard)
    assert set(start) == {"canary"} and start["canary"]["name"] == "spec" and start["canary"]["trafficPercent"] == 10
    # the entry's predictor is made from the predictor in Git, as the live plan makes it from the live one
    made = start["canary"]["make"](copy.deepcopy(standard["spec"]["predictor"]))
    assert made == patch["spec"]["canary"][0]["predictor"] and made["name"] == "spec"
    at_ten = canary.merge_patch(standard, patch)
    step, _patch = _intent(at_ten, percent=50)
    assert step["canary"]["trafficPercent"] == 50
    promote, _patch = _intent(at_ten, state="promoted", speculative_config=None, percent=None)
    assert promote["promote"]["name"] == "spec" and json.loads(promote["promote"]["speculative_config"]) == NGRAM
    assert _intent(at_ten, state="absent", speculative_config=None, percent=None)[0] == {"canary": None}


def test_live_step_of_an_argo_cd_object_is_refused_with_the_canarys_fixes(monkeypatch):
    isvc = copy.deepcopy(KNATIVE_ISVC)
    isvc["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"] = "llm-prod:serving.kserve.io/InferenceService:models/llm"

    def read_owner(_api_client, _obj, owner=None, **_kw):  # the Application as a 403 leaves it: unreadable, still named
        return dict(owner, readable=False, read_error="403 Forbidden")
    monkeypatch.setattr(canary_git.gitops_owner, "read_owner", read_owner)
    params = {"namespace": "models", "name": "llm", "gitops_owner": "refuse"}
    with pytest.raises(ValidationError) as err:
        canary_git.check_live_write(None, isvc, params)
    text = str(err.value)
    assert err.value.field == "gitops_owner" and "Argo CD Application argocd/llm-prod" in text and "nothing was written" in text
    assert "canary_mode: git" in err.value.hint and "canary_gitops_owner: ignore" in err.value.hint
    warnings = []
    owner = canary_git.check_live_write(None, isvc, dict(params, gitops_owner="ignore"), warn=warnings.append)
    assert owner["kind"] == "argocd" and warnings and warnings[0].startswith("gitops_owner=ignore: Argo CD Application argocd/llm-prod")
