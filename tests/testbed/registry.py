"""A real OCI registry on loopback for the Modelcar tests and benchmark.

Debian's ``docker-registry`` (distribution 2.8) started with our own config on a free 127.0.0.1 port, in one of
three auth setups:

- ``auth=None``: anonymous.
- ``auth="htpasswd"``: Basic auth against an htpasswd file (bcrypt, written with apache2-utils' ``htpasswd``).
- ``auth="token"``: distribution's ``auth: token`` (the Docker token flow Harbor, Quay and Artifactory use):
  the registry answers 401 with ``WWW-Authenticate: Bearer realm=...``; a small token server here (Python,
  another loopback port) checks Basic credentials and issues RS256 JWTs carrying the certificate chain
  (``x5c``) of a key whose self-signed certificate the registry trusts via ``rootcertbundle``.

``tls=True`` serves HTTPS with a throwaway CA (``registry.ca_file``). ``ensure_tools()`` apt-installs the
packages the tests need when they are missing (docker-registry, skopeo, busybox-static, apache2-utils).
Every process started is stopped by ``stop()`` (the context manager does it).
"""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

from . import ports as _ports

PACKAGES = {"docker-registry": "docker-registry", "skopeo": "skopeo", "busybox": "busybox-static", "htpasswd": "apache2-utils"}


