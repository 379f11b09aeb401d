"""tests/testbed/wake.py and the stand-ins' event mapping: a watch event makes only the object it concerns (or its owner)
dirty, the work queue hands each dirty key over once, and the controller loop reconciles those keys alone (a GET each,
no LIST), with a full pass only at start, on wake() and at the resync. Plain dicts and a fake API, no server."""
import threading
import time

import pytest

from tests.testbed.kserve_standin import ControllerLoop, isvc_event_keys
from tests.testbed.kubelet import KubeletStandIn
from tests.testbed.llmisvc_standin import llmisvc_event_keys
from tests.testbed.rest import ApiError
from tests.testbed.wake import EVERYTHING, WorkQueue, owner_key


def event(kind, name, namespace="ns1", labels=None, owners=(), etype="MODIFIED"):
    meta = {"name": name, "labels": dict(labels or {}),
            "ownerReferences": [{"kind": k, "name": n, "uid": "u-" + n, "controller": True} for k, n in owners]}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"type": etype, "object": {"kind": kind, "metadata": meta}}


ISVC_LABEL = "serving.kserve.io/inferenceservice"


@pytest.mark.parametrize("ev, keys", [
    (event("InferenceService", "a"), [("ns1", "a")]),
    (event("InferenceService", "a", etype="DELETED"), [("ns1", "a")]),
    # what it owns: by ownerReference, else by label (pods are owned by ReplicaSets)
    (event("Deployment", "a-predictor", owners=[("InferenceService", "a")], labels={ISVC_LABEL: "a"}), [("ns1", "a")]),
    (event("Service", "a-predictor", owners=[("InferenceService", "a")]), [("ns1", "a")]),
    # a pod only when KServe's modelStatus reads it (a failed load); its other changes come through its Deployment
    (event("Pod", "a-predictor-5d9c-x2", owners=[("ReplicaSet", "a-predictor-5d9c")], labels={ISVC_LABEL: "a"}), []),
    (dict(event("Pod", "a-predictor-5d9c-x2", owners=[("ReplicaSet", "a-predictor-5d9c")], labels={ISVC_LABEL: "a"}),
          object=dict(event("Pod", "a-predictor-5d9c-x2", owners=[("ReplicaSet", "a-predictor-5d9c")],
                            labels={ISVC_LABEL: "a"})["object"], status={"containerStatuses": [
                                {"name": "kserve-container", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]})),
     [("ns1", "a")]),
    (event("Deployment", "other", labels={"component": "predictor"}), []),
    # a runtime: every InferenceService that may resolve to it
    (event("ServingRuntime", "vllm"), [("ns1", None)]),
    (event("ClusterServingRuntime", "vllm", namespace=None), [EVERYTHING]),
])
def test_isvc_event_keys(ev, keys):
    assert isvc_event_keys(ev) == keys


PART_OF = {"app.kubernetes.io/part-of": "llminferenceservice"}


@pytest.mark.parametrize("ev, keys", [
    (event("LLMInferenceService", "m"), [("ns1", "m")]),
    (event("Deployment", "m-kserve", owners=[("LLMInferenceService", "m")], labels=dict(PART_OF, **{"app.kubernetes.io/name": "m"})),
     [("ns1", "m")]),
    (event("LeaderWorkerSet", "m-kserve-mn", owners=[("LLMInferenceService", "m")]), [("ns1", "m")]),
    # a multi-node pod is owned by its LeaderWorkerSet: the label names the LLMInferenceService
    (event("Pod", "m-kserve-mn-0", owners=[("LeaderWorkerSet", "m-kserve-mn")], labels=dict(PART_OF, **{"app.kubernetes.io/name": "m"})),
     [("ns1", "m")]),
    (event("Pod", "other-0", owners=[("LeaderWorkerSet", "other")], labels={"app.kubernetes.io/name": "other"}), []),
    (event("LLMInferenceServiceConfig", "preset"), [("ns1", None)]),
    (event("LLMInferenceServiceConfig", "preset", namespace="kserve"), [EVERYTHING]),
])
def test_llmisvc_event_keys(ev, keys):
    assert llmisvc_event_keys(ev) == keys


def test_owner_key_prefers_the_owner_reference_of_the_kind():
    obj = event("Deployment", "d", owners=[("ReplicaSet", "rs"), ("InferenceService", "owner")], labels={ISVC_LABEL: "label"})["object"]
    assert owner_key(obj, "InferenceService", ISVC_LABEL) == ("ns1", "owner")
    assert owner_key(obj, "LLMInferenceService", ISVC_LABEL) == ("ns1", "label")
    assert owner_key(obj, "LLMInferenceService", ISVC_LABEL, part_of=("app.kubernetes.io/part-of", "x")) is None


def test_queue_hands_each_key_over_once_with_the_latest_object():
    queue = WorkQueue()
    far = time.monotonic() + 60
    queue.add(("ns", "a"), {"v": 1})
    queue.add(("ns", "a"), {"v": 2})
    queue.add(("ns", "a"))  # a bare key (a timer) keeps the object an event brought
    queue.add(("ns", "b"))
    assert queue.take(far) == {("ns", "a"): {"v": 2}, ("ns", "b"): None}
    assert queue.take(time.monotonic()) == {EVERYTHING: None}  # nothing dirty: the resync


def test_queue_defers_a_key_to_its_time_and_stops_on_close():
    queue = WorkQueue()
    start = time.monotonic()
    queue.add_after(("ns", "p"), start + 0.3)
    queue.add_after(("ns", "p"), start + 0.2)  # the earliest wins
    assert queue.take(start + 60) == {("ns", "p"): None}
    assert 0.2 <= time.monotonic() - start < 5
    threading.Timer(0.1, queue.close).start()
    assert queue.take(time.monotonic() + 60) is None


class FakeApi:
    """The stand-ins' REST client over a dict of objects; every call is logged as (verb, path). Watches are not served
    (404), so only the events a test hands to the loop reach it."""

    def __init__(self, objects, log, lock):
        self.objects, self.log, self.lock = objects, log, lock

    def get(self, path, **query):
        with self.lock:
            if "limit" in query:
                return {"metadata": {"resourceVersion": "1"}}  # the watch's list for a resourceVersion
            if path in self.objects:
                self.log.append(("GET", path))
                return self.objects[path]
            if path == Loop.LIST_PATH or path in {key.rsplit("/", 1)[0] for key in self.objects}:
                self.log.append(("LIST", path))
                return {"items": [obj for key, obj in self.objects.items() if path in (Loop.LIST_PATH, key.rsplit("/", 1)[0])]}
            self.log.append(("GET", path))
            raise ApiError(404, "{}", "GET", path)

    def stream(self, path, **query):
        raise ApiError(404, "{}", "GET", path)

    def close(self):
        pass


class FakeControlPlane:
    def __init__(self, objects):
        self.objects, self.log, self.lock = objects, [], threading.Lock()

    def rest(self, timeout=None):  # pylint: disable=unused-argument
        return FakeApi(self.objects, self.log, self.lock)

    def calls(self):
        with self.lock:
            out, self.log[:] = list(self.log), []
        return out


class Loop(ControllerLoop):
    LIST_PATH = "/apis/example.io/v1/things"
    DEPLOYMENT_SELECTOR = "component=predictor"
    NAME = "test loop"
    event_keys = staticmethod(isvc_event_keys)

    def __init__(self, controlplane):
        self._init_loop(controlplane, idle_interval=60)
        self.seen = []
        self.passes = threading.Semaphore(0)

    def reconcile(self, api, obj):
        self.seen.append("%s/%s" % (obj["metadata"]["namespace"], obj["metadata"]["name"]))
        self.passes.release()


def thing(ns, name):
    return {"kind": "InferenceService", "metadata": {"namespace": ns, "name": name}}


def wait_for(loop, count):
    for _pass in range(count):
        assert loop.passes.acquire(timeout=10), loop.errors
    time.sleep(0.05)  # anything the loop would wrongly do next happens now
    out, loop.seen[:] = list(loop.seen), []
    return out


def test_loop_reconciles_only_the_keys_events_name():
    objects = {"/apis/example.io/v1/namespaces/%s/things/%s" % (ns, n): thing(ns, n) for ns, n in
               (("ns1", "a"), ("ns1", "b"), ("ns2", "c"))}
    cp = FakeControlPlane(objects)
    with Loop(cp) as loop:
        assert sorted(wait_for(loop, 3)) == ["ns1/a", "ns1/b", "ns2/c"]  # start: one full pass
        assert cp.calls() == [("LIST", Loop.LIST_PATH)]
        # a Deployment event: its owner only, one GET, no LIST
        loop._on_event(event("Deployment", "a-predictor", owners=[("InferenceService", "a")]))  # pylint: disable=protected-access
        assert wait_for(loop, 1) == ["ns1/a"]
        assert cp.calls() == [("GET", "/apis/example.io/v1/namespaces/ns1/things/a")]
        # a deleted object: a 404, nothing reconciled, no error
        loop._on_event(event("InferenceService", "gone", etype="DELETED"))  # pylint: disable=protected-access
        deadline = time.monotonic() + 10
        while not cp.log and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert cp.calls() == [("GET", "/apis/example.io/v1/namespaces/ns1/things/gone")] and loop.seen == [] and loop.errors == []
        # a runtime of ns2: one LIST of that namespace
        loop._on_event(event("ServingRuntime", "rt", namespace="ns2"))  # pylint: disable=protected-access
        assert wait_for(loop, 1) == ["ns2/c"]
        assert cp.calls() == [("LIST", "/apis/example.io/v1/namespaces/ns2/things")]
        # wake(): a full pass again
        loop.wake()
        assert sorted(wait_for(loop, 3)) == ["ns1/a", "ns1/b", "ns2/c"]
        assert cp.calls() == [("LIST", Loop.LIST_PATH)]


def test_kubelet_handles_the_pod_an_event_carries_and_gets_a_deferred_one():
    objects = {"/api/v1/namespaces/ns1/pods/p2": {"metadata": {"namespace": "ns1", "name": "p2"}}}
    cp = FakeControlPlane(objects)
    kubelet = KubeletStandIn.__new__(KubeletStandIn)  # only the queue-reading part: no node, no servers
    carried = {"metadata": {"namespace": "ns1", "name": "p1", "resourceVersion": "7"}}
    pods = kubelet._pods(cp.rest(), {("ns1", "p1"): {"type": "MODIFIED", "object": carried},  # pylint: disable=protected-access
                                     ("ns1", "p2"): None, ("ns1", "gone"): None})
    assert pods == [("MODIFIED", carried), ("GOT", objects["/api/v1/namespaces/ns1/pods/p2"])]
    assert cp.calls() == [("GET", "/api/v1/namespaces/ns1/pods/gone"), ("GET", "/api/v1/namespaces/ns1/pods/p2")]
