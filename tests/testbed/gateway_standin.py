"""A Gateway API stand-in: routes HTTP on loopback as the HTTPRoutes on the test bed's API server say (issue #52).

Free of the product's code, like the KServe and GitOps stand-ins. What it does, from Gateway API v1.6.1's HTTPRoute API
(apis/v1/httproute_types.go, the documentation of ``HTTPRouteRule.matches``, ``HTTPRouteSpec.hostnames`` and
``HTTPBackendRef.weight``), pinned to the project's conformance cases ported as data
(tests/data/gateway-httproute-conformance.yaml, tests/unit/test_gateway_standin.py):

- hostnames: a route without hostnames takes every host; an exact name matches that host, ``*.example.com`` any host
  with at least one more label in front; between routes whose hostnames intersect the request's host, the one whose
  matching hostname has the most characters, non-wildcard first, wins;
- matches: path ``Exact`` / ``PathPrefix`` (element-wise: ``/v2`` takes ``/v2`` and ``/v2/x``, not ``/v2x``) /
  ``RegularExpression``; headers (names case-insensitive, ``Exact`` or ``RegularExpression`` values), query parameters
  (names case-sensitive), method. A rule without matches, and a match without a path, are ``PathPrefix /``. Every part of
  one match must hold (AND), any match of a rule will do (OR);
- precedence across every rule of every route: an Exact path, then the longest path value, a method, the most header
  matches, the most query parameter matches; then the oldest route (creationTimestamp), then ``namespace/name``
  alphabetically; then the first rule and match in list order;
- backendRefs: Services (``group: ""``, ``kind: Service``) with ``port``; one is picked at random by ``weight``
  (default 1; weight 0 never); no rule: 404; all weights 0, or a Service without a ready endpoint: 500.
- The chosen Service's endpoints come from its Endpoints object (the Service port's name gives the endpoint port), and
  ``dial(ip, port)`` connects to one (the test bed's NodeNetwork.dial for process-mode pods; a plain TCP connect by
  default). The response streams back as it arrives (server-sent events included), close-delimited, with the header
  ``x-gateway-standin-backend: <namespace>/<service>`` naming where the request went.
"""
from __future__ import annotations

import datetime
import http.client
import random
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

GROUP = "gateway.networking.k8s.io"
BACKEND_HEADER = "x-gateway-standin-backend"
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
                         "proxy-authenticate", "proxy-authorization"))
_ROOT = {"type": "PathPrefix", "value": "/"}


# -- matching (pure) --------------------------------------------------------------------------------------------------
def _host_score(route: dict, host: str):
    """None when the route does not take ``host``; else (characters of a matching non-wildcard name, of any matching name)."""
    names = (route.get("spec") or {}).get("hostnames") or []
    if not names:
        return (0, 0)
    host = (host or "").split(":", 1)[0].lower().rstrip(".")
    best = None
    for name in names:
        name = name.lower()
        if name.startswith("*."):
            suffix = name[1:]
            if host.endswith(suffix) and len(host) > len(suffix):
                score = (0, len(name))
            else:
                continue
        elif host == name:
            score = (len(name), len(name))
        else:
            continue
        best = score if best is None or score > best else best
    return best


def _path_matches(path_match: dict, path: str) -> bool:
    kind, value = path_match.get("type", "PathPrefix"), path_match.get("value", "/")
    if kind == "Exact":
        return path == value
    if kind == "RegularExpression":
        return re.fullmatch(value, path) is not None
    prefix = value.rstrip("/")
    return not prefix or path == prefix or path.startswith(prefix + "/")


def _headers_match(header_matches: list, headers: dict) -> bool:
    for item in header_matches or []:
        got = headers.get(item["name"].lower())
        if got is None:
            return False
        if item.get("type", "Exact") == "RegularExpression":
            if re.fullmatch(item["value"], got) is None:
                return False
        elif got != item["value"]:
            return False
    return True


