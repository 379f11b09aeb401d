"""One cross-collection corpus of bad input: every module, the filters, the roles and the playbooks.

Each case names an entry point (module / filter / role / playbook), its input, the field its message must name
and the words of the fix the message must give. Module, filter and role cases run in ONE ansible-playbook run
(a block/rescue per case captures the message); playbook cases each run their own ansible-playbook.

Nothing may be written by a failed case. After every case the play calls a witness in this process (a loopback
HTTP endpoint, through the url lookup) that snapshots the real state: the resourceVersion of every
InferenceService and of the ConfigMaps, Secrets, ServiceAccounts, PVCs, Jobs, CronJobs, Roles and RoleBindings
in the test namespace (a pre-existing, Ready InferenceService is the target of the cluster cases), the catalog,
tags and stored files of a real loopback registry (htpasswd auth), and every file under the cases' output
directories (GitOps, reports, bundles, schedules, archives). Each snapshot must equal the one before the case.
"""
from __future__ import annotations

import base64
import copy
import http.server
import importlib
import json
import os
import threading
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from tests.ansible_run import DID_NOT_FAIL, REPO, run_cases, run_playbook
from tests.module_run import run_module
from tests.testbed import registry as testbed_registry

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
LIVE = "corpus-live"
GUIDE = os.path.join(REPO, "tests", "unit", "plugins", "module_utils", "data", "rollback", "guide_example2_eagle3.yaml")
USER, PASSWORD = "corpus", "corpus-Pa55-word"
NAMESPACED = {  # what a failed case could have created or changed in the namespace
    "configmaps": "/api/v1/namespaces/{ns}/configmaps",
    "secrets": "/api/v1/namespaces/{ns}/secrets",
    "serviceaccounts": "/api/v1/namespaces/{ns}/serviceaccounts",
    "pvcs": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    "jobs": "/apis/batch/v1/namespaces/{ns}/jobs",
    "cronjobs": "/apis/batch/v1beta1/namespaces/{ns}/cronjobs",
    "roles": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "rolebindings": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "inferenceservices": "/apis/%s/%s/namespaces/{ns}/%s" % (GROUP, VERSION, PLURAL),
}

# Placeholders filled in per run: @NS@ namespace, @LIVE@ the pre-existing InferenceService, @REG@ registry host,
# @OUT@ this case's own output directory (absent before the case), @MODEL@ a small model directory, @EMPTY@ an
# empty directory, @FILE@ a regular file, @USER@/@PASS@ the registry's credentials.
DEPLOY_GITOPS = {"inference_service_target": "gitops", "inference_service_gitops_dir": "@OUT@", "inference_service_name": "corpus",
                 "inference_service_namespace": "@NS@", "inference_service_method": "eagle3", "inference_service_artifact_mode": "pvc",
                 "inference_service_artifacts": {"pvc_name": "model-store"}, "inference_service_runtime": "aml-vllm-0.32.0",
                 "inference_service_vllm_version": "0.32.0", "inference_service_gpu_count": 0}
DEPLOY_CLUSTER = dict(DEPLOY_GITOPS, inference_service_target="cluster", inference_service_name="@LIVE@", inference_service_verify=False,
                      inference_service_wait_timeout=30, inference_service_artifact_mode="storage_uris",
                      inference_service_artifacts={"target_uri": "pvc://model-store/target", "draft_uri": "pvc://model-store/draft"})
PB_DEPLOY = {"spec_decoding_hosts": "localhost", "spec_decoding_target": "gitops", "spec_decoding_gitops_dir": "@OUT@",
             "spec_decoding_isvc_name": "corpus", "spec_decoding_namespace": "@NS@", "spec_decoding_runtime": "aml-vllm-0.32.0",
             "spec_decoding_vllm_version": "0.32.0", "spec_decoding_gpu_count": 0, "spec_decoding_verify": False,
             "spec_decoding_artifact_mode": "pvc", "spec_decoding_artifacts": {"pvc_name": "model-store"}}
PB_CLUSTER = dict(PB_DEPLOY, spec_decoding_target="cluster", spec_decoding_isvc_name="@LIVE@", spec_decoding_wait_timeout=30,
                  spec_decoding_artifact_mode="storage_uris",
                  spec_decoding_artifacts={"target_uri": "pvc://model-store/target", "draft_uri": "pvc://model-store/draft"})
MODELCAR = {"target_dir": "@MODEL@", "image": "@REG@/corpus/llama:v1", "username": "@USER@", "password": "@PASS@", "tls_verify": False,
            "cache_dir": "@OUT@/cache"}
