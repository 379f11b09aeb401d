# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The base the collection's modules run on: an ``argspec()`` and a ``main()`` of a few lines.

The model is community.okd's ``AnsibleOpenshiftModule`` over kubernetes.core: ``KubeModule`` takes kubernetes.core's
auth options (doc fragment ``kubernetes.core.k8s_auth_options``) and builds the authenticated client from them once,
through kubernetes.core's ``get_api_client``, so kubeconfig, context, host, api_key, validate_certs, proxy and the
``K8S_AUTH_*`` variables behave exactly as in kubernetes.core's own modules. ``run`` calls the module's one function
and turns the collection's ``SpecDecodingError`` into ``fail_json`` with its message, field and fix::

    def main():
        KubeModule(argspec(), supports_check_mode=True).run(execute)

A module without a cluster uses ``run(AnsibleModule(...), execute)`` for the same error mapping.

Unlike the rest of module_utils this file imports Ansible: it is the seam between Ansible and the plain-Python logic.
"""

from __future__ import annotations

import copy
import sys

from ansible.module_utils.common.text.converters import to_text
from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.core import AnsibleK8SModule
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.exceptions import CoreException

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError

_ISVC_WAIT = "ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.wait"

# The options of doc fragment alauda.spec_decoding.inference_service (an InferenceService the module reads or changes).
INFERENCE_SERVICE_ARG_SPEC = dict(
    name=dict(type="str", required=True),
    namespace=dict(type="str", required=True),
)


def wait_arg_spec(wait=False):
    """The options of doc fragment alauda.spec_decoding.inference_service.WAIT (Ready at the generation after a change);
    `wait` is the default of the option of that name (a module that documents another default says so in its own doc)."""
    return dict(
        wait=dict(type="bool", default=wait),
        wait_timeout=dict(type="int", default=1200),
        wait_sleep=dict(type="int", default=5),
        wait_crash_loop_restarts=dict(type="int", default=2),
    )


def argspec(*blocks, **options):
    """A cluster module's argument spec: the shared blocks, the module's own options, then kubernetes.core's auth options.

    The auth options come last, as every cluster module of the collection has always had them (an own option of the same
    name, such as a registry ``password``, is the auth option there). Each call returns fresh dicts.
    """
    spec = {}
    for block in blocks:
        spec.update(copy.deepcopy(block))
    spec.update(options)
    spec.update(copy.deepcopy(AUTH_ARG_SPEC))
    return spec


def failure(exc, failed=None, timed_out=None):
    """fail_json's keys for a SpecDecodingError: the message (it already names the field and says the fix), ``field``,
    ``fix`` (when the error has one), ``changed=False``, then `failed`'s keys. An InferenceService that did not become
    Ready in time (isvc_wait.WaitTimeout) also returns the object as last read (``resource``) and its ``pods``, then
    `timed_out`'s keys."""
    out = exc.result()
    out.update(failed or {})
    # A WaitTimeout comes only from an imported isvc_wait; importing it here would import the kubernetes library into
    # every failing module, also those that never talk to a cluster.
    wait = sys.modules.get(_ISVC_WAIT)
    if wait is not None and isinstance(exc, wait.WaitTimeout):
        out.update(resource=exc.isvc, pods=exc.pods)
        out.update(timed_out or {})
    return out


def run(module, execute, failed=None, timed_out=None, unexpected=None, unexpected_types=Exception):
    """``exit_json(**execute(module))``; the errors end in ``fail_json`` instead of a traceback.

    - SpecDecodingError: see `failure` (`failed` and `timed_out` add keys to it).
    - `unexpected` (the module's name): any other exception (of `unexpected_types`) fails with ``"<name>: <error>"``
      (and `failed`'s keys).
    - kubernetes.core's CoreException (a kubeconfig it cannot load): its message and traceback, as kubernetes.core's
      modules report it (``fail_from_exception``).
    `execute` may itself end the run with ``module.fail_json`` or ``module.exit_json``.
    """
    try:
        result = execute(module)
    except SpecDecodingError as exc:
        module.fail_json(**failure(exc, failed, timed_out))
    except Exception as exc:  # pylint: disable=broad-except
        if unexpected and isinstance(exc, unexpected_types):
            module.fail_json(**dict(failed or {}, msg="%s: %s" % (unexpected, to_text(exc))))
        if isinstance(exc, CoreException) and hasattr(module, "fail_from_exception"):
            module.fail_from_exception(exc)
        raise
    module.exit_json(**result)


class KubeModule(AnsibleK8SModule):
    """kubernetes.core's AnsibleK8SModule with the client built once, on first use, and the collection's error mapping.

    The client is not built in ``__init__`` (as community.okd does) but when ``api_client`` is first read: the options
    are checked and a run that needs no cluster (a log file, a definition given inline) neither imports the kubernetes
    library nor needs a kubeconfig.
    """

    def __init__(self, argument_spec, **kwargs):
        super().__init__(argument_spec=argument_spec, **kwargs)
        self._api_client = None
        self._cluster = None

    @property
    def api_client(self):
        """kubernetes.core's authenticated ``kubernetes.client.ApiClient`` for this run (the same one on every read)."""
        if self._api_client is None:
            if not self.settings["check_k8s"]:
                self.requires("kubernetes")  # checked in __init__ otherwise
            from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import get_api_client  # pylint: disable=import-outside-toplevel
            self._api_client = get_api_client(module=self).client.client
        return self._api_client

    @property
    def cluster(self):
        """The cluster service (kube/service.py) over ``api_client``: built once, the one way this run reaches the cluster."""
        from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.service import of_module  # pylint: disable=import-outside-toplevel
        return of_module(self)

    @property
    def no_log_values(self):
        """AnsibleModule's set of values masked in every output (a password read from a file at run time goes in it)."""
        return self._module.no_log_values

    def run(self, execute, failed=None, timed_out=None, unexpected=None, unexpected_types=Exception):
        """See the module-level `run`."""
        run(self, execute, failed=failed, timed_out=timed_out, unexpected=unexpected, unexpected_types=unexpected_types)
