"""The generation-aware wait against the real kube-apiserver: it watches the InferenceService, so it returns when the
controller writes the status rather than one poll interval later, and it still refuses a stale Ready."""
from __future__ import annotations

import threading
import time

import pytest
import yaml

from tests.integration.test_rollback import DATA, GROUP, PLURAL, VERSION, _api

NAME = "wait-watch"
# Far longer than the stand-in needs: a wait that polled instead of watching could not finish in time.
POLL_INTERVAL = 30


def _create(k8s_client, namespace):
    with open("%s/guide_example2_eagle3.yaml" % DATA, encoding="utf-8") as fh:
        manifest = yaml.safe_load(fh)
    manifest["metadata"].update(name=NAME, namespace=namespace)
    return _api(k8s_client).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)


def test_wait_returns_on_the_status_write_not_on_the_next_poll(k8s_client, kserve, namespace):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    kserve.set_behaviour(namespace, NAME, ready_after=0.5)
    created = _create(k8s_client, namespace)
    assert isvc_wait.isvc_readers.readiness(created)["ready"] is False
    started = time.monotonic()
    isvc, elapsed = isvc_wait.wait_ready(k8s_client, namespace, NAME, timeout=60, interval=POLL_INTERVAL)
    took = time.monotonic() - started
    state = isvc_wait.isvc_readers.readiness(isvc)
    assert state["ready"] and state["up_to_date"] and state["generation"] == 1
    assert took < POLL_INTERVAL / 3, "the wait took %.1f s: it polled instead of watching" % took
    assert abs(elapsed - took) < 1.0

    # A new generation: the Ready=True of generation 1 is still in the status right after the patch; the wait must not
    # take it, and must wake up on the stand-in's status write for generation 2. The patch changes the pod template (an
    # env variable), so new pods roll out as on KServe; a replica-bound change (maxReplicas) would only touch the HPA.
    kserve.set_behaviour(namespace, NAME, ready_after=1.0, generation=2)
    _api(k8s_client).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME,
                                                    {"spec": {"predictor": {"model": {"env": [{"name": "WAIT_WATCH", "value": "2"}]}}}})
    stale = _api(k8s_client).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)
    assert stale["metadata"]["generation"] == 2
    seen = {}

    def waiter():
        seen["result"] = isvc_wait.wait_ready(k8s_client, namespace, NAME, timeout=60, interval=POLL_INTERVAL)

    thread = threading.Thread(target=waiter)
    started = time.monotonic()
    thread.start()
    thread.join(timeout=POLL_INTERVAL / 2)
    assert not thread.is_alive(), "the wait for generation 2 did not return within %d s" % (POLL_INTERVAL / 2)
    isvc, _elapsed = seen["result"]
    state = isvc_wait.isvc_readers.readiness(isvc)
    assert state["generation"] == 2 and state["observed_generation"] == 2 and state["ready"]
    # The pods of generation 2 report ready 1 s after they start: a wait that returned sooner took the stale Ready.
    assert time.monotonic() - started >= 1.0


def test_wait_times_out_with_the_reason_while_watching(k8s_client, kserve, namespace):
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import wait as isvc_wait  # pylint: disable=import-outside-toplevel
    kserve.set_behaviour(namespace, NAME, never_ready=True)
    _create(k8s_client, namespace)
    started = time.monotonic()
    with pytest.raises(isvc_wait.WaitTimeout) as err:
        isvc_wait.wait_ready(k8s_client, namespace, NAME, timeout=3, interval=POLL_INTERVAL)
    took = time.monotonic() - started
    assert 3 <= took < 10, took
    message = str(err.value)
    assert "%s/%s is not" % (namespace, NAME) in message and "predictor pods:" in message, message