BUILD = {"target_dir": "@MODEL@", "username": "@USER@", "password": "@PASS@", "tls_verify": False}
STAGE = {"stage_pvc_name": "corpus-models", "stage_pvc_namespace": "@NS@", "stage_pvc_min_size": "1Mi",
         "stage_pvc_items": [{"name": "org/llama", "subdir": "target", "source": "https://mirror.internal.example/llama/"},
                             {"name": "org/draft", "subdir": "draft", "source": "https://mirror.internal.example/draft/"}],
         "stage_pvc_list_sources": False, "stage_pvc_size": "2Gi"}
PLAN = {"pvc_name": "corpus-models", "list_sources": False, "size": "2Gi",
        "items": [{"name": "org/llama", "subdir": "target", "source": "https://mirror.internal.example/llama/"}]}
BENCH = {"benchmark_namespace": "@NS@", "benchmark_baseline_url": "http://127.0.0.1:9/v1", "benchmark_candidate_url": "http://127.0.0.1:9/v1",
         "benchmark_read_cluster": False, "benchmark_report_dir": "@OUT@", "benchmark_model_id": "org/llama", "benchmark_model_dtype": "bfloat16",
         "benchmark_gpu_model": "none", "benchmark_gpu_count": 0, "benchmark_runs_per_prompt": 5, "benchmark_warmup": 3}
SPEC_BENCH = {"baseline_url": "http://127.0.0.1:9/v1", "candidate_url": "http://127.0.0.1:9/v1", "report_dir": "@OUT@",
              "runs_per_prompt": 5, "warmup": 3}
IM = {"name": "llama", "namespace": "@NS@", "runtime": "r", "method": "ngram", "artifact_mode": "single", "artifacts": {"storage_uri": "pvc://m/"}}
CREDS = {"artifact_credentials_target": "cluster", "artifact_credentials_namespace": "@NS@",
         "artifact_credentials_service_account_name": "corpus-sa", "artifact_credentials_hf_token": "hf_corpus_token_value"}
CREDS_GITOPS = {"artifact_credentials_target": "gitops", "artifact_credentials_namespace": "@NS@",
                "artifact_credentials_gitops_dir": "@OUT@", "artifact_credentials_gitops_sources": ["hf"]}
TROUBLE = {"troubleshoot_names": ["@NS@/@LIVE@"], "troubleshoot_namespace": "@NS@", "troubleshoot_dest": "@OUT@",
           "troubleshoot_kserve_namespaces": ["@NS@"], "troubleshoot_metrics": False, "troubleshoot_engine": False}
SCHEDULE = {"rollback_schedule_namespace": "@NS@", "rollback_schedule_names": ["@LIVE@"], "rollback_schedule_output_dir": "@OUT@",
            "rollback_schedule_apply": True, "rollback_schedule_cronjob_api_version": "batch/v1beta1"}
ROLLBACK = {"rollback_names": ["@NS@/@LIVE@"], "rollback_wait_timeout": 30, "rollback_wait_sleep": 1, "rollback_verify_delay": 1}
VERIFY = {"verify_name": "@LIVE@", "verify_namespace": "@NS@", "verify_wait_timeout": 30, "verify_wait_interval": 1, "verify_metrics": False}
SPEC = {"method": "eagle3", "model": "/mnt/models/draft", "num_speculative_tokens": 3}


def _with(base, **more):
    out = copy.deepcopy(base)
    out.update(more)
    return out


