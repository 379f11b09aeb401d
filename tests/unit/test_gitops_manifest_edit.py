"""gitops/manifest_edit: the speculative flags found and stripped in the files of a repository directory, as Argo CD and
Flux users lay them out (plain manifests, kustomize overlays with strategic-merge, inline and JSON 6902 patches, the
collection's own render, a Helm chart), with every byte outside the flag's lines unchanged."""

from __future__ import annotations

import os
import textwrap

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import manifest_edit, yaml_roundtrip
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm.command_line import find_occurrences, find_speculative_config

SPEC_JSON = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4}'

PLAIN = textwrap.dedent("""\
    # The model server: Argo CD syncs this file.
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata:
      name: llm
      annotations:
        note: "keep me"   # double-quoted on purpose
    spec:
      predictor:
        model:
          modelFormat: {name: vllm}
          command:
            - bash
            - -c
            - |
              set -e
              # start vLLM
              exec vllm serve /mnt/models \\
                --port 8080 \\
                --speculative-config '%(json)s' \\
                --max-model-len 4096
          args:
          - --dtype=half   # dtype
          # the speculative part
          - --speculative-config
          - '%(json)s'
          # the seed stays
          - --seed=1
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: other}
    data: {a: "1", flags: "--speculative-config is not read here"}
    """) % {"json": SPEC_JSON}


def _write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def _read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as handle:
        return handle.read()


def _without_lines(text, *needles):
    """The text minus every line holding one of the needles: what a byte-exact strip must leave."""
    return "".join(line for line in text.splitlines(keepends=True) if not any(n in line for n in needles))


def _documents(text):
    return [yaml_roundtrip.load(body) for _sep, body in yaml_roundtrip.split_documents(text) if body.strip()]


def _no_flag_in(node):
    """No command/args list (or VLLM_ADDITIONAL_ARGS value) under node carries a speculative flag."""
    if isinstance(node, list):
        return all(_no_flag_in(i) for i in node)
    if not isinstance(node, dict):
        return True
    for field in ("command", "args"):
        if isinstance(node.get(field), list) and find_occurrences([str(i) for i in node[field]]):
            return False
    return all(_no_flag_in(v) for k, v in node.items() if k not in ("command", "args"))


def test_plain_manifest_script_and_args_only_flag_lines_change(tmp_path):
    _write(tmp_path, {"apps/llm/isvc.yaml": PLAIN})
    result = manifest_edit.strip_in_directory(str(tmp_path), "apps/llm", "InferenceService", "llm", "serving")

    after = _read(tmp_path, "apps/llm/isvc.yaml")
    assert after == _without_lines(PLAIN, "--speculative-config '", "- --speculative-config", "- '{\"method\"")
    isvc = _documents(after)[0]
    model = isvc["spec"]["predictor"]["model"]
    assert find_speculative_config([str(w) for w in model["command"]], [str(w) for w in model["args"]]) is None
    assert "exec vllm serve /mnt/models" in model["command"][2] and "--max-model-len 4096" in model["command"][2]
    assert [f["file"] for f in result["files"]] == ["apps/llm/isvc.yaml"]
    assert result["files"][0]["exact"] is True
    assert {(r["field"], r["flag"], r["value"]) for r in result["removed"]} == {
        ("spec.predictor.model.command", "--speculative-config", SPEC_JSON),
        ("spec.predictor.model.args", "--speculative-config", SPEC_JSON)}
    diff = result["files"][0]["diff"]
    assert diff.startswith("--- a/apps/llm/isvc.yaml\n+++ b/apps/llm/isvc.yaml\n")
    assert [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")] == [
        "-            --speculative-config '%s' \\" % SPEC_JSON, "-      - --speculative-config", "-      - '%s'" % SPEC_JSON]
    assert not [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert manifest_edit.removed_summary(result["removed"]) == "--speculative-config " + SPEC_JSON

    # a rerun finds the object without a flag: nothing to edit, no error (the rollback is idempotent)
    again = manifest_edit.strip_in_directory(str(tmp_path), "apps/llm", "InferenceService", "llm", "serving")
    assert again["files"] == [] and again["defined_in"] == ["apps/llm/isvc.yaml"]
    assert _read(tmp_path, "apps/llm/isvc.yaml") == after


def test_other_namespace_and_other_name_are_left_alone(tmp_path):
    other = PLAIN.replace("  name: llm\n", "  name: llm\n  namespace: elsewhere\n", 1)
    _write(tmp_path, {"a.yaml": other})
    with pytest.raises(ValidationError) as info:
        manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "serving")
    assert _read(tmp_path, "a.yaml") == other
    text = str(info.value)
    assert "no file under '.' defines InferenceService serving/llm" in text and "a.yaml" in text
    assert info.value.field == "path" and "rollback_git_path" in info.value.hint


