"""What drives the test bed's controller stand-ins: watches that name the objects that changed, and a work queue of
their keys, as a real controller's informers and work queue do (client-go).

Each watch event is mapped to the key of the object to reconcile (`namespace/name`; an InferenceService for a change
of its Deployment, say) and the key goes into a `WorkQueue`; the stand-in's loop takes the keys, GETs each object and
reconciles only those. A full pass (list every object and reconcile each) runs at start, when a watch had to list again
(it may have missed events), when the test process asks (`wake()`: a behaviour set in-process changes nothing the API
server could report) and as a periodic resync. Before the queue every event made a full pass: on a measured run the
stand-ins' LISTs were most of the 114 000 requests the control planes served (docs/DEVELOPING.md, "Keeping the suite
fast").

One thread per watched path: `GET path?watch=1&resourceVersion=<rv>`, one JSON event a line. A watch that ends normally
(timeoutSeconds) starts again from the resourceVersion of the last event it saw (bookmarks keep it fresh), so nothing in
between is missed and no full pass is needed; one that fails (an expired resourceVersion, the API server restarting in
a fault test) lists again for a fresh resourceVersion and asks for a full pass (`on_relist`).
"""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse

from .rest import ApiError

WATCH_SECONDS = 60
# The stand-ins' periodic full pass, for what no watch reports. Every change they react to is watched (their own kind,
# what they own, what their reconcile reads) or comes with wake() or a deferred key (the kubelet's readiness delays), so
# this is a safety net: with 600 s, the integration files that exercise the stand-ins passed without it (measured in
# docs/DEVELOPING.md, "Keeping the suite fast"). Each pass costs a LIST and a reconcile of every object, so it is not
# shorter.
RESYNC_SECONDS = 10.0
# The key that stands for every object: a full pass. (namespace, None) stands for every object of one namespace.
EVERYTHING = (None, None)


def owner_key(obj: dict, kind: str, label: str, part_of: tuple | None = None):
    """(namespace, name) of the `kind` object that owns `obj` (a Deployment, Service, Pod...): its ownerReference of
    that kind, else its `label` (pods are owned by ReplicaSets or LeaderWorkerSets but carry the owner's name as a
    label); `part_of=(label, value)` requires that label too before `label` is trusted. None: not owned by one."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("name"):
            return (ns, ref["name"])
    labels = meta.get("labels") or {}
    if part_of is not None and labels.get(part_of[0]) != part_of[1]:
        return None
    name = labels.get(label)
    return (ns, name) if name else None


class WorkQueue:
    """Keys to reconcile, each at most once however many events named it (with the latest object an event carried, or
    None), keys deferred to a time (`add_after`: a pod's readiness delay ends), and the periodic resync. Thread-safe:
    watch threads add, the stand-in's loop takes."""

    def __init__(self):
        self._cond = threading.Condition()
        self._dirty = {}  # key -> the latest event object for it, or None
        self._later = {}  # key -> monotonic time it is due
        self._closed = False

    def add(self, key, obj=None) -> None:
        with self._cond:
            if obj is not None or key not in self._dirty:
                self._dirty[key] = obj
            self._cond.notify()

    def add_after(self, key, due: float) -> None:
        """Add `key` at monotonic time `due` (the earliest wins when it is deferred twice)."""
        with self._cond:
            if key not in self._later or due < self._later[key]:
                self._later[key] = due
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, resync_at: float):
        """Wait until some key is dirty or due and return {key: object or None} of all of them (the queue is then empty);
        at monotonic time `resync_at` with nothing to do return {EVERYTHING: None} (the resync). None once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                now = time.monotonic()
                for key, due in list(self._later.items()):
                    if due <= now:
                        del self._later[key]
                        self._dirty.setdefault(key, None)
                if self._dirty:
                    out, self._dirty = self._dirty, {}
                    return out
                if now >= resync_at:
                    return {EVERYTHING: None}
                self._cond.wait(min([resync_at] + list(self._later.values())) - now)


class WatchWaker:
    """Calls `on_event(event)` for every watch event (a dict with `type` and `object`) of each path in `paths` (list
    paths, with an optional `?labelSelector=`), and `on_relist()` whenever a watch starts from a fresh list: events may
    have been missed before it, the caller runs a full pass. Both run on the watch threads: keep them short."""

    def __init__(self, controlplane, paths, on_event, on_relist, stop: threading.Event, name: str = "watch"):
        self.cp = controlplane
        self.paths = list(paths)
        self.on_event = on_event
        self.on_relist = on_relist
        self.stop_event = stop
        self.name = name
        self._threads = []
        self._started = [threading.Event() for _path in self.paths]
        self._clients = {}
        self._lock = threading.Lock()

    def start(self) -> "WatchWaker":
        for path, started in zip(self.paths, self._started):
            thread = threading.Thread(target=self._run, args=(path, started), name=f"{self.name}-watch", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wait_started(self, timeout: float) -> None:
        """Wait (at most `timeout` s in all) until every path's first watch was opened (or failed): a full pass run after
        that sees everything no watch will report."""
        deadline = time.monotonic() + timeout
        for started in self._started:
            started.wait(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Close the open watch connections so the threads see the stop event at once."""
        with self._lock:
            clients = list(self._clients.values())
        for api in clients:
            api.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _run(self, path: str, started: threading.Event) -> None:
        base, _sep, own = path.partition("?")
        params = dict(urllib.parse.parse_qsl(own))
        rv = None  # where the next watch starts: the last resourceVersion seen; None: list for a fresh one
        while not self.stop_event.is_set():
            api = self.cp.rest(timeout=WATCH_SECONDS + 15)
            with self._lock:
                self._clients[path] = api
            try:
                if rv is None:
                    rv = api.get(base, limit="1", **params)["metadata"].get("resourceVersion", "")
                    self.on_relist()  # whatever happened before this watch starts is seen by that full pass
                resp = api.stream(base, watch="1", resourceVersion=rv, timeoutSeconds=str(WATCH_SECONDS),
                                  allowWatchBookmarks="true", **params)
                started.set()
                while not self.stop_event.is_set():
                    line = resp.readline()
                    if not line:
                        break  # timeoutSeconds: the next watch resumes at rv
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        rv = None  # e.g. 410 Gone (rv too old): list again
                        break
                    rv = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion") or rv
                    if event.get("type") != "BOOKMARK":
                        self.on_event(event)
            except ApiError as exc:
                started.set()
                if exc.status == 404:
                    return  # a kind this control plane does not serve (yet): the resync interval covers it
                rv = None
                self.stop_event.wait(0.2)
            except (OSError, http.client.HTTPException, ValueError, KeyError, AttributeError):
                # The API server is restarting (fault tests) or the connection was closed by stop(): list again shortly.
                started.set()
                rv = None
                self.stop_event.wait(0.2)
            finally:
                with self._lock:
                    self._clients.pop(path, None)
                api.close()
