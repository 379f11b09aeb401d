"""Wake a stand-in's reconcile loop on every change the API server reports, instead of polling a LIST every 0.1 s.

A real controller is driven by watches (client-go informers); the stand-ins keep their simple "list everything and
reconcile" pass, but run it when a watch event arrives (or a resync interval passes), not on a clock. Polling made the
loops list every resource of the control plane up to ten times a second: each LIST is a quorum read from etcd plus a
full encode in kube-apiserver, and with one control plane per test worker that was a large share of the integration
tier's CPU (see docs/DEVELOPING.md, "Keeping the suite fast").

One thread per watched path: `GET path?watch=1&resourceVersion=<rv of a fresh list>`; every event line sets the
shared `threading.Event`. When the watch ends (timeoutSeconds, an expired resourceVersion, the API server restarting
in a fault test) the thread sets the event too and starts again, so nothing that happened in between is missed: the
woken loop lists everything anyway.
"""
from __future__ import annotations

import http.client
import threading
import urllib.parse

from .rest import ApiError

WATCH_SECONDS = 60


class WatchWaker:
    """Sets `event` on every watch event of each path in `paths` (list paths, with an optional `?labelSelector=`)."""

    def __init__(self, controlplane, paths, event: threading.Event, stop: threading.Event, name: str = "watch"):
        self.cp = controlplane
        self.paths = list(paths)
        self.event = event
        self.stop_event = stop
        self.name = name
        self._threads = []
        self._clients = {}
        self._lock = threading.Lock()

    def start(self) -> "WatchWaker":
        for path in self.paths:
            thread = threading.Thread(target=self._run, args=(path,), name=f"{self.name}-watch", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Close the open watch connections so the threads see the stop event at once."""
        with self._lock:
            clients = list(self._clients.values())
        for api in clients:
            api.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _run(self, path: str) -> None:
        base, _sep, own = path.partition("?")
        params = dict(urllib.parse.parse_qsl(own))
        while not self.stop_event.is_set():
            api = self.cp.rest(timeout=WATCH_SECONDS + 15)
            with self._lock:
                self._clients[path] = api
            try:
                rv = api.get(base, limit="1", **params)["metadata"].get("resourceVersion", "")
                self.event.set()  # whatever happened before this watch starts is seen by the woken loop's list
                resp = api.stream(base, watch="1", resourceVersion=rv, timeoutSeconds=str(WATCH_SECONDS),
                                  allowWatchBookmarks="false", **params)
                while not self.stop_event.is_set():
                    line = resp.readline()
                    if not line:
                        break
                    if line.strip():
                        self.event.set()
            except ApiError as exc:
                if exc.status == 404:
                    return  # a kind this control plane does not serve (yet): the resync interval covers it
                self.event.set()
                self.stop_event.wait(0.2)
            except (OSError, http.client.HTTPException, ValueError, KeyError, AttributeError):
                # The API server is restarting (fault tests) or the connection was closed by stop(): try again shortly.
                self.event.set()
                self.stop_event.wait(0.2)
            finally:
                with self._lock:
                    self._clients.pop(path, None)
                api.close()