def test_missing_namespace_is_the_owners_destination(tmp_path):
    _write(tmp_path, {"a.yaml": PLAIN})
    with pytest.raises(ValidationError):
        manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "serving", default_namespace="other")
    result = manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "other", default_namespace="other")
    assert len(result["removed"]) == 2


BASE_ISVC = textwrap.dedent("""\
    apiVersion: serving.kserve.io/v1beta1
    kind: InferenceService
    metadata:
      name: llm
    spec:
      predictor:
        model:
          modelFormat:
            name: vllm
          args:
            - --dtype=half
    """)


def test_kustomize_overlay_strategic_merge_patch_file(tmp_path):
    smp = textwrap.dedent("""\
        # speculative decoding for prod only
        apiVersion: serving.kserve.io/v1beta1
        kind: InferenceService
        metadata:
          name: llm
        spec:
          predictor:
            model:
              args:
                - --dtype=half
                - "--speculative-config={\\"method\\":\\"ngram\\",\\"num_speculative_tokens\\":3}"   # tuned 2026-11
                - --max-num-seqs=64
        """)
    kustomization = textwrap.dedent("""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        namespace: serving
        resources:
          - ../../base
        patches:
          - path: speculative.yaml
        """)
    _write(tmp_path, {"base/isvc.yaml": BASE_ISVC, "base/kustomization.yaml": "resources:\n  - isvc.yaml\n",
                      "overlays/prod/kustomization.yaml": kustomization, "overlays/prod/speculative.yaml": smp})
    result = manifest_edit.strip_in_directory(str(tmp_path), "overlays/prod", "InferenceService", "llm", "serving")

    assert [f["file"] for f in result["files"]] == ["overlays/prod/speculative.yaml"]
    assert _read(tmp_path, "overlays/prod/speculative.yaml") == _without_lines(smp, "speculative-config")
    assert _read(tmp_path, "base/isvc.yaml") == BASE_ISVC
    assert _read(tmp_path, "overlays/prod/kustomization.yaml") == kustomization
    assert result["removed"][0]["value"] == '{"method":"ngram","num_speculative_tokens":3}'
    assert sorted(result["defined_in"]) == ["base/isvc.yaml", "overlays/prod/speculative.yaml"]
    assert _no_flag_in(_documents(_read(tmp_path, "overlays/prod/speculative.yaml"))[0])


def test_patch_that_held_only_the_flag_drops_its_list(tmp_path):
    """A strategic-merge patch replaces a list of strings whole: an emptied args would wipe the base's args, so the
    key goes."""
    smp = textwrap.dedent("""\
        kind: InferenceService
        metadata:
          name: llm
        spec:
          predictor:
            model:
              args: ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']
        """)
    _write(tmp_path, {"isvc.yaml": BASE_ISVC, "patch.yaml": smp,
                      "kustomization.yaml": "resources: [isvc.yaml]\npatchesStrategicMerge:\n  - patch.yaml\n"})
    manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "serving")
    # `model: {}`, not an empty `model:`: a null in a strategic-merge patch deletes the base's key
    assert _read(tmp_path, "patch.yaml") == _without_lines(smp, "args:").replace("    model:\n", "    model: {}\n")


