#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_outcome_info
short_description: Wait until a Kubernetes Job ends, then return how it ended and the log of its newest pod that ran
version_added: 0.1.0
description:
  - Waits until the C(batch/v1) Job's C(Complete) or C(Failed) condition is C(True). The Job and its pods (label
    C(job-name)) are read every O(interval) seconds, in the task's process over a local connection (two requests, no
    module process); a pod that cannot start (an image that cannot be pulled, a container that cannot be created) fails
    the wait at once with the kubelet's reason.
  - Then reads the log of the Job's newest pod that ran. A Job that failed is not a failure of this module - RV(ended) says
    V(Failed) and the log says why - so the caller decides what to report (the stager's roles fail with the log's end).
  - The collection's roles use it for the Jobs they start (the PVC stager, the draft remover); it replaces a
    C(kubernetes.core.k8s_info) task retried every few seconds and a C(kubernetes.core.k8s_log) task.
author:
  - Alauda Platform Team (@alauda)
options:
  name:
    description: Name of the Job.
    type: str
    required: true
  namespace:
    description: Namespace of the Job.
    type: str
    required: true
  timeout:
    description: Seconds to wait for the Job to end. A Job that has not ended then fails the task (the Job is left as it is).
    type: int
    default: 600
  interval:
    description:
      - Seconds between reads of the Job and its pods while it runs.
    type: int
    default: 2
  container:
    description: The container whose log is read. Omitted - the pod's only container.
    type: str
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
notes:
  - Needs C(get) on C(jobs), C(list) on C(pods) and C(get) on C(pods/log) in the namespace.
seealso:
  - module: alauda.spec_decoding.isvc_wait
  - module: kubernetes.core.k8s_info
  - module: kubernetes.core.k8s_log
"""

EXAMPLES = r"""
- name: Wait for the stager Job and read its log
  alauda.spec_decoding.job_outcome_info:
    name: models-stage-3f2a
    namespace: models
    container: stager
    timeout: 1800
  register: stager

- name: Report a failed Job with the end of its log
  ansible.builtin.fail:
    msg: "{{ stager.condition.reason }}: {{ stager.log.splitlines()[-20:] | join('\n') }}"
  when: stager.ended == 'Failed'
"""

RETURN = r"""
ended:
  description: How the Job ended, V(Complete) or V(Failed).
  returned: success
  type: str
  sample: Complete
condition:
  description: The Job's C(Complete) or C(Failed) condition (C(type), C(status), C(reason), C(message), ...).
  returned: success
  type: dict
job:
  description: The Job as read when it ended.
  returned: success
  type: dict
pod:
  description:
    - The name of the Job's newest pod that ran (it ended, or a container of it started), null when none did (the Job's
      deadline passed before one started). A retry that never started has no log; the newest pod that ran says why the
      Job failed.
  returned: success
  type: str
pod_phase:
  description: The phase of that pod (C(Succeeded) or C(Failed) once it ended), null without one.
  returned: success
  type: str
log:
  description: The log of that pod's container, empty without one.
  returned: success
  type: str
"""


from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import ModuleContract, argspec


def argument_spec():
    return argspec(
        name=dict(type="str", required=True),
        namespace=dict(type="str", required=True),
        timeout=dict(type="int", default=600),
        interval=dict(type="int", default=2),
        container=dict(type="str"),
    )


def execute(module):
    params = module.params
    out = module.cluster.job_outcome(params["namespace"], params["name"], params["timeout"], container=params["container"],
                                     interval=params["interval"])
    return dict(out, changed=False)


CONTRACT = ModuleContract(argument_spec, execute, failure=dict(unexpected="job_outcome_info"))


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
