"""Deploy in `pvc` mode with staging requested (option C), end to end on the real kube-apiserver.

The deploy playbook runs the stage_pvc role after the render accepted the InferenceService and before it is
applied. The test bed plays the stager pod (tests/integration/test_stage_pvc.py: the ConfigMap's real sync script
copies two controller directories, served by the role over loopback HTTP, into a directory standing in for the
PVC; its output becomes the pod's log; its exit code the Job's status), and the KServe stand-in makes the
InferenceService Ready. The paths the InferenceService names must be where the stager put the files.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil

import pytest

from tests.ansible_run import DID_NOT_FAIL, run_cases, run_playbook
from tests.integration.test_deploy import BASE_VARS, _get, _script
from tests.integration.test_stage_pvc import DRAFT, TARGET, StagerPod, _batch, _core, _free_port, _tree, _write_model
from tests.testbed.fixtures import module_namespace

PVC = "model-store"
NAME = "llama-eagle3"
TARGET_SUBDIR, DRAFT_SUBDIR = "Meta-Llama-3.1-8B-Instruct", "EAGLE3-LLaMA3.1-Instruct-8B"


def _models(tmp_path):
    """Target and draft checkpoints in controller directories (the role serves them to the stager)."""
    target = _write_model(str(tmp_path / "controller" / "llama"), seed=1)
    draft = _write_model(str(tmp_path / "controller" / "eagle3"), seed=2, shards=1, mib=1)
    return target, draft


def _deploy_vars(namespace, target_dir, draft_dir, artifacts=None, items=None, **more):
    # The subdirectories are typed once, on the staged items; the artifacts only name the PVC.
    out = dict(BASE_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name=NAME, spec_decoding_stage_pvc=True,
               spec_decoding_artifact_mode="pvc", spec_decoding_artifacts=artifacts or {"pvc_name": PVC},
               spec_decoding_stage_pvc_items=items or [
                   {"name": TARGET, "subdir": TARGET_SUBDIR, "source": target_dir},
                   {"name": DRAFT, "subdir": DRAFT_SUBDIR, "source": draft_dir}],
               stage_pvc_controller_address="127.0.0.1", stage_pvc_controller_bind="127.0.0.1",
               stage_pvc_controller_port=_free_port(), stage_pvc_controller_idle_exit=3, stage_pvc_poll_interval=1,
               stage_pvc_timeout=600, stage_pvc_min_size="1Mi", stage_pvc_air_gapped=True,
               stage_pvc_image="registry.internal.example/vllm/vllm-openai:v0.32.0")
    out.update(more)
    return out


def _deploy(tmp_path, kubeconfig, extra_vars):
    return run_playbook(tmp_path, "playbooks/deploy-eagle3.yml", extra_vars=extra_vars, kubeconfig=kubeconfig, timeout=900)


def _served_paths(isvc):
    """(--model, speculative draft model) as the InferenceService's vLLM command has them."""
    argv = shlex.split(_script(isvc))
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    return argv[argv.index("--model") + 1], spec["model"], spec


def _on_pvc(pvc_dir, mounted_path):
    """The directory on the stand-in PVC that a path under the InferenceService's /mnt/models mount refers to."""
    assert mounted_path.startswith("/mnt/models/"), mounted_path
    return os.path.join(pvc_dir, os.path.relpath(mounted_path, "/mnt/models"))


def _first(run, fragment):
    """Position of the first task result whose name contains `fragment` (role tasks carry a `role : ` prefix)."""
    return next(i for i, (name, _h, _r) in enumerate(run.tasks) if fragment in name)


def _files(tree):
    return {k: v for k, v in tree.items() if not k.startswith(".")}