def test_inline_patches_edited_inside_their_strings(tmp_path):
    kustomization = textwrap.dedent("""\
        resources:
          - isvc.yaml
        patches:
          # JSON 6902, inline
          - target:
              kind: InferenceService
              name: llm
            patch: |-
              - op: add
                path: /spec/predictor/model/args/-
                value: --speculative-config
              - op: add
                path: /spec/predictor/model/args/-
                value: '{"method":"ngram","num_speculative_tokens":4}'
              - op: add
                path: /metadata/labels/tier
                value: prod
          # strategic merge, inline
          - patch: |
              kind: InferenceService
              metadata:
                name: llm
              spec:
                predictor:
                  model:
                    args:
                      - --dtype=half
                      - --speculative-config={"method":"ngram","num_speculative_tokens":2}
        """)
    _write(tmp_path, {"isvc.yaml": BASE_ISVC, "kustomization.yaml": kustomization})
    result = manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "serving")

    after = _read(tmp_path, "kustomization.yaml")
    expected = kustomization.replace(textwrap.indent(textwrap.dedent("""\
        - op: add
          path: /spec/predictor/model/args/-
          value: --speculative-config
        - op: add
          path: /spec/predictor/model/args/-
          value: '{"method":"ngram","num_speculative_tokens":4}'
        """), " " * 6), "")
    expected = _without_lines(expected, "--speculative-config=")
    assert after == expected
    kust = _documents(after)[0]
    ops = yaml_roundtrip.load(kust["patches"][0]["patch"])
    assert [dict(op) for op in ops] == [{"op": "add", "path": "/metadata/labels/tier", "value": "prod"}]
    assert _no_flag_in(yaml_roundtrip.load(kust["patches"][1]["patch"]))
    assert [f["file"] for f in result["files"]] == ["kustomization.yaml"] and len(result["removed"]) == 2


def test_json6902_patch_file_add_and_whole_list_replace(tmp_path):
    ops_add = textwrap.dedent("""\
        - op: add
          path: /spec/predictor/model/args/-
          value: --speculative-config={"method":"ngram","num_speculative_tokens":5}
        - op: replace
          path: /spec/predictor/model/args/0
          value: --dtype=bfloat16
        """)
    ops_replace = textwrap.dedent("""\
        - op: replace
          path: /spec/predictor/model/args
          value:
            - --dtype=half
            - --speculative-config
            - '{"method":"ngram","num_speculative_tokens":5}'
            - --seed=7
        """)
    kustomization = textwrap.dedent("""\
        resources: [isvc.yaml]
        patchesJson6902:
          - target: {group: serving.kserve.io, version: v1beta1, kind: InferenceService, name: llm}
            path: add.yaml
          - target: {kind: InferenceService, name: llm}
            path: replace.yaml
          - target: {kind: InferenceService, name: not-this-one}
            path: other.yaml
        """)
    _write(tmp_path, {"isvc.yaml": BASE_ISVC, "kustomization.yaml": kustomization, "add.yaml": ops_add,
                      "replace.yaml": ops_replace, "other.yaml": ops_add})
    result = manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "serving")

    assert _read(tmp_path, "add.yaml") == "\n".join(ops_add.splitlines()[3:]) + "\n"
    assert _read(tmp_path, "replace.yaml") == _without_lines(ops_replace, "--speculative-config", "method")
    assert _read(tmp_path, "other.yaml") == ops_add  # its target is another object
    assert sorted(f["file"] for f in result["files"]) == ["add.yaml", "replace.yaml"]


