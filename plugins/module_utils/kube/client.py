# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubernetes client package, imported here and nowhere else in the collection (tests/unit/test_layers.py checks it).

Modules and module_utils take what they need from here (``from ...module_utils.kube.client import CoreV1Api``), inside
the function that calls the API where the import should stay lazy: the package costs about a second and 40+ MiB, which
offline work (rendering, image rewrites) does not pay. The authenticated ``ApiClient`` itself always comes from
kubernetes.core (``get_api_client(module).client.client``).

Without the package the names are None (``ApiException`` a stand-in, so ``except`` clauses work) and HAS_KUBERNETES is
False; the calling module reports it with ``missing_required_lib``.
"""

from __future__ import annotations

try:
    from kubernetes import client, watch
    from kubernetes.client.exceptions import ApiException  # the same class as kubernetes.client.rest.ApiException
    HAS_KUBERNETES = True
except ImportError:  # pragma: no cover - the calling module reports it with missing_required_lib
    client = watch = None

    class ApiException(Exception):
        """Stand-in so except clauses work without the library."""

    HAS_KUBERNETES = False

# The typed API classes are imported on first use (PEP 562): with kubernetes 37 their modules build pydantic models of
# every type they mention, so importing CoreV1Api alone costs 0.65 CPU s and AppsV1Api 0.4 s, in every module process
# that imported them, whether it called the API or not (a no-op deploy's kserve_info and isvc_wait did not).
_LAZY_APIS = ("ApiextensionsV1Api", "AppsV1Api", "CoreV1Api", "CustomObjectsApi")


def __getattr__(name):
    if name in _LAZY_APIS:
        if client is None:
            return None
        return getattr(client, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


# The typed API classes (_LAZY_APIS) are reached through __getattr__ and so are not listed here.
__all__ = ["ApiException", "HAS_KUBERNETES", "client", "watch"]
