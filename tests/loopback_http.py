"""A test HTTP server on the loopback address, for tests that stand in for an OpenAI-compatible endpoint."""
import contextlib
import threading
from http.server import ThreadingHTTPServer


@contextlib.contextmanager
def serving(handler):
    """Serve ``handler`` (a BaseHTTPRequestHandler class) on 127.0.0.1 at a free port in a daemon thread.

    Yields the base URL (``http://127.0.0.1:PORT``); the server is shut down and its socket closed on exit.
    """
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield "http://127.0.0.1:%d" % httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