# (id, entry, what: module name / filter expression / role name / playbook path, input, field named, fix wording)
CASES = [
    # --- speculative_config (module) -------------------------------------------------------------------------------
    ("sc-zero-tokens", "module", "speculative_config", {"config": _with(SPEC, num_speculative_tokens=0)}, "num_speculative_tokens", "Fix:"),
    ("sc-unknown-method", "module", "speculative_config", {"config": _with(SPEC, method="eagle9")}, "method", "Fix:"),
    ("sc-tp-key", "module", "speculative_config", {"config": _with(SPEC, tensor_parallel_size=2)}, "tensor_parallel_size",
     "draft_tensor_parallel_size"),
    ("sc-ngram-min-gt-max", "module", "speculative_config",
     {"config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2}}, "prompt_lookup_min", "Fix:"),
    ("sc-draft-no-model", "module", "speculative_config", {"config": {"method": "eagle3", "num_speculative_tokens": 3}}, "model", "Fix:"),
    ("sc-bad-json", "module", "speculative_config", {"config": "{\"method\": \"ngram\", "}, "config", "Fix:"),
    ("sc-old-vllm-method", "module", "speculative_config", {"config": _with(SPEC, method="draft_model"), "vllm_version": "0.11.0"},
     "method", "Fix:"),
    ("sc-bad-version", "module", "speculative_config", {"config": SPEC, "vllm_version": "latest-and-greatest"}, "vllm_version", "Fix:"),
    ("sc-preset-override-bad", "module", "speculative_config", {"preset": "ngram", "overrides": {"num_speculative_tokens": -1}},
     "num_speculative_tokens", "Fix:"),
    # --- isvc_manifest (module) ------------------------------------------------------------------------------------
    ("im-bad-name", "module", "isvc_manifest", {"name": "Llama_EAGLE3", "namespace": "@NS@", "runtime": "r", "method": "ngram"}, "name", "Fix:"),
    ("im-bad-namespace", "module", "isvc_manifest", {"name": "llama", "namespace": "Models!", "runtime": "r", "method": "ngram"},
     "namespace", "Fix:"),
    ("im-gpu-util", "module", "isvc_manifest", _with(IM, gpu_memory_utilization=1.5), "gpu_memory_utilization", "Fix:"),
    ("im-relative-mount", "module", "isvc_manifest",
     {"name": "llama", "namespace": "@NS@", "runtime": "r", "method": "eagle3", "artifact_mode": "storage_uris",
      "artifacts": {"target_uri": "hf://a/t", "draft_uri": "hf://a/d", "draft_mount_path": "mnt/draft"}}, "mountPath", "Fix:"),
    ("im-bad-uri-scheme", "module", "isvc_manifest",
     {"name": "llama", "namespace": "@NS@", "runtime": "r", "method": "eagle3", "artifact_mode": "storage_uris",
      "artifacts": {"target_uri": "ftp://a/t", "draft_uri": "pvc://a/d"}}, "target_uri", "Fix:"),
    ("im-bad-modelcar-image", "module", "isvc_manifest",
     {"name": "llama", "namespace": "@NS@", "runtime": "r", "method": "eagle3", "artifact_mode": "modelcar",
      "artifacts": {"modelcar_image": "Registry.Local/Models/LLAMA"}}, "modelcar_image", "Fix:"),
    ("im-removed-flag", "module", "isvc_manifest", _with(IM, extra_args=["--num-speculative-tokens", "3"]), "extra_args", "Fix:"),
    ("im-replicas-inverted", "module", "isvc_manifest", _with(IM, min_replicas=3, max_replicas=1), "replicas", "Fix:"),
    # --- isvc_wait (module) ----------------------------------------------------------------------------------------
    ("iw-bad-name", "module", "isvc_wait", {"name": "Bad_Name", "namespace": "@NS@", "timeout": 5}, "name", "Fix:"),
    # --- engine_config_info (module) -------------------------------------------------------------------------------
    ("ec-missing-log", "module", "engine_config_info", {"log_path": "@OUT@/nope.log"}, "log_path", "Fix:"),
    ("ec-expected-method", "module", "engine_config_info", {"log_text": "x", "expected": {"method": "eagle9"}}, "expected.method", "Fix:"),
    ("ec-expected-tokens", "module", "engine_config_info", {"log_text": "x", "expected": {"num_speculative_tokens": 0}},
     "expected.num_speculative_tokens", "Fix:"),
    ("ec-bad-name", "module", "engine_config_info", {"name": "Bad_Name", "namespace": "@NS@", "timeout": 5}, "name", "Fix:"),
    # --- speculative_metrics_info (module) -------------------------------------------------------------------------
    ("sm-bad-url", "module", "speculative_metrics_info", {"url": "ftp://127.0.0.1:9/metrics"}, "url", "Fix:"),
    ("sm-missing-file", "module", "speculative_metrics_info", {"metrics_path": "@OUT@/nope.txt"}, "metrics_path", "Fix:"),
    ("sm-rate-over-one", "module", "speculative_metrics_info", {"metrics_text": "# nothing\n", "min_acceptance_rate": 1.5},
     "min_acceptance_rate", "Fix:"),
    ("sm-no-source", "module", "speculative_metrics_info", {"namespace": "@NS@"}, "url", "one of the following is required"),
    # --- isvc_speculative (module) ---------------------------------------------------------------------------------
    ("is-bad-config", "module", "isvc_speculative", {"name": "@LIVE@", "namespace": "@NS@", "state": "present",
                                                     "config": _with(SPEC, num_speculative_tokens=0)}, "num_speculative_tokens", "Fix:"),
    ("is-present-no-config", "module", "isvc_speculative", {"name": "@LIVE@", "namespace": "@NS@", "state": "present"}, "config",
     "restore_backup"),
    ("is-file-backup-no-path", "module", "isvc_speculative", {"name": "@LIVE@", "namespace": "@NS@", "backup": "file"}, "backup_file",
     "backup"),
    ("is-negative-retries", "module", "isvc_speculative", {"name": "@LIVE@", "namespace": "@NS@", "retries": -1}, "retries", "0 or more"),
    ("is-bad-name", "module", "isvc_speculative", {"name": "Bad_Name", "namespace": "@NS@"}, "name", "Fix:"),
    # --- modelcar_image (module, real registry) --------------------------------------------------------------------
    ("mc-no-registry", "module", "modelcar_image", _with(MODELCAR, image="corpus/llama:v1"), "image", "Fix:"),
    ("mc-upper-repo", "module", "modelcar_image", _with(MODELCAR, image="@REG@/Corpus/LLAMA:v1"), "image", "Fix:"),
    ("mc-bad-tag", "module", "modelcar_image", _with(MODELCAR, image="@REG@/corpus/llama:bad tag!"), "image", "Fix:"),
    ("mc-url-scheme", "module", "modelcar_image", _with(MODELCAR, image="http://@REG@/corpus/llama:v1"), "image", "Fix:"),
    ("mc-missing-dir", "module", "modelcar_image", _with(MODELCAR, target_dir="@OUT@/no-such-model"), "target_dir", "Fix:"),
    ("mc-empty-dir", "module", "modelcar_image", _with(MODELCAR, target_dir="@EMPTY@"), "target_dir", "Fix:"),
    ("mc-file-not-dir", "module", "modelcar_image", _with(MODELCAR, target_dir="@FILE@"), "target_dir", "Fix:"),
    ("mc-same-layout", "module", "modelcar_image", _with(MODELCAR, draft_dir="@MODEL@", layout={"target": "m", "draft": "m"}),
     "layout", "Fix:"),
    ("mc-dotdot-layout", "module", "modelcar_image", _with(MODELCAR, layout={"target": "..", "draft": "draft"}), "layout.target", "Fix:"),
    ("mc-wrong-password", "module", "modelcar_image", _with(MODELCAR, password="not-the-password"), "password", "Fix:"),
    ("mc-user-no-password", "module", "modelcar_image", {"target_dir": "@MODEL@", "image": "@REG@/corpus/llama:v1", "username": "@USER@",
                                                         "tls_verify": False, "cache_dir": "@OUT@/cache"}, "password", "required together"),
    ("mc-missing-ca", "module", "modelcar_image", _with(MODELCAR, tls_verify=True, ca_file="@OUT@/ca.pem"), "ca_file", "Fix:"),
    ("mc-zero-jobs", "module", "modelcar_image", _with(MODELCAR, jobs=0), "jobs", "Fix:"),
    ("mc-one-layer", "module", "modelcar_image", _with(MODELCAR, max_layers=1), "max_layers", "Fix:"),
    ("mc-bad-auth-file", "module", "modelcar_image", {"target_dir": "@MODEL@", "image": "@REG@/corpus/llama:v1", "auth_file": "@FILE@",
                                                      "tls_verify": False, "cache_dir": "@OUT@/cache"}, "auth_file", "Fix:"),
    # --- pvc_stage_plan (module) -----------------------------------------------------------------------------------
    ("ps-bad-pvc-name", "module", "pvc_stage_plan", _with(PLAN, pvc_name="Model_Store"), "pvc_name", "Fix:"),
    ("ps-no-items", "module", "pvc_stage_plan", _with(PLAN, items=[]), "items", "Fix:"),
    ("ps-ftp-source", "module", "pvc_stage_plan", _with(PLAN, items=[{"name": "a", "subdir": "t", "source": "ftp://x/y"}]),
     "items[0].source", "Fix:"),
    ("ps-dotdot-subdir", "module", "pvc_stage_plan", _with(PLAN, items=[{"name": "a", "subdir": "../etc", "source": "https://m.example/a/"}]),
     "items[0].subdir", "Fix:"),
    ("ps-duplicate-subdir", "module", "pvc_stage_plan",
     _with(PLAN, items=[{"name": "a", "subdir": "t", "source": "https://m.example/a/"}, {"name": "b", "subdir": "t", "source": "https://m.example/b/"}]),
     "subdir", "Fix:"),
    ("ps-bad-size", "module", "pvc_stage_plan", _with(PLAN, size="lots"), "size", "Fix:"),
    ("ps-airgap-hub", "module", "pvc_stage_plan", _with(PLAN, air_gapped=True, items=[{"name": "a", "subdir": "t", "source": "hf://org/llama"}]),
     "hf_endpoint", "air-gapped"),
    ("ps-bad-access-mode", "module", "pvc_stage_plan", _with(PLAN, access_modes=["ReadWriteSometimes"]), "access_modes", "Fix:"),
    ("ps-bad-hf-endpoint", "module", "pvc_stage_plan", _with(PLAN, hf_endpoint="mirror.internal.example"), "hf_endpoint", "Fix:"),
    # --- spec_benchmark (module) -----------------------------------------------------------------------------------
    ("sb-no-urls", "module", "spec_benchmark", {"report_dir": "@OUT@"}, "baseline_url", "candidate_url"),
    ("sb-bad-scheme", "module", "spec_benchmark", _with(SPEC_BENCH, candidate_url="ftp://127.0.0.1:9/v1"), "candidate_url", "Fix:"),
    ("sb-zero-concurrency", "module", "spec_benchmark", _with(SPEC_BENCH, concurrency=0), "concurrency", "Fix:"),
    ("sb-negative-temperature", "module", "spec_benchmark", _with(SPEC_BENCH, temperature=-1.0), "temperature", "Fix:"),
    ("sb-report-name-path", "module", "spec_benchmark", _with(SPEC_BENCH, report_name="../escape"), "report_name", "Fix:"),
    ("sb-unknown-tolerance", "module", "spec_benchmark", _with(SPEC_BENCH, tolerances={"speedup_typo": 0.1}), "tolerances", "Fix:"),
    ("sb-missing-prompts", "module", "spec_benchmark", _with(SPEC_BENCH, prompts_file="@OUT@/prompts.jsonl"), "prompts_file", "Fix:"),
    # --- troubleshoot_bundle (module) ------------------------------------------------------------------------------
    ("tb-bad-ref", "module", "troubleshoot_bundle", {"names": ["a/b/c"], "namespace": "@NS@", "dest": "@OUT@"}, "names", "Fix:"),
    ("tb-bad-name", "module", "troubleshoot_bundle", {"names": ["Bad_Name"], "namespace": "@NS@", "dest": "@OUT@"}, "names", "Fix:"),
    ("tb-zero-tail", "module", "troubleshoot_bundle", {"names": ["@LIVE@"], "namespace": "@NS@", "dest": "@OUT@", "tail_lines": 0},
     "tail_lines", "Fix:"),
    ("tb-archive-path", "module", "troubleshoot_bundle", {"names": ["@LIVE@"], "namespace": "@NS@", "dest": "@OUT@",
                                                          "archive_name": "../escape.tar.gz"}, "archive_name", "Fix:"),
    ("tb-dest-is-file", "module", "troubleshoot_bundle", {"names": ["@LIVE@"], "namespace": "@NS@", "dest": "@FILE@"}, "dest", "Fix:"),
    # --- filters ---------------------------------------------------------------------------------------------------
    ("f-sc-json-zero", "filter", "corpus_in | alauda.spec_decoding.speculative_config_json", _with(SPEC, num_speculative_tokens=0),
     "num_speculative_tokens", "Fix:"),
    ("f-sc-json-old-vllm", "filter", "corpus_in | alauda.spec_decoding.speculative_config_json('0.11.0')", _with(SPEC, method="suffix"),
     "method", "Fix:"),
    ("f-strip-not-list", "filter", "corpus_in | alauda.spec_decoding.strip_speculative_config", "--speculative-config {}",
     "strip_speculative_config", "pass the list itself"),
    ("f-creds-not-dict", "filter", "corpus_in | alauda.spec_decoding.credential_manifests", ["x"], "settings", "dict"),
    ("f-creds-bad-target", "filter", "corpus_in | alauda.spec_decoding.credential_manifests('helm')",
     {"namespace": "ns", "service_account_name": "sa"}, "target", "cluster or gitops"),
    ("f-creds-registry-no-server", "filter", "corpus_in | alauda.spec_decoding.credential_manifests",
     {"namespace": "ns", "service_account_name": "sa", "registries": [{"username": "u", "password": "p"}]}, "registries[0].server", "e.g."),
    ("f-creds-bad-sa", "filter", "corpus_in | alauda.spec_decoding.credential_manifests",
     {"namespace": "ns", "service_account_name": "Bad_SA", "hf_token": "x"}, "service_account_name", "Fix:"),
    ("f-kustomization-bad", "filter", "corpus_in | alauda.spec_decoding.kustomization", ["../outside.yaml"], "resources", "Fix:"),
    # --- roles -----------------------------------------------------------------------------------------------------
    ("r-deploy-bad-name", "role", "inference_service", _with(DEPLOY_GITOPS, inference_service_name="Llama_EAGLE3"), "name", "Fix:"),
    ("r-deploy-zero-tokens", "role", "inference_service", _with(DEPLOY_GITOPS, inference_service_speculative={"num_speculative_tokens": 0}),
     "speculative.num_speculative_tokens", "Fix:"),
    ("r-deploy-mode-change", "role", "inference_service", _with(DEPLOY_CLUSTER, inference_service_deployment_mode="Knative"),
     "deployment_mode", "Standard"),
    ("r-deploy-build-then-bad", "role", "inference_service",
     _with(DEPLOY_GITOPS, inference_service_artifact_mode="modelcar", inference_service_artifacts={"modelcar_image": "@REG@/corpus/deploy:v1"},
           inference_service_modelcar_build=BUILD, inference_service_speculative={"num_speculative_tokens": 0}),
     "speculative.num_speculative_tokens", "Fix:"),
    ("r-verify-rate", "role", "verify", _with(VERIFY, verify_metrics=True, verify_metrics_url="http://127.0.0.1:9/metrics",
                                              verify_min_acceptance_rate=1.5), "min_acceptance_rate", "Fix:"),
    ("r-verify-expected", "role", "verify", _with(VERIFY, verify_expected={"method": "eagle9"}), "expected.method", "Fix:"),
    ("r-rollback-nothing", "role", "rollback", _with(ROLLBACK, rollback_names=[]), "rollback_names", "rollback_label_selector"),
    ("r-rollback-guard", "role", "rollback", _with(ROLLBACK, rollback_guard="optimistic"), "rollback_guard", "must be one of"),
    ("r-rollback-bad-ref", "role", "rollback", _with(ROLLBACK, rollback_names=["@NS@/@LIVE@/extra"]), "rollback_names", "Fix:"),
    ("r-stage-bad-name", "role", "stage_pvc", _with(STAGE, stage_pvc_name="Model_Store"), "stage_pvc_name", "Fix:"),
    ("r-stage-verify", "role", "stage_pvc", _with(STAGE, stage_pvc_verify="deep"), "stage_pvc_verify", "must be one of"),
    ("r-stage-airgap-hub", "role", "stage_pvc",
     _with(STAGE, stage_pvc_air_gapped=True, stage_pvc_items=[{"name": "org/llama", "subdir": "target", "source": "hf://org/llama"}]),
     "stage_pvc_hf_endpoint", "air-gapped"),
    ("r-bench-nothing", "role", "benchmark", _with(BENCH, benchmark_baseline_url="", benchmark_candidate_url=""), "benchmark_baseline_name",
     "benchmark_baseline_url"),
    ("r-bench-concurrency", "role", "benchmark", _with(BENCH, benchmark_concurrency=0), "concurrency", "Fix:"),
    ("r-creds-no-server", "role", "artifact_credentials", _with(CREDS, artifact_credentials_registries=[{"username": "u", "password": "p"}]),
     "server", "missing required arguments"),
    ("r-creds-s3-half", "role", "artifact_credentials", _with(CREDS, artifact_credentials_s3={"access_key_id": "AKIA"}), "s3",
     "secret_access_key"),
    ("r-creds-gitops-style", "role", "artifact_credentials", _with(CREDS_GITOPS, artifact_credentials_gitops_style="plain"),
     "artifact_credentials_gitops_style", "must be one of"),
    ("r-trouble-bad-ref", "role", "troubleshoot", _with(TROUBLE, troubleshoot_names=["a/b/c"]), "names", "Fix:"),
    ("r-schedule-cron-fields", "role", "rollback_schedule", _with(SCHEDULE, rollback_schedule_cron="0 3 * *"), "rollback_schedule_cron",
     "5-field"),
    ("r-schedule-cron-range", "role", "rollback_schedule", _with(SCHEDULE, rollback_schedule_cron="61 3 * * *"), "rollback_schedule_cron",
     "Fix:"),
    ("r-schedule-bad-target", "role", "rollback_schedule", _with(SCHEDULE, rollback_schedule_names=["Bad_Name"]), "rollback_schedule_names",
     "Fix:"),
    # --- playbooks -------------------------------------------------------------------------------------------------
    ("p-deploy-eagle3-bad-speculative", "playbook", "playbooks/deploy-eagle3.yml",
     _with(PB_DEPLOY, spec_decoding_speculative={"num_speculative_tokens": 0}), "speculative.num_speculative_tokens", "Fix:"),
    ("p-deploy-modelcar-bad-password", "playbook", "playbooks/deploy-eagle3.yml",
     _with(PB_DEPLOY, spec_decoding_artifact_mode="modelcar", spec_decoding_artifacts={"modelcar_image": "@REG@/corpus/pb:v1"},
           spec_decoding_modelcar_build=_with(BUILD, password="wrong-password")), "password", "Fix:"),
    ("p-verify-missing", "playbook", "playbooks/verify.yml", _with(VERIFY, verify_name="no-such-isvc"), "verify_name", "verify_namespace"),
    ("p-rollback-bad-backup", "playbook", "playbooks/rollback.yml", _with(ROLLBACK, rollback_backup="everywhere"), "rollback_backup",
     "must be one of"),
]


def _fill(value, subst):
    if isinstance(value, str):
        for key, rep in subst.items():
            value = value.replace(key, rep)
        return value
    if isinstance(value, list):
        return [_fill(v, subst) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, subst) for k, v in value.items()}
    return value


class Witness:
    """Snapshots of everything a failed case could have written, taken on request (GET /mark?case=ID)."""

    def __init__(self, api, namespace, reg, out_root):
        self.api, self.namespace, self.reg, self.out_root = api, namespace, reg, out_root
        self.marks = {}
        self.lock = threading.Lock()
        self.httpd = None

    def _registry(self, path):
        req = urllib.request.Request(self.reg.url + path)
        req.add_header("Authorization", "Basic " + base64.b64encode(("%s:%s" % (USER, PASSWORD)).encode()).decode())
        with urllib.request.urlopen(req, timeout=10) as resp:  # nosec - loopback test registry
            return json.loads(resp.read())

    def snapshot(self):
        state = {}
        for kind, path in NAMESPACED.items():
            items = self.api.get(path.format(ns=self.namespace))["items"]
            state[kind] = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in items}
        repos = self._registry("/v2/_catalog").get("repositories") or []
        state["registry"] = {r: sorted(self._registry("/v2/%s/tags/list" % r).get("tags") or []) for r in repos}
        files = {}
        for top in (self.reg.storage, self.out_root):
            for root, dirs, names in os.walk(top):
                for name in dirs + names:
                    full = os.path.join(root, name)
                    stat = os.lstat(full)
                    files[full] = (stat.st_size if name in names else "dir", stat.st_mtime_ns)
        state["files"] = files
        return state

    def start(self):
        witness = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 - http.server API
                case = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["case"][0]
                with witness.lock:
                    witness.marks[case] = witness.snapshot()
                body = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return "http://127.0.0.1:%d" % self.httpd.server_address[1]

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _diff(before, after):
    out = []
    for key in sorted(set(before) | set(after)):
        if key == "files":
            for path in sorted(set(before[key]) | set(after[key])):
                if before[key].get(path) != after[key].get(path):
                    out.append("file %s: %s -> %s" % (path, before[key].get(path), after[key].get(path)))
        elif before.get(key) != after.get(key):
            out.append("%s: %s -> %s" % (key, before.get(key), after.get(key)))
    return out