def test_pvc_mode_stages_first_then_applies_with_the_staged_paths(tmp_path, kubeconfig, k8s_client, kubelet, kserve, namespace):
    target_dir, draft_dir = _models(tmp_path)
    pvc_dir = str(tmp_path / "pvc")
    isvc_while_staging = []
    kserve.set_behaviour(namespace, NAME, ready_after=0.5)
    extra = _deploy_vars(namespace, target_dir, draft_dir)
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir, before=lambda: isvc_while_staging.append(_get(k8s_client, namespace, NAME))) as pod:
        run = _deploy(tmp_path, kubeconfig, extra)
    assert run.rc == 0, run.output

    # The stager ran exactly once, successfully, while no InferenceService existed yet.
    assert len(pod.played) == 1
    job_name, (rc, output) = list(pod.played.items())[0]
    assert rc == 0, output
    assert isvc_while_staging == [None]
    assert _first(run, "Wait for the stager Job to complete or fail") < _first(run, "Wait for Ready")

    # PVC, ConfigMap and Job on the API server: the two subdirectories and the stager's command.
    pvc = _core(k8s_client).read_namespaced_persistent_volume_claim(PVC, namespace)
    assert pvc.metadata.labels["app.kubernetes.io/component"] == "model-store"
    staged = json.loads(pvc.metadata.annotations["spec-decoding.alauda.io/staged"])
    assert {k: v["name"] for k, v in staged.items()} == {TARGET_SUBDIR: TARGET, DRAFT_SUBDIR: DRAFT}
    plan = json.loads(_core(k8s_client).read_namespaced_config_map(PVC + "-stager", namespace).data["plan.json"])
    assert [(i["name"], i["dest"]) for i in plan["items"]] == [(TARGET, "/mnt/pvc/" + TARGET_SUBDIR), (DRAFT, "/mnt/pvc/" + DRAFT_SUBDIR)]
    job = _batch(k8s_client).read_namespaced_job(job_name, namespace)
    assert job_name.startswith(PVC + "-stage-")
    assert [c.type for c in job.status.conditions if c.status == "True"] == ["Complete"]
    container = job.spec.template.spec.containers[0]
    assert container.command == ["python3", "/opt/spec-decoding/artifact_sync.pyz", "--config", "/opt/spec-decoding/plan.json"]
    assert container.image == "registry.internal.example/vllm/vllm-openai:v0.32.0"
    assert {v.name: v.persistent_volume_claim.claim_name for v in job.spec.template.spec.volumes if v.persistent_volume_claim} == {"models": PVC}

    # The InferenceService mounts the PVC and points vLLM at the staged subdirectories: the files are there.
    isvc = _get(k8s_client, namespace, NAME)
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://%s/" % PVC
    model, draft, spec = _served_paths(isvc)
    assert (model, draft) == ("/mnt/models/" + TARGET_SUBDIR, "/mnt/models/" + DRAFT_SUBDIR)
    assert spec["method"] == "eagle3"
    assert _files(_tree(_on_pvc(pvc_dir, model))) == _tree(target_dir)
    assert _files(_tree(_on_pvc(pvc_dir, draft))) == _tree(draft_dir)
    assert json.loads(_tree(_on_pvc(pvc_dir, draft))[".spec-decoding-manifest.json"])["name"] == DRAFT
    waited = run.result("Wait for Ready")
    assert waited["ready"] is True and waited["generation"] == isvc["metadata"]["generation"]
    # The KServe stand-in mounted the claim into the predictor the way KServe does.
    deployment = _apps(k8s_client).read_namespaced_deployment(NAME + "-predictor", namespace)
    assert PVC in [v.persistent_volume_claim.claim_name for v in deployment.spec.template.spec.volumes if v.persistent_volume_claim]

    # A new plan (full re-hash) whose stager fails: the error names the Job and shows its log, and the
    # InferenceService (which would have changed: 2 speculative tokens) is left as it was.
    def break_draft():
        shutil.rmtree(os.path.join(pvc_dir, DRAFT_SUBDIR))
        with open(os.path.join(pvc_dir, DRAFT_SUBDIR), "w", encoding="utf-8") as fh:
            fh.write("not a directory")

    changed = dict(extra, stage_pvc_verify="full", spec_decoding_speculative={"num_speculative_tokens": 2},
                   stage_pvc_controller_port=_free_port())
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir, before=break_draft) as pod2:
        failed_run = _deploy(tmp_path, kubeconfig, changed)
    assert failed_run.rc != 0
    (failed_job, (rc2, _out)), = pod2.played.items()  # pylint: disable=unbalanced-dict-unpacking
    assert failed_job != job_name and rc2 != 0
    msg = failed_run.failed[-1]["msg"]
    assert "The stager Job %s/%s failed" % (namespace, failed_job) in msg, msg
    assert "[artifact-sync] ERROR: dest: %s/%s exists and is not a directory" % (pvc_dir, DRAFT_SUBDIR) in msg, msg
    assert not [n for n, _h, _r in failed_run.tasks if "Wait for Ready" in n]
    after = _get(k8s_client, namespace, NAME)
    assert after["metadata"]["resourceVersion"] == isvc["metadata"]["resourceVersion"]
    assert '"num_speculative_tokens":3' in _script(after)


def _apps(k8s_client):
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    return client.AppsV1Api(k8s_client)


