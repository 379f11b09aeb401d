# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Where spec_benchmark's and spec_sweep's requests come from: the controller, or the in-cluster load Job (their arg
    spec is module_utils/bench/load_job.py arg_spec)."""

    DOCUMENTATION = r"""
options:
  load_from:
    description:
      - Where the requests are sent from.
      - V(controller) sends them from the host that runs the module.
      - V(cluster) runs the module's own load client as a Job in O(load_job.namespace), next to the service, with the
        same prompts, pacing, warmups and protocol, and reads its measurements back from the pod's log (compressed, at
        most 6 MiB). The report is computed here from them, as for V(controller). The Job's pod sends the requests and
        reads C(/metrics) of each side's URL; it never calls the Kubernetes API.
      - V(auto) is V(cluster) when a URL is a Service's cluster-internal name (C(<svc>.<ns>.svc) or
        C(<svc>.<ns>.svc.<cluster domain>), which C(status.address.url) of an InferenceService is) and the module does
        not itself run in a pod (no C(KUBERNETES_SERVICE_HOST)), else V(controller). Both sides are always measured
        from the same place.
      - M(alauda.spec_decoding.spec_benchmark) measures every side in one Job. M(alauda.spec_decoding.spec_sweep) runs one
        Job that reads each side's C(/metrics) and served model (no inference request), then one Job per measurement, so
        an interrupted sweep resumes from the last one measured.
    type: str
    choices: [auto, controller, cluster]
    default: auto
  load_job:
    description:
      - The in-cluster load Job (O(load_from=cluster)). It is a ConfigMap (the client and the request), a Secret (only
        with O(bearer_token) or O(headers)) and a Job named C(spec-decoding-load-<8 hex>), all owned by the Job and
        deleted after the run (and by the Job's TTL of one hour when a run is interrupted).
      - The identity that runs the module needs create, patch and delete on configmaps and secrets, create, get and
        delete on jobs, list on pods and get on pods/log in O(load_job.namespace) (C(docs/rbac/benchmark.yaml)).
    type: dict
    default: {}
    suboptions:
      namespace:
        description: Namespace of the Job, the InferenceService's. Required for O(load_from=cluster).
        type: str
      image:
        description:
          - Image of the Job's container; it needs C(python3) (3.8 or later) and nothing else. The benchmark role passes
            the candidate's serving runtime image, which the nodes already have (also in an air-gapped cluster).
            Required for O(load_from=cluster).
        type: str
      python:
        description: The Python interpreter in O(load_job.image).
        type: str
        default: python3
      image_pull_policy:
        description: The container's C(imagePullPolicy).
        type: str
        choices: [Always, IfNotPresent, Never]
        default: IfNotPresent
      image_pull_secrets:
        description: Names of Secrets in O(load_job.namespace) to pull O(load_job.image) with.
        type: list
        elements: str
        default: []
      service_account_name:
        description:
          - ServiceAccount of the Job's pod (the namespace's default when unset). Its token is not mounted.
        type: str
      node_selector:
        description: C(nodeSelector) of the Job's pod, for example to keep the load off the GPU nodes.
        type: dict
        default: {}
      tolerations:
        description: C(tolerations) of the Job's pod.
        type: list
        elements: dict
        default: []
      resources:
        description:
          - C(resources) of the Job's container. No CPU limit by default, so throttling does not enter the timings.
        type: dict
        default: {requests: {cpu: "1", memory: 512Mi}, limits: {memory: 2Gi}}
      pod_annotations:
        description: Annotations of the Job's pod, for example to leave it out of a service mesh.
        type: dict
        default: {}
      timeout:
        description: Seconds the Job may run (its C(activeDeadlineSeconds)); at least 60.
        type: int
        default: 3600
      pods:
        description:
          - How many client pods send the load (an Indexed Job of that many pods). Each sends its shard of the one seeded
            arrival schedule (requests i, i + pods, ...) at the schedule's offsets with its share of the concurrency; the
            controller merges their measurements and computes the same statistics as for one pod.
          - Every run says whether the client kept up (send lag against the schedule, client CPU) and gives no decision when
            it did not (send lag p99 over 100 ms, or a client pod over 0.9 of a CPU); more pods is the fix.
          - At most the concurrency (C(concurrency), or each load of a sweep) and the number of measured requests.
        type: int
        default: 1
      keep:
        description: Keep the Job, its pod, ConfigMap and Secret after the run (to read them); the TTL still removes them.
        type: bool
        default: false
      kubeconfig:
        description:
          - The kubeconfig (a path or a dict) for the Kubernetes API. The C(K8S_AUTH_*) variables and the default
            kubeconfig apply otherwise, as in kubernetes.core's modules.
        type: raw
      context:
        description: The kubeconfig context.
        type: str
      host:
        description: The Kubernetes API server URL.
        type: str
      api_key:
        description: A token for the Kubernetes API.
        type: str
      ca_cert:
        description: CA certificate of the Kubernetes API server.
        type: path
      validate_certs:
        description: Whether to verify the Kubernetes API server's certificate.
        type: bool
requirements:
  - kubernetes (for O(load_from=cluster))
"""