def _task(case, subst):
    cid, entry, what, data, _field, _fix = case
    data = _fill(data, subst)
    if entry == "module":
        return {"name": "case %s" % cid, "alauda.spec_decoding." + what: data}
    if entry == "filter":
        return {"name": "case %s" % cid, "ansible.builtin.set_fact": {"corpus_value": "{{ %s }}" % what}, "vars": {"corpus_in": data}}
    return {"name": "case %s" % cid, "ansible.builtin.include_role": {"name": "alauda.spec_decoding." + what}, "vars": data}


@pytest.fixture
def registry(tmp_path):
    testbed_registry.ensure_tools()
    with testbed_registry.Registry(str(tmp_path / "registry"), auth="htpasswd", users={USER: PASSWORD}) as reg:
        yield reg


def _live_service(k8s_client, kserve, namespace):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    kserve.set_behaviour(namespace, LIVE, ready_after=0.2)
    with open(GUIDE, encoding="utf-8") as fh:
        manifest = yaml.safe_load(fh)
    manifest["metadata"].update(name=LIVE, namespace=namespace)
    client.CustomObjectsApi(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
    isvc_wait.wait_ready(k8s_client, namespace, LIVE, timeout=60, interval=0.3)


def _settle(witness, seconds=3.0, timeout=60):
    """Wait until the namespace stops changing (stand-in reconcile, token controller)."""
    deadline = time.monotonic() + timeout
    last, since = witness.snapshot(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = witness.snapshot()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return last
    raise AssertionError("the test namespace kept changing: %s" % _diff(last, witness.snapshot()))


def _check(case, msg, before, after, problems, rows):
    cid, entry, what, _data, field, fix = case
    wrote = _diff(before, after)
    ok_fail = msg is not None and msg != DID_NOT_FAIL
    text = msg or ""
    ok_field, ok_fix = field in text, fix in text
    rows.append((cid, entry, what.split("|")[-1].strip().split("(")[0].replace("alauda.spec_decoding.", ""), field,
                 "ok" if ok_fail and ok_field and ok_fix and not wrote else "FAIL"))
    if not ok_fail:
        problems.append("%s: did not fail (%s)" % (cid, msg))
    elif not (ok_field and ok_fix):
        problems.append("%s: message lacks %s: %s" % (cid, " and ".join(repr(x) for x, ok in ((field, ok_field), (fix, ok_fix)) if not ok), text))
    if wrote:
        problems.append("%s: wrote %s" % (cid, wrote))


def _run_module(name, args):
    """Run a module in this process the way ansible's module runner does; its failure message, or __DID_NOT_FAIL__."""
    result = run_module(name, args)
    return result.msg if result.failed else DID_NOT_FAIL


def _run_filter(expr, value):
    """Call the filter the way the template does: `value | filter(args...)`."""
    from ansible.errors import AnsibleFilterError  # pylint: disable=import-outside-toplevel
    name, _sep, rest = expr.split("|", 1)[1].strip().partition("(")
    short = name.replace("alauda.spec_decoding.", "")
    plugin = importlib.import_module("ansible_collections.alauda.spec_decoding.plugins.filter." + short)
    args = [a.strip().strip("'") for a in rest.rstrip(")").split(",") if a.strip()]
    try:
        plugin.FilterModule().filters()[short](value, *args)
    except AnsibleFilterError as exc:
        return str(exc)
    return DID_NOT_FAIL


@pytest.mark.timeout(3000)
def test_bad_input_corpus(tmp_path, kubeconfig, k8s_client, controlplane, kserve, namespace, registry, monkeypatch):
    # pylint: disable=too-many-locals
    started = time.monotonic()
    monkeypatch.setenv("K8S_AUTH_KUBECONFIG", kubeconfig)
    out_root = tmp_path / "out"
    out_root.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    empty = tmp_path / "empty"
    empty.mkdir()
    afile = tmp_path / "a-file"
    afile.write_text("not a directory\n")
    _live_service(k8s_client, kserve, namespace)
    api = controlplane.rest()
    witness = Witness(api, namespace, registry, str(out_root))
    url = witness.start()
    problems, rows = [], []
    try:
        initial = _settle(witness)
        assert initial["registry"] == {} and LIVE in initial["inferenceservices"]

        def subst(cid):
            return {"@NS@": namespace, "@LIVE@": LIVE, "@REG@": registry.host, "@OUT@": str(out_root / cid), "@MODEL@": str(model),
                    "@EMPTY@": str(empty), "@FILE@": str(afile), "@USER@": USER, "@PASS@": PASSWORD}

        # Modules and filters: in this process, a snapshot before and after each case.
        for case in [c for c in CASES if c[1] in ("module", "filter")]:
            before = witness.snapshot()
            data = _fill(case[3], subst(case[0]))
            msg = _run_module(case[2], data) if case[1] == "module" else _run_filter(case[2], data)
            _check(case, msg, before, witness.snapshot(), problems, rows)

        # Roles: one ansible-playbook run, a block/rescue per case, the witness called after each case.
        batched = [c for c in CASES if c[1] == "role"]

        def witness_task(cid):
            return [{"name": "witness %s" % cid, "ansible.builtin.debug": {
                "msg": "{{ lookup('ansible.builtin.url', '%s/mark?case=%s', split_lines=false) }}" % (url, cid)}}]

        previous = witness.snapshot()
        run, results = run_cases(tmp_path, [(c[0], _task(c, subst(c[0]))) for c in batched], always=witness_task,
                                 kubeconfig=kubeconfig, timeout=1800)
        for case in batched:
            mark = witness.marks.get(case[0])
            assert mark is not None, "case %s never reached its witness:\n%s" % (case[0], run.output)
            _check(case, (results.get(case[0]) or {}).get("msg"), previous, mark, problems, rows)
            previous = mark

        # Playbooks: one ansible-playbook run each.
        for case in [c for c in CASES if c[1] == "playbook"]:
            cid = case[0]
            before = witness.snapshot()
            (tmp_path / cid).mkdir()
            pb = run_playbook(tmp_path / cid, case[2], extra_vars=_fill(case[3], subst(cid)), kubeconfig=kubeconfig, timeout=600)
            msg = DID_NOT_FAIL if pb.rc == 0 else "\n".join(str(r.get("msg", "")) for r in pb.failed) or pb.output
            _check(case, msg, before, witness.snapshot(), problems, rows)
    finally:
        witness.stop()
        api.close()
    entries = {}
    for row in rows:
        entries[row[1]] = entries.get(row[1], 0) + 1
    kinds = ", ".join("%s %d" % kv for kv in sorted(entries.items()))
    print("\nbad-input corpus: %d cases (%s) in %.0f s" % (len(rows), kinds, time.monotonic() - started))
    print("%-34s %-8s %-24s %-40s %s" % ("case", "entry", "target", "field", "result"))
    for row in rows:
        print("%-34s %-8s %-24s %-40s %s" % row)
    others = sum(len(v) for k, v in initial.items() if k in NAMESPACED and k != "inferenceservices")
    print("nothing written: a snapshot after every case of %d InferenceService(s), %d other namespaced objects, the registry "
          "catalog/tags/files and the output directories" % (len(initial["inferenceservices"]), others))
    assert len(CASES) >= 60
    modules = {c[2] for c in CASES if c[1] == "module"}
    assert modules == {"speculative_config", "isvc_manifest", "isvc_wait", "engine_config_info", "speculative_metrics_info", "isvc_speculative",
                       "modelcar_image", "pvc_stage_plan", "spec_benchmark", "troubleshoot_bundle"}
    roles = {c[2] for c in CASES if c[1] == "role"}
    assert roles == {"inference_service", "verify", "rollback", "stage_pvc", "benchmark", "artifact_credentials", "troubleshoot",
                     "rollback_schedule"}
    assert not problems, "\n".join(problems)