def _query_match(query_matches: list, query: list) -> bool:
    for item in query_matches or []:
        values = [v for k, v in query if k == item["name"]]
        if item.get("type", "Exact") == "RegularExpression":
            if not any(re.fullmatch(item["value"], v) for v in values):
                return False
        elif item["value"] not in values:
            return False
    return True


def _timestamp(route: dict) -> str:
    return (route.get("metadata") or {}).get("creationTimestamp") or ""


def select(routes: list, method: str, target: str, headers: dict, host: str = ""):
    """``(route, rule index, rule)`` of the rule that takes the request, or None (404). ``target`` is the request's path
    with its query; ``headers`` any mapping (names compared case-insensitively)."""
    parts = urlsplit(target)
    path, query = parts.path or "/", parse_qsl(parts.query, keep_blank_values=True)
    lowered = {str(k).lower(): v for k, v in headers.items()}
    best = None
    for route in routes:
        host_score = _host_score(route, host)
        if host_score is None:
            continue
        meta = route.get("metadata") or {}
        route_key = (_timestamp(route), "%s/%s" % (meta.get("namespace", ""), meta.get("name", "")))
        for rule_index, rule in enumerate((route.get("spec") or {}).get("rules") or [{}]):
            for match_index, match in enumerate(rule.get("matches") or [{}]):
                path_match = match.get("path") or _ROOT
                if not _path_matches(path_match, path) or (match.get("method") and match["method"] != method):
                    continue
                if not _headers_match(match.get("headers"), lowered) or not _query_match(match.get("queryParams"), query):
                    continue
                # greater is better for the first part, smaller for the ties after it
                score = (host_score, path_match.get("type", "PathPrefix") == "Exact", len(path_match.get("value", "/")),
                         bool(match.get("method")), len(match.get("headers") or []), len(match.get("queryParams") or []))
                key = (tuple(-x for x in _flatten(score)), route_key, rule_index, match_index)
                if best is None or key < best[0]:
                    best = (key, route, rule_index, rule)
    return None if best is None else best[1:]


def _flatten(score):
    out = []
    for part in score:
        out.extend(part if isinstance(part, tuple) else (int(part),))
    return out


def pick_backend(rule: dict, rng=random):
    """One backendRef of ``rule`` drawn by weight (default 1), or None when there is none with weight above 0."""
    refs = [(ref, int(ref.get("weight", 1))) for ref in rule.get("backendRefs") or []]
    total = sum(weight for _ref, weight in refs if weight > 0)
    if total <= 0:
        return None
    draw = rng.random() * total
    for ref, weight in refs:
        if weight <= 0:
            continue
        if draw < weight:
            return ref
        draw -= weight
    return [ref for ref, weight in refs if weight > 0][-1]


# -- the proxy on the test bed ------------------------------------------------------------------------------------------
class _DialedConnection(http.client.HTTPConnection):
    def __init__(self, host, port, dial, timeout):
        super().__init__(host, port, timeout=timeout)
        self._dial = dial

    def connect(self):
        self.sock = self._dial(self.host, self.port)
        self.sock.settimeout(self.timeout)


def _plain_dial(ip, port):
    return socket.create_connection((ip, port), timeout=10)


