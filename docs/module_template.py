# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

# The template of a module of this collection: copy it to plugins/modules/<name>.py, rename, and keep its shape (a
# module file starts with #!/usr/bin/python, left out here: ansible-test's shebang check allows it on modules only).
# docs/DEVELOPING.md "Modules: one contract, two ways to run" says why; tests/unit/plugins/modules/test_module_contract.py
# checks every module file (and this template) against it:
# - DOCUMENTATION / EXAMPLES / RETURN, the options through the doc fragments where the collection has one;
# - argument_spec(): fresh dicts on every call (kube.module.argspec for a cluster module: it adds kubernetes.core's
#   auth options; kube.module.plain_argspec for one without a cluster);
# - execute(module): the one call into plugins/module_utils/, which raises errors.ValidationError(message, field=...,
#   hint=...) for a bad input; it returns the result dict and never calls exit_json itself;
# - CONTRACT: the spec, execute, the constraints between options and the failure keys, declared once;
# - main(): CONTRACT.main(), nothing else.
# For the task's own process, add plugins/action/<name>.py (see plugins/action/isvc_wait.py): it imports this file and
# runs the same CONTRACT, so the constraints, the failure mapping and no_log masking are the same both ways.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: isvc_generation_info
short_description: Read the generation of a KServe InferenceService (the module template)
version_added: 0.1.0
description:
  - Reads the InferenceService and returns its C(metadata.generation) and C(status.observedGeneration).
author:
  - Alauda Platform Team (@alauda)
options:
  expected_generation:
    description: Fail when the InferenceService is at another generation.
    type: int
extends_documentation_fragment:
  - alauda.spec_decoding.inference_service
  - kubernetes.core.k8s_auth_options
  - alauda.spec_decoding.attributes.READ_ONLY
  - alauda.spec_decoding.attributes.ACTION_GROUP
requirements:
  - kubernetes >= 24.2.0
"""

EXAMPLES = r"""
- name: Read the generation
  alauda.spec_decoding.isvc_generation_info:
    name: llama-eagle3
    namespace: models
"""

RETURN = r"""
generation:
  description: C(metadata.generation).
  returned: success
  type: int
observed_generation:
  description: C(status.observedGeneration), null before the controller has written a status.
  returned: success
  type: int
"""

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.module import INFERENCE_SERVICE_ARG_SPEC, ModuleContract, argspec


def argument_spec():
    return argspec(
        INFERENCE_SERVICE_ARG_SPEC,
        expected_generation=dict(type="int"),
    )


def execute(module):
    # A real module calls one module_utils function here; the template's logic is two lines so that it reads alone.
    params = module.params
    isvc = module.cluster.inference_service(params["namespace"], params["name"])
    generation = isvc["metadata"].get("generation")
    if params["expected_generation"] not in (None, generation):
        raise ValidationError("the InferenceService is at generation %s, not %s" % (generation, params["expected_generation"]),
                              field="expected_generation", hint="read it again after the change has been applied")
    return dict(changed=False, generation=generation, observed_generation=(isvc.get("status") or {}).get("observedGeneration"))


CONTRACT = ModuleContract(
    argument_spec, execute,
    # AnsibleModule's rules between options; the task-process path validates with them too
    constraints=dict(),
    # kube.module.failure_result's keys: added to every mapped failure (failed=), to a wait's timeout (timed_out=), and
    # unexpected="<module name>" turns any other exception (of unexpected_types) into "<name>: <error>"
    failure=dict(failed={"generation": None}),
)


def main():
    CONTRACT.main()


if __name__ == "__main__":
    main()
