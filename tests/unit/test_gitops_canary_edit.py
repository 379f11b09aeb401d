"""gitops/canary_edit: the canary's steps in Git (canary_rollout write_mode=git) - canaryTrafficPercent set and removed,
--speculative-config added and stripped - in a plain manifest and in kustomize overlays (a strategic-merge patch file, a
JSON 6902 patch, an inline patch), with every byte outside the edited lines unchanged."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import canary_edit, yaml_roundtrip
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_line import find_speculative_config

NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'

# The Knative-mode InferenceService a platform team keeps in Git, comments and quoting of its own.
PLAIN = textwrap.dedent("""\
    # llm: Argo CD syncs this file (app llm-prod).
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata:
      name: llm
      namespace: models
      annotations:
        serving.kserve.io/deploymentMode: "Serverless"   # KServe's canary needs Knative revisions
    spec:
      predictor:
        minReplicas: 1
        # the model server
        model:
          modelFormat: {name: vllm}
          args:
          - --model
          - /mnt/models   # the PVC's mount
          - '--max-model-len=4096'
          # keep prefix caching
          - --enable-prefix-caching
    """)


def _write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def _read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as handle:
        return handle.read()


def _edit(root, intent, path="."):
    return canary_edit.edit_canary_in_directory(str(root), path, "llm", "models", intent)


def _added_and_removed(before, after):
    """(lines only in after, lines only in before), in order: a round-trip edit must leave every other line as it was."""
    b, a = before.splitlines(), after.splitlines()
    return [line for line in a if line not in b], [line for line in b if line not in a]


def test_plain_manifest_start_step_promote_and_abort_change_only_their_lines(tmp_path):
    _write(tmp_path, {"isvc.yaml": PLAIN})
    start = _edit(tmp_path, {"canaryTrafficPercent": 10, "speculative_config": NGRAM})
    after_start = _read(tmp_path, "isvc.yaml")
    added, removed = _added_and_removed(PLAIN, after_start)
    assert removed == []
    assert added == ["    canaryTrafficPercent: 10", "      - --speculative-config", "      - '%s'" % NGRAM]
    # every line of the original is still there, in order, and the new key sits first in the predictor
    lines = after_start.splitlines()
    assert lines.index("    canaryTrafficPercent: 10") == lines.index("  predictor:") + 1
    assert [line for line in lines if line not in added] == PLAIN.splitlines()
    tree = yaml_roundtrip.load(after_start)
    assert tree["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert find_speculative_config(None, list(tree["spec"]["predictor"]["model"]["args"])) == json.loads(NGRAM)
    assert {c["change"] for c in start["removed"]} == {"set"} and start["files"][0]["exact"] is True

    # the same step again: Git already says it, nothing to commit
    assert _edit(tmp_path, {"canaryTrafficPercent": 10, "speculative_config": NGRAM})["files"] == []

    # the next step: only the share's line changes
    _edit(tmp_path, {"canaryTrafficPercent": 50})
    after_step = _read(tmp_path, "isvc.yaml")
    assert _added_and_removed(after_start, after_step) == (["    canaryTrafficPercent: 50"], ["    canaryTrafficPercent: 10"])

    # the abort: the share and the flag go in one edit, and the file is byte for byte the original
    aborted = _edit(tmp_path, {"canaryTrafficPercent": None, "speculative_config": None})
    assert _read(tmp_path, "isvc.yaml") == PLAIN
    assert sorted(c["change"] for c in aborted["removed"]) == ["removed", "removed"]

    # the promotion (from the step): only the share's line goes, the flag stays
    _write(tmp_path, {"isvc.yaml": after_step})
    _edit(tmp_path, {"canaryTrafficPercent": None})
    assert _read(tmp_path, "isvc.yaml") == after_start.replace("    canaryTrafficPercent: 10\n", "")


def test_share_with_a_comment_of_its_own_keeps_the_comment_lines_around_it(tmp_path):
    text = PLAIN.replace("    minReplicas: 1\n", "    canaryTrafficPercent: 5  # first step\n    # replicas of each revision\n    minReplicas: 1\n")
    _write(tmp_path, {"isvc.yaml": text})
    _edit(tmp_path, {"canaryTrafficPercent": 20})
    # only the share's line changes; its comment stays on it (ruamel.yaml keeps the comment's column)
    added, removed = _added_and_removed(text, _read(tmp_path, "isvc.yaml"))
    assert removed == ["    canaryTrafficPercent: 5  # first step"] and added == ["    canaryTrafficPercent: 20 # first step"]
    _edit(tmp_path, {"canaryTrafficPercent": None})
    assert _read(tmp_path, "isvc.yaml") == text.replace("    canaryTrafficPercent: 5  # first step\n", "")


BASE = textwrap.dedent("""\
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata:
      name: llm
    spec:
      predictor:
        model:
          modelFormat:
            name: vllm
          args: ["--model", "/mnt/models"]
    """)
SMP = textwrap.dedent("""\
    # prod: more context, Knative revisions
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata:
      name: llm
      annotations:
        serving.kserve.io/deploymentMode: Serverless
    spec:
      predictor:
        model:
          args:
            - --model
            - /mnt/models
            - --max-model-len=8192   # prod's context
    """)
KUSTOMIZATION = "namespace: models\nresources:\n  - ../../base\npatches:\n  - path: prod.yaml\n"


def test_kustomize_strategic_merge_patch_gets_the_share_and_the_flag_the_base_is_untouched(tmp_path):
    _write(tmp_path, {"base/isvc.yaml": BASE, "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
                      "overlays/prod/kustomization.yaml": KUSTOMIZATION, "overlays/prod/prod.yaml": SMP})
    result = _edit(tmp_path, {"canaryTrafficPercent": 10, "speculative_config": NGRAM}, path="overlays/prod")
    assert [f["file"] for f in result["files"]] == ["overlays/prod/prod.yaml"]
    assert _read(tmp_path, "base/isvc.yaml") == BASE
    patched = _read(tmp_path, "overlays/prod/prod.yaml")
    added, removed = _added_and_removed(SMP, patched)
    assert removed == [] and added == ["    canaryTrafficPercent: 10", "        - --speculative-config", "        - '%s'" % NGRAM]
    _edit(tmp_path, {"canaryTrafficPercent": None, "speculative_config": None}, path="overlays/prod")
    assert _read(tmp_path, "overlays/prod/prod.yaml") == SMP and _read(tmp_path, "base/isvc.yaml") == BASE


def test_json6902_patch_gets_an_add_op_and_its_whole_list_edited(tmp_path):
    ops = textwrap.dedent("""\
        # the speculative overlay, as JSON 6902 ops
        - op: replace
          path: /spec/predictor/model/args
          value:
            - --model
            - /mnt/models
        """)
    _write(tmp_path, {"base/isvc.yaml": BASE, "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
                      "overlays/spec/kustomization.yaml": textwrap.dedent("""\
                          resources:
                            - ../../base
                          namespace: models
                          patches:
                            - path: ops.yaml
                              target: {kind: InferenceService, name: llm}
                          """),
                      "overlays/spec/ops.yaml": ops})
    _edit(tmp_path, {"canaryTrafficPercent": 25, "speculative_config": NGRAM}, path="overlays/spec")
    edited = _read(tmp_path, "overlays/spec/ops.yaml")
    added, removed = _added_and_removed(ops, edited)
    assert removed == [] and added == ["- op: add", "  path: /spec/predictor/canaryTrafficPercent", "  value: 25",
                                       "    - --speculative-config", "    - '%s'" % NGRAM], edited
    tree = yaml_roundtrip.load(edited)
    assert dict(tree[0]) == {"op": "add", "path": "/spec/predictor/canaryTrafficPercent", "value": 25}
    assert list(tree[1]["value"]) == ["--model", "/mnt/models", "--speculative-config", NGRAM]
    _edit(tmp_path, {"canaryTrafficPercent": 50}, path="overlays/spec")
    assert yaml_roundtrip.load(_read(tmp_path, "overlays/spec/ops.yaml"))[0]["value"] == 50
    _edit(tmp_path, {"canaryTrafficPercent": None, "speculative_config": None}, path="overlays/spec")
    assert _read(tmp_path, "overlays/spec/ops.yaml") == ops


def test_inline_patch_edited_inside_its_string(tmp_path):
    kustomization = textwrap.dedent("""\
        resources:
          - ../../base
        namespace: models
        patches:
          - patch: |-
              apiVersion: serving.kserve.io/v1beta1
              kind: InferenceService
              metadata:
                name: llm
              spec:
                predictor:
                  canaryTrafficPercent: 10
                  model:
                    args: [--model, /mnt/models, --speculative-config, '%s']
        """) % NGRAM
    _write(tmp_path, {"base/isvc.yaml": BASE, "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
                      "overlays/c/kustomization.yaml": kustomization})
    _edit(tmp_path, {"canaryTrafficPercent": 50}, path="overlays/c")
    assert _read(tmp_path, "overlays/c/kustomization.yaml") == kustomization.replace("canaryTrafficPercent: 10", "canaryTrafficPercent: 50")
    _edit(tmp_path, {"canaryTrafficPercent": None, "speculative_config": None}, path="overlays/c")
    inner = yaml_roundtrip.load(yaml_roundtrip.load(_read(tmp_path, "overlays/c/kustomization.yaml"))["patches"][0]["patch"])
    assert dict(inner["spec"]["predictor"]["model"]) == {"args": ["--model", "/mnt/models"]}
    assert _read(tmp_path, "base/isvc.yaml") == BASE


def test_no_place_for_the_flag_names_the_files_and_the_fix(tmp_path):
    _write(tmp_path, {"isvc.yaml": PLAIN.replace("      args:\n", "      argz:\n")})
    with pytest.raises(ValidationError) as err:
        _edit(tmp_path, {"canaryTrafficPercent": 10, "speculative_config": NGRAM})
    assert err.value.field == "path" and "isvc.yaml" in str(err.value) and "spec.predictor.model.args" in err.value.hint
    assert _read(tmp_path, "isvc.yaml") == PLAIN.replace("      args:\n", "      argz:\n")  # nothing written


STANDARD = PLAIN.replace('"Serverless"   # KServe\'s canary needs Knative revisions', "RawDeployment")


def _make_canary(predictor):
    """What ops/canary.canary_predictor makes of the predictor in Git (here by hand: gitops/ sits below ops/)."""
    out = dict(predictor, name="spec")
    out["model"] = dict(predictor["model"], args=list(predictor["model"]["args"]) + ["--speculative-config", NGRAM])
    return out


def test_standard_mode_entry_added_stepped_promoted_and_removed(tmp_path):
    _write(tmp_path, {"isvc.yaml": STANDARD})
    want = {"name": "spec", "trafficPercent": 10, "make": _make_canary}
    _edit(tmp_path, {"canary": want})
    started = _read(tmp_path, "isvc.yaml")
    assert started.startswith(STANDARD)  # the entry is appended to spec; every line before it is as it was
    tree = yaml_roundtrip.load(started)
    entry = tree["spec"]["canary"][0]
    assert entry["trafficPercent"] == 10 and entry["predictor"]["name"] == "spec"
    assert find_speculative_config(None, list(entry["predictor"]["model"]["args"])) == json.loads(NGRAM)
    assert list(tree["spec"]["predictor"]["model"]["args"]) == ["--model", "/mnt/models", "--max-model-len=4096", "--enable-prefix-caching"]
    assert _edit(tmp_path, {"canary": want})["files"] == []  # a rerun: Git already says it
    _edit(tmp_path, {"canary": dict(want, trafficPercent=50)})
    stepped = _read(tmp_path, "isvc.yaml")
    assert _added_and_removed(started, stepped) == (["  - trafficPercent: 50"], ["  - trafficPercent: 10"])
    # the abort: spec.canary goes, the file is the original again
    _edit(tmp_path, {"canary": None})
    assert _read(tmp_path, "isvc.yaml") == STANDARD
    # the promotion: the predictor gets the flag and the canary's name, spec.canary goes
    _write(tmp_path, {"isvc.yaml": stepped})
    _edit(tmp_path, {"promote": {"name": "spec", "speculative_config": NGRAM}})
    added, removed = _added_and_removed(STANDARD, _read(tmp_path, "isvc.yaml"))
    assert removed == [] and added == ["    name: spec", "      - --speculative-config", "      - '%s'" % NGRAM]


def test_standard_mode_entry_not_built_from_a_kustomize_patch(tmp_path):
    _write(tmp_path, {"base/isvc.yaml": BASE, "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
                      "overlays/prod/kustomization.yaml": KUSTOMIZATION, "overlays/prod/prod.yaml": SMP})
    with pytest.raises(ValidationError) as err:
        _edit(tmp_path, {"canary": {"name": "spec", "trafficPercent": 10, "make": _make_canary}}, path="overlays/prod")
    assert err.value.field == "canary_mode" and "overlays/prod/prod.yaml" in str(err.value) and "Knative" in err.value.hint
    assert _read(tmp_path, "overlays/prod/prod.yaml") == SMP


def test_sync_list_inserts_and_keeps_styles():
    text = "a:\n  - 'x'  # one\n  - \"y\"\n  - drop\n"

    def edit(tree, _index):
        yaml_roundtrip.sync_list(tree["a"], ["x", "new", "y", "z"])
        return True
    assert yaml_roundtrip.edit_text(text, edit)[0] == "a:\n  - 'x'  # one\n  - new\n  - \"y\"\n  - z\n"
