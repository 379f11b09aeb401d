# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""KServe's names for the pods the collection reads: the label that ties a pod to its InferenceService, the container
vLLM runs in, the HTTP port KServe's runtimes serve on, the InferenceService API group and version.

Apart from kube/pods.py so that plain readers (kserve/isvc/readers.py, vllm/http_target.py) and the filters built on
them can use these names without importing the kubernetes package (about 0.25 s in every process that loads it, the
Ansible controller included when a filter runs).
"""

from __future__ import annotations

ISVC_LABEL = "serving.kserve.io/inferenceservice"
DEFAULT_CONTAINER = "kserve-container"
KSERVE_GROUP = "serving.kserve.io"
KSERVE_VERSION = "v1beta1"
DEFAULT_HTTP_PORT = 8080  # KServe's runtimes (and its vLLM examples) serve HTTP on 8080