def ensure_tools(extra=()):
    """Install the Debian packages for the registry tests when their commands are missing."""
    wanted = dict(PACKAGES)
    wanted.update(dict(extra))
    missing = sorted({pkg for cmd, pkg in wanted.items() if shutil.which(cmd) is None})
    if not os.path.exists("/bin/busybox") and not os.path.exists("/usr/bin/busybox"):
        missing.append("busybox-static")
    if not missing:
        return
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(sudo + ["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + sorted(set(missing)), check=True, env=env,
                   stdout=subprocess.DEVNULL)


def free_port():
    return _ports.free_port()


def _b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _make_cert(workdir, name, is_ca, issuer=None, ip=None):
    """A key + certificate with ``cryptography`` (a dependency of ansible-core). Returns (key, cert, key_path, cert_path)."""
    from cryptography import x509  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=import-outside-toplevel
    from cryptography.hazmat.primitives.asymmetric import rsa  # pylint: disable=import-outside-toplevel
    from cryptography.x509.oid import NameOID  # pylint: disable=import-outside-toplevel
    import ipaddress  # pylint: disable=import-outside-toplevel

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    issuer_key, issuer_cert = issuer if issuer else (key, None)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(issuer_cert.subject if issuer_cert else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True))
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    key_path = os.path.join(workdir, name + ".key")
    cert_path = os.path.join(workdir, name + ".crt")
    with open(key_path, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))
    with open(cert_path, "wb") as fh:
        fh.write(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, key_path, cert_path


class TokenServer:
    """Docker token service: ``GET /token?service=S&scope=repository:R:pull,push`` with Basic auth -> JWT."""

    def __init__(self, workdir, users, service="modelcar-test-registry", issuer="modelcar-test-issuer"):
        self.users = dict(users)
        self.service = service
        self.issuer = issuer
        self.key, self.cert, _kp, self.cert_path = _make_cert(workdir, "token-signer", is_ca=True)
        from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
        self.x5c = base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode("ascii")
        self.port = free_port()
        self.requests = []
        self.httpd = None
        self.thread = None

    @property
    def realm(self):
        return "http://127.0.0.1:%d/token" % self.port

    def sign(self, claims):
        from cryptography.hazmat.primitives import hashes  # pylint: disable=import-outside-toplevel
        from cryptography.hazmat.primitives.asymmetric import padding  # pylint: disable=import-outside-toplevel
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        signing_input = _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
        sig = self.key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        return signing_input + "." + _b64url(sig)

    def issue(self, user, scopes):
        now = int(time.time())
        access = []
        for scope in scopes:
            parts = scope.split(":")
            if len(parts) >= 3 and parts[0] == "repository":
                access.append({"type": "repository", "name": ":".join(parts[1:-1]), "actions": parts[-1].split(",")})
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": uuid.uuid4().hex, "access": access}
        return self.sign(claims)

    def start(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # noqa: D401 - quiet
                pass

            def do_GET(self):  # noqa: N802 - http.server API
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                auth = self.headers.get("Authorization", "")
                user = None
                if auth.startswith("Basic "):
                    name, _sep, pwd = base64.b64decode(auth[6:]).decode("utf-8", "replace").partition(":")
                    if server.users.get(name) == pwd:
                        user = name
                server.requests.append({"path": url.path, "query": query, "user": user})
                if url.path != "/token" or user is None or query.get("service", [None])[0] != server.service:
                    body = json.dumps({"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}).encode()
                    self.send_response(401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                token = server.issue(user, query.get("scope", []))
                body = json.dumps({"token": token, "access_token": token, "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        if self.httpd:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


class Registry:
    """``with Registry(tmpdir, auth="htpasswd") as reg: reg.host`` -> "127.0.0.1:PORT"."""

    def __init__(self, workdir, auth=None, users=None, tls=False):
        if auth not in (None, "htpasswd", "token"):
            raise ValueError("auth must be None, 'htpasswd' or 'token'")
        self.workdir = os.path.abspath(workdir)
        self.auth = auth
        self.users = dict(users or {"alice": "s3cret-Pa55"})
        self.tls = tls
        self.port = free_port()
        self.proc = None
        self.token_server = None
        self.ca_file = None
        self.log_path = os.path.join(self.workdir, "registry.log")
        self.storage = os.path.join(self.workdir, "storage")

    @property
    def host(self):
        return "127.0.0.1:%d" % self.port

    @property
    def url(self):
        return "%s://%s" % ("https" if self.tls else "http", self.host)

    def _config(self):
        lines = [
            "version: 0.1",
            "log:",
            "  level: info",
            "  accesslog:",
            "    disabled: false",
            "storage:",
            "  filesystem:",
            "    rootdirectory: %s" % self.storage,
            "  delete:",
            "    enabled: true",
            "  maintenance:",
            "    uploadpurging:",
            "      enabled: false",
            "http:",
            "  addr: 127.0.0.1:%d" % self.port,
            "  secret: modelcar-test-secret",
        ]
        if self.tls:
            ca_key, ca_cert, _k, self.ca_file = _make_cert(self.workdir, "test-ca", is_ca=True)
            _key, _cert, key_path, cert_path = _make_cert(self.workdir, "registry", is_ca=False, issuer=(ca_key, ca_cert), ip="127.0.0.1")
            lines += ["  tls:", "    certificate: %s" % cert_path, "    key: %s" % key_path]
        if self.auth == "htpasswd":
            path = os.path.join(self.workdir, "htpasswd")
            with open(path, "w", encoding="utf-8") as fh:
                for user, pwd in self.users.items():
                    out = subprocess.run(["htpasswd", "-Bbn", user, pwd], check=True, capture_output=True, text=True).stdout
                    fh.write(out.strip() + "\n")
            lines += ["auth:", "  htpasswd:", "    realm: modelcar-test", "    path: %s" % path]
        elif self.auth == "token":
            self.token_server = TokenServer(self.workdir, self.users)
            self.token_server.start()
            lines += ["auth:", "  token:", "    realm: %s" % self.token_server.realm,
                      "    service: %s" % self.token_server.service, "    issuer: %s" % self.token_server.issuer,
                      "    rootcertbundle: %s" % self.token_server.cert_path]
        return "\n".join(lines) + "\n"

    def start(self, timeout=30):
        os.makedirs(self.storage, exist_ok=True)
        cfg = os.path.join(self.workdir, "config.yml")
        with open(cfg, "w", encoding="utf-8") as fh:
            fh.write(self._config())
        log = open(self.log_path, "ab")  # pylint: disable=consider-using-with
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        self.proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=log, stderr=subprocess.STDOUT,  # pylint: disable=consider-using-with
                                     env=env, start_new_session=True)
        log.close()
        ctx = ssl.create_default_context(cafile=self.ca_file) if self.tls else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("docker-registry exited with %s; log:\n%s" % (self.proc.returncode, self.log()))
            try:
                urllib.request.urlopen(self.url + "/v2/", timeout=2, context=ctx)  # nosec - loopback test registry
                return self
            except urllib.error.HTTPError:
                return self  # 401: up, wants auth
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("docker-registry did not answer on %s within %d s" % (self.url, timeout))

    def log(self):
        try:
            with open(self.log_path, "r", encoding="utf-8", errors="replace") as fh:
                return fh.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self.token_server:
            self.token_server.stop()
            self.token_server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- helpers for assertions --------------------------------------------------------------------
    def skopeo_creds(self):
        if self.auth:
            user, pwd = next(iter(self.users.items()))
            return ["--creds", "%s:%s" % (user, pwd)]
        return []

    def skopeo_tls(self, prefix):
        """skopeo flags for this registry's TLS; ``prefix`` is "src", "dest" or "" (inspect)."""
        flag = "--%s-" % prefix if prefix else "--"
        if self.tls:
            certs = os.path.join(self.workdir, "skopeo-certs")
            os.makedirs(certs, exist_ok=True)
            shutil.copy(self.ca_file, os.path.join(certs, "ca.crt"))
            return [flag + "cert-dir", certs]
        return [flag + "tls-verify=false"]
