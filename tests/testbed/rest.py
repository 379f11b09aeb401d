"""A tiny JSON REST client for the test bed's own plumbing (stand-ins, CRD install): plain dicts in and out,
one keep-alive HTTPS connection per object (not thread-safe: one per thread). Tests of product behaviour use
the real clients (`kubernetes`, kubernetes.core); this only keeps the stand-ins independent of client
library versions."""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.parse


class ApiError(Exception):
    def __init__(self, status: int, body: str, method: str, path: str):
        self.status = status
        self.body = body
        try:
            self.message = json.loads(body).get("message", body)
        except ValueError:
            self.message = body
        super().__init__(f"{method} {path}: HTTP {status}: {self.message}")


class Rest:
    def __init__(self, server: str, token: str, ca_path: str, timeout: float = 60.0):
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname, url.port
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca_path)
        self.timeout = timeout
        self._conn = None

    def close(self) -> None:
        """Close the connection; a `stream()` being read in another thread sees its end at once (the shutdown wakes a
        blocked read, which a plain close does not)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            conn.close()

    def _send(self, method: str, path: str, body, query, content_type):
        """(response, path with query) of one request on this object's connection; the body is not read yet."""
        if query:
            path = f"{path}?{urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})}"
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=self.timeout)
        self._conn.request(method, path, body=data, headers=headers)
        return self._conn.getresponse(), path

    def request(self, method: str, path: str, body=None, query: dict | None = None,
                content_type: str = "application/json", raw: bool = False):
        for attempt in (0, 1):
            try:
                resp, full = self._send(method, path, body, query, content_type)
                payload = resp.read()
                break
            except (http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        text = payload.decode("utf-8", errors="replace")
        if resp.status >= 400:
            raise ApiError(resp.status, text, method, full)
        if raw:
            return text
        return json.loads(text) if text else None

    def stream(self, path, **query):
        """GET `path` and return the open response, to be read line by line (a watch: one JSON event a line)."""
        resp, full = self._send("GET", path, None, query, "application/json")
        if resp.status >= 400:
            raise ApiError(resp.status, resp.read().decode("utf-8", errors="replace"), "GET", full)
        return resp

    def get(self, path, **query):
        return self.request("GET", path, query=query or None)

    def post(self, path, body):
        return self.request("POST", path, body)

    def put(self, path, body):
        return self.request("PUT", path, body)

    def patch(self, path, body, patch_type: str = "merge"):
        ctype = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                 "strategic": "application/strategic-merge-patch+json"}[patch_type]
        return self.request("PATCH", path, body, content_type=ctype)

    def delete(self, path, body=None):
        return self.request("DELETE", path, body)