def test_subdirs_from_the_artifacts_fill_items_without_one(tmp_path, kubeconfig, k8s_client, kubelet, kserve, namespace):
    """The other way to type each subdirectory once: in spec_decoding_artifacts; the stager and vLLM follow it.
    A stager that fails on the first deploy leaves no InferenceService behind."""
    target_dir, draft_dir = _models(tmp_path)
    pvc_dir = str(tmp_path / "pvc")
    extra = _deploy_vars(namespace, target_dir, draft_dir,
                         artifacts={"pvc_name": PVC, "target_subdir": "llama-3.1-8b", "draft_subdir": "llama-3.1-8b-eagle3"},
                         items=[{"name": TARGET, "source": target_dir}, {"name": DRAFT, "source": draft_dir}])
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir, outcome="Failed") as pod:
        run = _deploy(tmp_path, kubeconfig, extra)
    assert run.rc != 0
    assert len(pod.played) == 1, "the stager Job never ran; the deploy failed with: %s" % (run.failed[-1]["msg"] if run.failed else run.output)
    (job_name, (_rc, output)), = pod.played.items()  # pylint: disable=unbalanced-dict-unpacking
    msg = run.failed[-1]["msg"]
    assert "The stager Job %s/%s failed" % (namespace, job_name) in msg and "BackoffLimitExceeded" in msg, msg
    # The pod's log (the real script's last lines, read back through the API server) is in the message.
    assert output.strip().splitlines()[-1] in msg
    assert _get(k8s_client, namespace, NAME) is None
    # It staged where the artifacts say; the next run (the Job is replaced and completes) applies those paths.
    assert sorted(os.listdir(pvc_dir)) == ["llama-3.1-8b", "llama-3.1-8b-eagle3"]
    kserve.set_behaviour(namespace, NAME, ready_after=0.5)
    with StagerPod(k8s_client, kubelet, namespace, pvc_dir) as pod2:
        run2 = _deploy(tmp_path, kubeconfig, extra)
    assert run2.rc == 0, run2.output
    # One stager run resumed the copy (the failed Job replaced; a new name only if the sync script changed meanwhile).
    assert len(pod2.played) == 1 and [rc for rc, _out in pod2.played.values()] == [0]
    model, draft, _spec = _served_paths(_get(k8s_client, namespace, NAME))
    assert (model, draft) == ("/mnt/models/llama-3.1-8b", "/mnt/models/llama-3.1-8b-eagle3")
    assert _files(_tree(_on_pvc(pvc_dir, model))) == _tree(target_dir)
    assert _files(_tree(_on_pvc(pvc_dir, draft))) == _tree(draft_dir)


BAD = [
    ("subdir-typed-twice-differently",
     {"spec_decoding_artifacts": {"pvc_name": PVC, "draft_subdir": "eagle3"}},
     "spec_decoding_stage_pvc_items[1].subdir %s differs from spec_decoding_artifacts.draft_subdir eagle3" % DRAFT_SUBDIR),
    ("draft-method-without-a-staged-draft",
     {"spec_decoding_stage_pvc_items": [{"name": TARGET, "subdir": TARGET_SUBDIR, "source": "/nonexistent"}]},
     "spec_decoding_stage_pvc_items with the target and, for a draft method, the draft (1 given)"),
    ("other-artifact-mode", {"spec_decoding_artifact_mode": "modelcar"}, "it is 'modelcar'"),
    ("no-pvc-name", {"spec_decoding_artifacts": {"target_subdir": TARGET_SUBDIR}}, "spec_decoding_artifacts.pvc_name"),
    # The render checks the whole InferenceService before the (long) staging: a bad config writes nothing.
    ("bad-speculative", {"spec_decoding_speculative": {"num_speculative_tokens": 0}}, "speculative.num_speculative_tokens"),
]


@pytest.fixture(scope="module")
def bad_staging_runs(tmp_path_factory, kubeconfig, controlplane):
    """Every BAD case in one ansible-playbook run (a block/rescue per case, the role included as deploy-eagle3.yml does,
    as tests/integration/test_deploy.py's bad_input_runs), in a namespace of its own: (run, {case: {msg, task}}, namespace).
    One run instead of one per case: about 2.5 CPU s of ansible-playbook start and collection load each."""
    tmp = tmp_path_factory.mktemp("deploy-pvc-bad-input")
    target_dir, draft_dir = _models(tmp)
    with module_namespace(controlplane, "deploy-pvc-bad-input") as namespace:
        cases = [(cid, {"ansible.builtin.include_role": {"name": "alauda.spec_decoding.inference_service"},
                        "vars": dict(_deploy_vars(namespace, target_dir, draft_dir, **overrides), inference_service_method="eagle3")})
                 for cid, overrides, _expect in BAD]
        run, results = run_cases(tmp, cases, kubeconfig=kubeconfig, timeout=900)
        yield run, results, namespace


@pytest.mark.parametrize("case,expect", [(b[0], b[2]) for b in BAD], ids=[b[0] for b in BAD])
def test_bad_staging_input_fails_before_anything_is_written(bad_staging_runs, k8s_client, case, expect):
    run, results, namespace = bad_staging_runs
    msg = results[case]["msg"]
    assert msg != DID_NOT_FAIL, run.output
    assert expect in msg and "Fix:" in msg, msg
    # Nothing of any case was written: the namespace holds no InferenceService, PVC, stager ConfigMap or Job.
    assert _get(k8s_client, namespace, NAME) is None
    assert not _core(k8s_client).list_namespaced_persistent_volume_claim(namespace).items
    assert not _core(k8s_client).list_namespaced_config_map(namespace, label_selector="app.kubernetes.io/component=model-stager").items
    assert not _batch(k8s_client).list_namespaced_job(namespace).items
    assert not re.search(r"Start the stager Job", " ".join(run.case_tasks(case)))
