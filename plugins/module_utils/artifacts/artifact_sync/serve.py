# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tiny file server for the controller-directory source: the stager Job pulls from it (``--serve DIR``)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import urllib.parse

from .common import MANIFEST_NAME, MANIFEST_SCHEMA, atomic_write_json, emit
from .sources import LocalSource


def serve(root, host="127.0.0.1", port=0, ready=None, idle_exit=0, ready_file=None):  # pragma: no cover - exercised through the CLI in tests
    """Serve ``root`` read-only with a generated index (sizes) at /.spec-decoding-manifest.json and Range support.

    With ``idle_exit`` the server stops once it has served something and then sat that many seconds
    without a request in flight (the stager pod may take long to start; a hard limit is the caller's).
    ``ready_file`` is written with the URL once the port is bound and removed when the server stops, so a
    caller that starts the server in the background knows it listens (and not some other process on the port).
    """
    import http.server  # pylint: disable=import-outside-toplevel
    import socketserver  # pylint: disable=import-outside-toplevel,unused-import

    src = LocalSource(root)
    files = {f.path: f for f in src.list_files()}
    index = json.dumps({"schema": MANIFEST_SCHEMA, "name": src.default_name(), "source": src.uri,
                        "files": {p: {"size": f.size, "fingerprint": f.fingerprint} for p, f in files.items()}}).encode("utf-8")

    activity = {"last": time.monotonic(), "active": 0, "seen": False}
    activity_lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle_one_request(self):
            with activity_lock:
                activity["active"] += 1
                activity["seen"] = True
            try:
                super().handle_one_request()
            finally:
                with activity_lock:
                    activity["active"] -= 1
                    activity["last"] = time.monotonic()

        def log_message(self, format, *args):  # pylint: disable=redefined-builtin
            pass

        def _target(self):
            rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
            return rel

        def do_HEAD(self):  # pylint: disable=invalid-name
            self.do_GET(head=True)

        def do_GET(self, head=False):  # pylint: disable=invalid-name
            rel = self._target()
            if rel == MANIFEST_NAME:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(index)))
                self.end_headers()
                if not head:
                    self.wfile.write(index)
                return
            entry = files.get(rel)
            if entry is None:
                self.send_error(404)
                return
            start = 0
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
                start = min(int(rng[6:].split("-")[0]), entry.size)
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(entry.size - start))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (start, entry.size - 1, entry.size))
            self.end_headers()
            if head:
                return
            with open(entry.local, "rb") as fh:
                fh.seek(start)
                shutil.copyfileobj(fh, self.wfile, 1 << 20)

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    url = "http://%s:%d/" % server.server_address[:2]
    if ready is not None:
        ready(server)
    if ready_file:
        atomic_write_json(ready_file, {"url": url, "pid": os.getpid()}, fsync=False)
    emit(sys.stdout, json.dumps({"serving": root, "url": url, "files": len(files)}))

    def watchdog():
        while idle_exit:
            time.sleep(min(1.0, idle_exit))
            with activity_lock:
                idle = activity["seen"] and activity["active"] == 0 and time.monotonic() - activity["last"] >= idle_exit
            if idle:
                server.shutdown()
                return

    if idle_exit:
        threading.Thread(target=watchdog, daemon=True).start()
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if ready_file:
            try:
                os.unlink(ready_file)
            except FileNotFoundError:  # the caller already removed its marker directory
                pass