class GatewayStandin:
    """Serves on ``127.0.0.1:<port>`` (``url``) and routes by the HTTPRoutes of ``namespace`` (every namespace with None),
    read from the API server on each request (``rest_factory()`` gives a client with ``get``/``close``)."""

    def __init__(self, rest_factory, namespace: str | None = None, dial=None, port: int = 0, seed: int | None = None,
                 timeout: float = 600.0):
        self.rest_factory, self.namespace = rest_factory, namespace
        self.dial = dial or _plain_dial
        self.timeout = timeout
        self.rng = random.Random(seed)
        self.served = []  # (method, path, class header, "namespace/service" or status) per request, for the tests
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def _handle(self):
                standin.forward(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="gateway-standin", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # reads
    def _get(self, path):
        api = self.rest_factory()
        try:
            return api.get(path)
        finally:
            api.close()

    def routes(self) -> list:
        where = "/namespaces/%s" % self.namespace if self.namespace else ""
        return self._get("/apis/%s/v1%s/httproutes" % (GROUP, where)).get("items") or []

    def addresses(self, namespace: str, ref: dict) -> list:
        """``[(ip, port)]`` of the ready endpoints behind a Service backendRef."""
        if ref.get("group", "") not in ("", "core") or ref.get("kind", "Service") != "Service":
            return []
        ns = ref.get("namespace") or namespace
        try:
            svc = self._get("/api/v1/namespaces/%s/services/%s" % (ns, ref["name"]))
            endpoints = self._get("/api/v1/namespaces/%s/endpoints/%s" % (ns, ref["name"]))
        except Exception:  # pylint: disable=broad-except  # no Service or no Endpoints: no ready address
            return []
        port = next((p for p in svc["spec"].get("ports") or [] if p.get("port") == ref.get("port")), None)
        if port is None:
            return []
        out = []
        for subset in endpoints.get("subsets") or []:
            target = next((p["port"] for p in subset.get("ports") or [] if (p.get("name") or "") == (port.get("name") or "")), None)
            if target is not None:
                out.extend((address["ip"], target) for address in subset.get("addresses") or [])
        return out

    # the request
    def _reply(self, handler, status: int, text: str, backend: str = "") -> None:
        body = text.encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(body)))
        if backend:
            handler.send_header(BACKEND_HEADER, backend)
        handler.end_headers()
        handler.wfile.write(body)

    def forward(self, handler) -> None:
        headers = dict(handler.headers.items())
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        chosen = select(self.routes(), handler.command, handler.path, headers, handler.headers.get("Host", ""))
        klass = handler.headers.get("x-request-class")
        if chosen is None:
            self.served.append((handler.command, handler.path, klass, 404))
            self._reply(handler, 404, "no HTTPRoute rule takes %s %s\n" % (handler.command, handler.path))
            return
        route, _index, rule = chosen
        ref = pick_backend(rule, self.rng)
        namespace = (route.get("metadata") or {}).get("namespace", "default")
        addresses = self.addresses(namespace, ref) if ref else []
        if not addresses:
            self.served.append((handler.command, handler.path, klass, 500))
            self._reply(handler, 500, "no ready backend for the rule\n")
            return
        backend = "%s/%s" % (ref.get("namespace") or namespace, ref["name"])
        self.served.append((handler.command, handler.path, klass, backend))
        ip, port = addresses[self.rng.randrange(len(addresses))]
        conn = _DialedConnection(ip, port, self.dial, self.timeout)
        try:
            upstream_headers = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(handler.command, handler.path, body=body, headers=upstream_headers)
            resp = conn.getresponse()
            handler.send_response(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                    handler.send_header(key, value)
            handler.send_header(BACKEND_HEADER, backend)
            handler.send_header("Connection", "close")  # close-delimited: streams go out as they arrive
            handler.end_headers()
            handler.close_connection = True
            if handler.command != "HEAD":
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    handler.wfile.write(chunk)
                    handler.wfile.flush()
        except (OSError, http.client.HTTPException) as exc:
            try:
                self._reply(handler, 502, "backend %s failed: %s\n" % (backend, exc), backend)
            except OSError:
                pass
        finally:
            conn.close()


def creation_timestamps(routes: list, start: datetime.datetime | None = None) -> list:
    """``routes`` (``{"name", "spec"}``) as HTTPRoute objects created one second apart in list order (for the tests)."""
    start = start or datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    out = []
    for index, route in enumerate(routes):
        stamp = (start + datetime.timedelta(seconds=index)).strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append({"metadata": {"name": route["name"], "namespace": route.get("namespace", "gateway-conformance-infra"),
                                 "creationTimestamp": stamp}, "spec": route["spec"]})
    return out