def test_collection_render_layout(tmp_path):
    """roles/inference_service/tasks/gitops.yml writes one manifest per object and a kustomization.yaml listing them."""
    manifest = textwrap.dedent("""\
        apiVersion: serving.kserve.io/v1beta1
        kind: InferenceService
        metadata:
          name: llm
          namespace: serving
          labels:
            app.kubernetes.io/managed-by: alauda.spec_decoding
        spec:
          predictor:
            model:
              modelFormat:
                name: vllm
              runtime: vllm-runtime
              storageUri: pvc://models/llm
              args:
              - --served-model-name=llm
              - --speculative-config
              - '{"method":"eagle3","model":"/mnt/models/draft","num_speculative_tokens":3}'
        """)
    _write(tmp_path, {"gitops/llm.yaml": manifest, "gitops/alerts.yaml": "kind: PrometheusRule\nmetadata:\n  name: x\n",
                      "gitops/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                                                   "resources:\n- alerts.yaml\n- llm.yaml\n"})
    result = manifest_edit.strip_in_directory(str(tmp_path), "gitops", "InferenceService", "llm", "serving")
    assert _read(tmp_path, "gitops/llm.yaml") == _without_lines(manifest, "speculative-config", "eagle3")
    assert manifest_edit.removed_summary(result["removed"]).startswith('--speculative-config {"method":"eagle3"')


def test_llminferenceservice_additional_args_env_and_serving_runtime(tmp_path):
    llm = textwrap.dedent("""\
        apiVersion: serving.kserve.io/v1alpha1
        kind: LLMInferenceService
        metadata:
          name: chat
        spec:
          template:
            containers:
              - name: main
                env:
                  - name: VLLM_ADDITIONAL_ARGS
                    value: "--max-num-seqs 32 --speculative-config '{\\"method\\":\\"ngram\\",\\"num_speculative_tokens\\":3}'"
        """)
    runtime = textwrap.dedent("""\
        apiVersion: serving.kserve.io/v1alpha1
        kind: ServingRuntime
        metadata:
          name: vllm-rt
        spec:
          containers:
            - name: kserve-container
              args: [--port=8080, --speculative-config, '{"method":"ngram"}']
        """)
    _write(tmp_path, {"llm.yaml": llm, "rt.yaml": runtime})
    manifest_edit.strip_in_directory(str(tmp_path), ".", "LLMInferenceService", "chat", "serving")
    value = _documents(_read(tmp_path, "llm.yaml"))[0]["spec"]["template"]["containers"][0]["env"][0]["value"]
    assert value == "--max-num-seqs 32"
    manifest_edit.strip_in_directory(str(tmp_path), ".", "ServingRuntime", "vllm-rt", "serving")
    assert _read(tmp_path, "rt.yaml") == runtime.replace("[--port=8080, --speculative-config, '{\"method\":\"ngram\"}']",
                                                         "[--port=8080]")


def test_helm_chart_refused_naming_chart_and_value(tmp_path):
    _write(tmp_path, {"charts/llm/Chart.yaml": "apiVersion: v2\nname: llm-serving\nversion: 1.2.0\n",
                      "charts/llm/values.yaml": "model:\n  name: llm\n  extraArgs: \"--speculative-config {\\\"method\\\":\\\"ngram\\\"}\"\n",
                      "charts/llm/templates/isvc.yaml": "kind: InferenceService\nmetadata:\n  name: {{ .Values.model.name }}\n"})
    before = _read(tmp_path, "charts/llm/values.yaml")
    with pytest.raises(ValidationError) as info:
        manifest_edit.strip_in_directory(str(tmp_path), "charts/llm", "InferenceService", "llm", "serving")
    text = str(info.value)
    assert "Helm chart 'llm-serving' at charts/llm" in text and "charts/llm/values.yaml: model.extraArgs" in text
    assert "rollback_mode: emergency" in text and info.value.field == "path"
    assert _read(tmp_path, "charts/llm/values.yaml") == before


def test_helm_owner_refused_even_without_chart_in_path(tmp_path):
    _write(tmp_path, {"a.yaml": PLAIN})
    with pytest.raises(ValidationError) as info:
        manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "serving", owner_kind="helm")
    assert "managed by Helm" in str(info.value)
    assert _read(tmp_path, "a.yaml") == PLAIN


def test_nothing_found_names_path_object_and_fix(tmp_path):
    _write(tmp_path, {"apps/x/cm.yaml": "kind: ConfigMap\nmetadata:\n  name: x\n",
                      "apps/x/kustomization.yaml": "resources:\n  - cm.yaml\n  - https://github.com/org/repo//base?ref=v1\n"})
    with pytest.raises(ValidationError) as info:
        manifest_edit.strip_in_directory(str(tmp_path), "apps/x", "InferenceService", "llm", "serving")
    text = str(info.value)
    assert "no file under 'apps/x' defines InferenceService serving/llm" in text
    assert "remote resources not followed: https://github.com/org/repo//base?ref=v1" in text
    assert "rollback_git_path" in text
    with pytest.raises(ValidationError) as missing:
        manifest_edit.strip_in_directory(str(tmp_path), "apps/nope", "InferenceService", "llm", "serving")
    assert "'apps/nope' is not a directory" in str(missing.value)


def test_refused_strip_leaves_the_file(tmp_path):
    """A flag the editor cannot strip word-exact (a run-time expansion) is refused as the live rollback refuses it."""
    text = PLAIN.replace("--port 8080 \\\n", "--port 8080 $EXTRA_ARGS \\\n")
    assert text != PLAIN
    _write(tmp_path, {"a.yaml": text})
    with pytest.raises(ValidationError):
        manifest_edit.strip_in_directory(str(tmp_path), ".", "InferenceService", "llm", "serving")
    assert _read(tmp_path, "a.yaml") == text


def test_merge_edit_keeps_other_indentation():
    original = "a:\n    b:\n        - x\n        - y\n"
    unedited = "a:\n  b:\n  - x\n  - y\n"
    edited = "a:\n  b:\n  - y\n"
    assert yaml_roundtrip.merge_edit(original, unedited, edited) == "a:\n    b:\n        - y\n"


@pytest.mark.parametrize("command_style", ["bash", "args"])
def test_the_collections_own_render(tmp_path, command_style):
    """What the inference_service role commits (isvc_manifest's manifest_yaml and the kustomization filter's file, as
    roles/inference_service/tasks/gitops.yml writes them): the strip leaves the render exactly as a render without
    speculative decoding would differ from it on the flag's lines only."""
    from ansible_collections.alauda.spec_decoding.plugins.filter.kustomization import kustomization  # pylint: disable=import-outside-toplevel
    from tests.module_run import run_module  # pylint: disable=import-outside-toplevel
    args = {"name": "llm", "namespace": "serving", "method": "ngram", "artifact_mode": "pvc", "artifacts": {"pvc_name": "model-store"},
            "runtime": "vllm-runtime", "vllm_version": "0.32.0", "gpu_count": 0, "command_style": command_style}
    rendered = run_module("isvc_manifest", args)
    assert not rendered.failed, rendered.msg
    text = rendered["manifest_yaml"]
    _write(tmp_path, {"gitops/" + rendered["filename"]: text, "gitops/kustomization.yaml": kustomization([rendered["filename"]])})

    result = manifest_edit.strip_in_directory(str(tmp_path), "gitops", "InferenceService", "llm", "serving")
    after = _read(tmp_path, "gitops/" + rendered["filename"])
    model = _documents(after)[0]["spec"]["predictor"]["model"]
    assert find_speculative_config([str(w) for w in model.get("command") or []], [str(w) for w in model.get("args") or []]) is None
    # vLLM refuses --per-request-spec-decode-metrics without a speculative config: the strip takes it too
    expected = _without_lines(text, "--speculative-config", '{"method"', "--per-request-spec-decode-metrics", "- summary")
    if command_style == "bash":
        # the flag ended the continued command: the line before it loses its ` \`
        expected = expected.replace("          --seed 42 \\\n", "          --seed 42\n")
    assert after == expected
    assert result["files"][0]["exact"] is True
    assert manifest_edit.removed_summary(result["removed"]) == (
        '--speculative-config {"method":"ngram","num_speculative_tokens":5,"prompt_lookup_max":4,"prompt_lookup_min":2}')
