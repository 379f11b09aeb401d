# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small OCI distribution client (stdlib ``http.client``); the Modelcar push that uses it is modelcar_push.py.

- Talks only to the registry named in the image reference, plus the token realm that registry's own
  ``WWW-Authenticate`` challenge names (Harbor, Quay, Artifactory and distribution's ``auth: token``).
- Auth: anonymous, Basic, and Bearer tokens fetched from the challenge's realm with Basic credentials.
- Blobs: ``HEAD`` to skip what is present; uploads are ``POST`` + one streamed ``PATCH`` (the digest is
  computed while the bytes go out, so a file is read once) + ``PUT ?digest=``; never a whole blob in memory.
  Failed uploads are retried with exponential backoff (connection errors, 408/429/5xx).

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.client
import json
import os
import re
import ssl
import threading
import time
import urllib.parse

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.credentials import redact
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import MT_DOCKER_MANIFEST, MT_MANIFEST, sha256_digest

USER_AGENT = "alauda.spec_decoding-modelcar/1"
MANIFEST_ACCEPT = ", ".join([MT_MANIFEST, MT_DOCKER_MANIFEST])
RETRY_STATUS = (408, 429, 500, 502, 503, 504)
_REF_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class RegistryError(SpecDecodingError):
    """The registry could not be reached or refused an operation."""


class RegistryAuthError(RegistryError):
    """The registry (or its token service) rejected the credentials."""


class _Retryable(Exception):
    """Internal: a transient failure worth another attempt."""


# --------------------------------------------------------------------------------------------------
# image references
# --------------------------------------------------------------------------------------------------
class ImageRef:
    """``registry[:port]/repo/path[:tag][@sha256:...]``; the registry part is mandatory (no Docker Hub default)."""

    def __init__(self, registry, repository, tag=None, digest=None):
        self.registry = registry
        self.repository = repository
        self.tag = tag
        self.digest = digest

    @classmethod
    def parse(cls, value, field="image"):
        text = (value or "").strip()
        for prefix in ("oci://", "docker://"):
            if text.startswith(prefix):
                text = text[len(prefix):]
        if not text:
            raise ValidationError("is empty", field=field, hint="give registry/repository:tag, e.g. registry.local:5000/models/llama:v1")
        digest = None
        if "@" in text:
            text, digest = text.split("@", 1)
            if not re.match(r"^sha256:[0-9a-f]{64}$", digest):
                raise ValidationError("%r is not a sha256 digest" % digest, field=field, hint="use @sha256:<64 hex>")
        first, _sep, rest = text.partition("/")
        if not rest or not ("." in first or ":" in first or first == "localhost"):
            raise ValidationError(
                "%r names no registry host" % value, field=field,
                hint="put the registry first, e.g. registry.local:5000/models/llama:v1 (there is no Docker Hub default in an air-gapped site)")
        tag = None
        last = rest.rsplit("/", 1)[-1]
        if ":" in last:
            rest, tag = rest.rsplit(":", 1)
            if not _TAG_RE.match(tag):
                raise ValidationError("tag %r is not valid" % tag, field=field, hint="tags are [A-Za-z0-9_.-], at most 128 characters")
        if not _REF_RE.match(rest):
            raise ValidationError("repository %r is not valid" % rest, field=field,
                                  hint="use lowercase letters, digits and . _ - separated by /")
        if not tag and not digest:
            tag = "latest"
        return cls(first, rest, tag, digest)

    @property
    def reference(self):
        return self.digest or self.tag

    def with_digest(self, digest):
        return "%s/%s@%s" % (self.registry, self.repository, digest)

    def __str__(self):
        out = "%s/%s" % (self.registry, self.repository)
        if self.tag:
            out += ":" + self.tag
        if self.digest:
            out += "@" + self.digest
        return out


def read_auth_file(path, registry):
    """Credentials for ``registry`` from a docker ``config.json`` / containers ``auth.json``."""
    full = os.path.expanduser(path)
    try:
        with open(full, "r", encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise ValidationError("cannot read %s: %s" % (full, exc.strerror), field="auth_file",
                              hint="give a readable docker config.json or containers auth.json") from exc
    except ValueError as exc:
        raise ValidationError("%s is not JSON" % full, field="auth_file", hint="give a docker config.json or containers auth.json") from exc
    auths = data.get("auths") or {}
    for key in (registry, "https://" + registry, "http://" + registry, "https://%s/v1/" % registry, "https://%s/v2/" % registry):
        entry = auths.get(key)
        if entry is None:
            continue
        if entry.get("identitytoken"):
            raise ValidationError("the entry for %s holds an identitytoken (OAuth refresh token), which is not supported" % registry,
                                  field="auth_file", hint="log in with a username and password or robot account")
        if entry.get("auth"):
            try:
                user, _sep, pwd = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValidationError("the auth entry for %s is not base64 of user:password" % registry, field="auth_file",
                                      hint="log in again to rewrite it") from exc
            return user, pwd
        if entry.get("username"):
            return entry["username"], entry.get("password", "")
    raise ValidationError("%s has no credentials for %s (has: %s)" % (full, registry, ", ".join(sorted(auths)) or "none"),
                          field="auth_file", hint="log in to %s first (skopeo login / podman login) or give username/password" % registry)


def _parse_challenge(header):
    """``Bearer realm="x",service="y",scope="z"`` -> ("bearer", {realm, service, scope})."""
    if not header:
        return None, {}
    scheme, _sep, rest = header.strip().partition(" ")
    params = dict((k.lower(), v) for k, v in re.findall(r'(\w+)\s*=\s*"([^"]*)"', rest))
    for k, v in re.findall(r'(\w+)\s*=\s*([^",\s]+)', rest):
        params.setdefault(k.lower(), v)
    return scheme.lower(), params


def _error_text(status, data):
    try:
        errs = json.loads(data or b"{}").get("errors") or []
        text = "; ".join("%s: %s" % (e.get("code", ""), e.get("message", "")) for e in errs)
    except (ValueError, AttributeError):
        text = ""
    if not text:
        text = (data or b"")[:200].decode("utf-8", "replace").strip()
    return "HTTP %d%s" % (status, (" " + text) if text else "")


class Progress:
    """Thread-safe byte counter calling ``callback(done, total, rate_bytes_per_s, final)`` at most every ``interval`` s."""

    def __init__(self, total=0, callback=None, interval=2.0):
        self.total = total
        self.done = 0
        self.callback = callback
        self.interval = interval
        self.start = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()

    def add(self, n):
        with self._lock:
            self.done += n
            now = time.monotonic()
            if self.callback and now - self._last >= self.interval:
                self._last = now
                self.callback(self.done, self.total, self.done / max(now - self.start, 1e-6), False)

    def finish(self):
        if self.callback:
            self.callback(self.done, self.total, self.done / max(time.monotonic() - self.start, 1e-6), True)


# --------------------------------------------------------------------------------------------------
# the client
# --------------------------------------------------------------------------------------------------
class _BlobBody:
    """A blob's HTTP body being read in pieces; closing it closes its connection."""

    def __init__(self, conn, resp):
        self.conn = conn
        self.resp = resp

    def read(self, n=-1):
        return self.resp.read(n if n is not None and n >= 0 else None)

    def close(self):
        self.resp.close()
        self.conn.close()


class RegistryClient:
    """One repository on one registry."""

    def __init__(self, ref, username=None, password=None, tls_verify=True, ca_file=None, timeout=120.0,
                 retries=4, backoff=0.5):
        self.ref = ref
        self.registry = ref.registry
        self.repository = ref.repository
        self.username = username
        self.password = password
        self.tls_verify = tls_verify
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.scheme = "https"
        self.auth_scheme = None
        self.challenge = {}
        self._token = None
        self._token_lock = threading.Lock()
        self._local = threading.local()
        self.requests = 0
        if ca_file and not os.path.isfile(os.path.expanduser(ca_file)):
            raise ValidationError("%s does not exist" % ca_file, field="ca_file", hint="give the PEM file of the registry's CA")
        if tls_verify:
            self.ssl_context = ssl.create_default_context(cafile=os.path.expanduser(ca_file) if ca_file else None)
        else:
            self.ssl_context = ssl._create_unverified_context()  # pylint: disable=protected-access

    # -- secrets never leave in messages ---------------------------------------------------------
    def _scrub(self, text):
        # the password, and the basic-auth header's base64 of user:password
        secrets = [self.password, "%s:%s" % (self.username, self.password)] if self.password else []
        return redact(str(text), secrets, patterns=False, mask="********", min_length=1)

    # -- connections ------------------------------------------------------------------------------
    def _conn(self, scheme, netloc):
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        key = (scheme, netloc)
        conn = conns.get(key)
        if conn is None:
            if scheme == "https":
                conn = http.client.HTTPSConnection(netloc, timeout=self.timeout, context=self.ssl_context)
            else:
                conn = http.client.HTTPConnection(netloc, timeout=self.timeout)
            conns[key] = conn
        return conn

    def _drop(self, scheme, netloc):
        conns = getattr(self._local, "conns", {}) or {}
        conn = conns.pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def close(self):
        for conn in list((getattr(self._local, "conns", {}) or {}).values()):
            conn.close()
        self._local.conns = {}

    def _url(self, path_or_url):
        if path_or_url.startswith("http://") or path_or_url.startswith("https://"):
            return path_or_url
        return "%s://%s%s" % (self.scheme, self.registry, path_or_url)

    def _raw(self, method, url, headers=None, body=None):
        """One HTTP exchange. ``body``: None, bytes, or a callable returning an iterable of chunks."""
        parts = urllib.parse.urlsplit(url)
        target = parts.path + ("?" + parts.query if parts.query else "")
        hdrs = {"User-Agent": USER_AGENT}
        hdrs.update(headers or {})
        if isinstance(body, (bytes, bytearray)):
            hdrs["Content-Length"] = str(len(body))
        elif body is None and method in ("PUT", "POST", "PATCH"):
            hdrs.setdefault("Content-Length", "0")
        conn = self._conn(parts.scheme, parts.netloc)
        self.requests += 1
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders()
            if isinstance(body, (bytes, bytearray)):
                if body:
                    conn.send(body)
            elif body is not None:
                try:
                    for chunk in body():
                        conn.send(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    # The server may have answered early (e.g. 401); read that answer if there is one.
                    pass
            resp = conn.getresponse()
            data = resp.read()
            resp_headers = dict((k.lower(), v) for k, v in resp.getheaders())
            if resp_headers.get("connection", "").lower() == "close":
                self._drop(parts.scheme, parts.netloc)
            return resp.status, resp_headers, data
        except ssl.SSLError:
            # Certificate or protocol trouble does not heal by retrying (and a plain-HTTP server lands here too).
            self._drop(parts.scheme, parts.netloc)
            raise
        except (OSError, http.client.HTTPException) as exc:
            self._drop(parts.scheme, parts.netloc)
            raise _Retryable("%s %s: %s" % (method, parts.netloc, exc)) from exc

    # -- auth -------------------------------------------------------------------------------------
    def _basic(self):
        return "Basic " + base64.b64encode(("%s:%s" % (self.username, self.password or "")).encode("utf-8")).decode("ascii")

    def _auth_header(self):
        if self.auth_scheme == "basic" and self.username:
            return {"Authorization": self._basic()}
        if self.auth_scheme == "bearer" and self._token:
            return {"Authorization": "Bearer " + self._token}
        return {}

    def _fetch_token(self, params):
        realm = params.get("realm")
        if not realm:
            raise RegistryError("registry %s asked for a Bearer token but named no realm" % self.registry,
                                hint="check the registry's token auth configuration")
        scopes = ["repository:%s:pull,push" % self.repository]
        if params.get("scope") and params["scope"] not in scopes:
            scopes.append(params["scope"])
        query = [("scope", s) for s in scopes]
        if params.get("service"):
            query.insert(0, ("service", params["service"]))
        url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
        headers = {"Authorization": self._basic()} if self.username else {}
        status, _hdrs, data = self._retrying(lambda: self._raw("GET", url, headers), "token request to %s" % realm)
        if status in (401, 403):
            who = ("user %r" % self.username) if self.username else "anonymous access"
            raise RegistryAuthError(
                "registry %s: its token service %s rejected %s (%s)" % (self.registry, realm, who, self._scrub(_error_text(status, data))),
                field="password" if self.username else "username",
                hint="check username/password (or auth_file) and that the account may push to %s" % self.repository)
        if status != 200:
            raise RegistryError("registry %s: token service %s answered %s" % (self.registry, realm, _error_text(status, data)),
                                hint="check the registry's token service")
        try:
            body = json.loads(data)
            token = body.get("token") or body.get("access_token")
        except ValueError:
            token = None
        if not token:
            raise RegistryError("registry %s: token service %s returned no token" % (self.registry, realm),
                                hint="check the registry's token service")
        self._token = token

    def _negotiate(self, headers, sent_auth):
        """React to a 401: set up Basic or fetch a Bearer token. Returns True if the request should be retried."""
        scheme, params = _parse_challenge(headers.get("www-authenticate", ""))
        if scheme == "bearer":
            with self._token_lock:
                self.auth_scheme = "bearer"
                self.challenge = params
                self._fetch_token(params)
            return True
        if scheme == "basic":
            if not self.username:
                raise RegistryAuthError("registry %s requires credentials (HTTP 401)" % self.registry, field="username",
                                        hint="give username and password, or auth_file")
            if sent_auth:
                return False
            self.auth_scheme = "basic"
            return True
        return False

    # -- requests with retries and auth ---------------------------------------------------------
    def _retrying(self, attempt, what, retries=None):
        retries = self.retries if retries is None else retries
        delay = self.backoff
        last = None
        for i in range(retries + 1):
            try:
                status, headers, data = attempt()
                if status in RETRY_STATUS and i < retries:
                    last = _error_text(status, data)
                    time.sleep(min(delay, 30))
                    delay *= 2
                    continue
                return status, headers, data
            except _Retryable as exc:
                last = exc
                if i < retries:
                    time.sleep(min(delay, 30))
                    delay *= 2
        raise RegistryError("%s failed after %d attempts: %s" % (what, retries + 1, self._scrub(last)),
                            field="image", hint="check that the registry %s is reachable from this host and running" % self.registry)

    def request(self, method, path, headers=None, body=None, what=None):
        what = what or "%s %s" % (method, path)
        url = self._url(path)
        for _round in range(3):
            sent = self._auth_header()
            hdrs = dict(headers or {})
            hdrs.update(sent)
            status, rheaders, data = self._retrying(lambda h=hdrs: self._raw(method, url, h, body), what)
            if status != 401:
                return status, rheaders, data
            if not self._negotiate(rheaders, bool(sent)):
                break
        if self.username:
            raise RegistryAuthError(
                "registry %s rejected the credentials for user %r (%s)" % (self.registry, self.username, self._scrub(_error_text(status, data))),
                field="password", hint="check username/password or auth_file; the password was not shown")
        raise RegistryAuthError("registry %s requires credentials (%s)" % (self.registry, _error_text(status, data)), field="username",
                                hint="give username and password, or auth_file")

    def _check(self, status, data, ok, what):
        if status in ok:
            return
        if status == 403:
            raise RegistryAuthError("registry %s denied %s (%s)" % (self.registry, what, self._scrub(_error_text(status, data))),
                                    field="username", hint="give an account allowed to push to %s" % self.repository)
        raise RegistryError("registry %s: %s failed: %s" % (self.registry, what, self._scrub(_error_text(status, data))),
                            hint="see the registry's log")

    # -- API --------------------------------------------------------------------------------------
    def ping(self):
        """``GET /v2/``: pick the scheme (https, or http when tls_verify is off and the server speaks plain HTTP) and auth."""
        schemes = ["https"] if self.tls_verify else ["https", "http"]
        last = None
        for scheme in schemes:
            self.scheme = scheme
            try:
                status, headers, data = self._retrying(lambda: self._raw("GET", self._url("/v2/")), "GET /v2/ on %s" % self.registry,
                                                       retries=min(self.retries, 2))
            except ssl.SSLCertVerificationError as exc:
                raise RegistryError("registry %s: TLS certificate not trusted (%s)" % (self.registry, exc.verify_message or exc),
                                    field="ca_file", hint="give the registry's CA as ca_file, or set tls_verify: false") from exc
            except ssl.SSLError as exc:
                last = RegistryError("registry %s: TLS handshake failed (%s)" % (self.registry, exc), field="tls_verify",
                                     hint="if the registry speaks plain HTTP, set tls_verify: false")
                if scheme == "https" and "http" in schemes:
                    continue
                raise last from exc
            except RegistryError as exc:
                last = exc
                if scheme == "https" and "http" in schemes:
                    continue
                raise
            if status == 401:
                self._negotiate(headers, False)
            elif status != 200:
                raise RegistryError("registry %s: GET /v2/ answered %s" % (self.registry, _error_text(status, data)),
                                    field="image", hint="is this an OCI distribution registry?")
            return scheme
        raise last

    def get_manifest(self, reference):
        """(digest, bytes, media_type) of a manifest, or None when the reference does not exist."""
        status, headers, data = self.request("GET", "/v2/%s/manifests/%s" % (self.repository, reference), {"Accept": MANIFEST_ACCEPT})
        if status == 404:
            return None
        self._check(status, data, (200,), "reading manifest %s" % reference)
        return headers.get("docker-content-digest") or sha256_digest(data), data, headers.get("content-type", "")

    def blob_exists(self, digest, size=None):
        status, headers, data = self.request("HEAD", "/v2/%s/blobs/%s" % (self.repository, digest))
        if status == 404:
            return False
        self._check(status, data, (200,), "checking blob %s" % digest)
        length = headers.get("content-length")
        return size is None or length is None or int(length) == size

    def open_blob(self, digest):
        """``GET`` a blob as a stream on a connection of its own: returns a ``read(n)``/``close()`` object.

        Follows redirects to blob storage (without the registry's credentials), answers a 401 challenge once,
        retries transient failures before the body starts. The caller checks the digest while it reads.
        """
        url = self._url("/v2/%s/blobs/%s" % (self.repository, digest))
        what = "reading blob %s" % digest
        negotiated = False
        for _hop in range(6):
            parts = urllib.parse.urlsplit(url)
            sent = self._auth_header() if parts.netloc == self.registry else {}
            status, headers, body = self._retrying(functools.partial(self._open_blob_once, parts, sent), what)
            if status == 200:
                return body
            if status in (301, 302, 303, 307, 308) and headers.get("location"):
                url = urllib.parse.urljoin(url, headers["location"])
                continue
            if status == 401 and parts.netloc == self.registry and not negotiated and self._negotiate(headers, bool(sent)):
                negotiated = True
                continue
            self._check(status, body, (200,), what)
        raise RegistryError("registry %s: %s: too many redirects" % (self.registry, what), hint="see the registry's log")

    def _open_blob_once(self, parts, sent):
        """One streaming GET: (status, headers, _BlobBody) on 200, else (status, headers, the start of the body)."""
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(parts.netloc, timeout=self.timeout, context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(parts.netloc, timeout=self.timeout)
        hdrs = {"User-Agent": USER_AGENT}
        hdrs.update(sent)
        self.requests += 1
        try:
            conn.request("GET", parts.path + ("?" + parts.query if parts.query else ""), headers=hdrs)
            resp = conn.getresponse()
        except ssl.SSLError:
            conn.close()
            raise
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise _Retryable("GET %s: %s" % (parts.netloc, exc)) from exc
        headers = dict((k.lower(), v) for k, v in resp.getheaders())
        if resp.status != 200:
            data = resp.read(64 << 10)
            conn.close()
            return resp.status, headers, data
        return resp.status, headers, _BlobBody(conn, resp)

    def _location(self, headers, what):
        loc = headers.get("location")
        if not loc:
            raise RegistryError("registry %s: %s returned no Location" % (self.registry, what), hint="see the registry's log")
        return urllib.parse.urljoin(self._url("/v2/"), loc)

    def upload_blob(self, source, progress=None):
        """Stream ``source`` into a new blob; returns its digest (checked against ``source.digest`` if known)."""
        delay = self.backoff
        for attempt in range(self.retries + 1):
            sent = [0]
            hasher = hashlib.sha256()

            def body():
                for chunk in source.chunks():
                    hasher.update(chunk)
                    sent[0] += len(chunk)
                    if progress:
                        progress.add(len(chunk))
                    yield chunk

            try:
                status, headers, data = self.request("POST", "/v2/%s/blobs/uploads/" % self.repository, what="starting an upload")
                self._check(status, data, (202,), "starting an upload")
                loc = self._location(headers, "starting an upload")
                hdrs = {"Content-Type": "application/octet-stream", "Content-Length": str(source.size)}
                hdrs.update(self._auth_header())
                status, headers, data = self._raw("PATCH", loc, hdrs, body)
                if status in RETRY_STATUS or status == 401:
                    raise _Retryable(_error_text(status, data))
                self._check(status, data, (202, 204), "uploading %s" % source.title())
                if sent[0] != source.size:
                    source._check_size(sent[0])  # pylint: disable=protected-access
                digest = "sha256:" + hasher.hexdigest()
                if source.digest and source.digest != digest:
                    raise SpecDecodingError("%s: content hashes to %s, expected %s" % (source.title(), digest, source.digest),
                                            hint="the file changed while it was read; rerun when the model directory is stable")
                loc = self._location(headers, "uploading %s" % source.title())
                put = loc + ("&" if "?" in loc else "?") + "digest=" + urllib.parse.quote(digest)
                status, headers, data = self.request("PUT", put, what="committing %s" % source.title())
                self._check(status, data, (201, 204), "committing %s" % source.title())
                source.digest = digest
                return digest
            except _Retryable as exc:
                if progress:
                    progress.add(-sent[0])
                if attempt >= self.retries:
                    raise RegistryError("uploading %s to %s failed after %d attempts: %s" % (source.title(), self.registry, attempt + 1, exc),
                                        field="image", hint="check the registry's disk space and log, then rerun (finished blobs are kept)") from exc
                time.sleep(min(delay, 30))
                delay *= 2
        raise RegistryError("unreachable")  # pragma: no cover

    def put_manifest(self, reference, data, media_type):
        status, headers, body = self.request("PUT", "/v2/%s/manifests/%s" % (self.repository, reference),
                                             {"Content-Type": media_type}, data, what="writing the manifest")
        self._check(status, body, (201, 200), "writing the manifest %s" % reference)
        return headers.get("docker-content-digest") or sha256_digest(data)


def open_client(ref, username=None, password=None, auth_file=None, hide=None, **kwargs):
    """A RegistryClient for ``ref`` with the credentials given, or those `auth_file` holds for its registry.

    ``hide(password)`` is called with the password in use (also one read from the file) so the module keeps it out of
    every output (AnsibleModule.no_log_values.add); `kwargs` go to RegistryClient (tls_verify, ca_file, timeout, retries).
    """
    if auth_file:
        username, password = read_auth_file(auth_file, ref.registry)
    if password and hide is not None:
        hide(password)
    return RegistryClient(ref, username, password, **kwargs)


__all__ = ["ImageRef", "Progress", "RegistryAuthError", "RegistryClient", "RegistryError", "read_auth_file"]
