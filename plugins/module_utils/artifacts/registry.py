# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small OCI distribution client (stdlib ``http.client``) and the Modelcar push logic.

- Talks only to the registry named in the image reference, plus the token realm that registry's own
  ``WWW-Authenticate`` challenge names (Harbor, Quay, Artifactory and distribution's ``auth: token``).
- Auth: anonymous, Basic, and Bearer tokens fetched from the challenge's realm with Basic credentials.
- Blobs: ``HEAD`` to skip what is present; uploads are ``POST`` + one streamed ``PATCH`` (the digest is
  computed while the bytes go out, so a file is read once) + ``PUT ?digest=``; never a whole blob in memory.
  Failed uploads are retried with exponential backoff (connection errors, 408/429/5xx).
- The manifest is ``PUT`` last, so a tag only ever names a manifest whose blobs all exist; a push that dies
  midway leaves the old tag untouched, and the rerun skips the blobs that made it.

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import base64
import concurrent.futures
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

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.modelcar_image import (
    ANN_TITLE, MT_DOCKER_MANIFEST, MT_MANIFEST, resolve_digests, sha256_digest,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.modelcar_image import DigestCache, build_plan, plan_from_layout, write_archive

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
        text = str(text)
        if self.password:
            text = text.replace(self.password, "********")
            text = text.replace(base64.b64encode(("%s:%s" % (self.username, self.password)).encode()).decode(), "********")
        return text

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


# --------------------------------------------------------------------------------------------------
# push orchestration
# --------------------------------------------------------------------------------------------------
def push_plan(plan, client, cache, jobs=3, progress_cb=None, check_mode=False, progress_interval=2.0):
    """Push ``plan`` (an ImagePlan or ArchivePlan) to ``client``'s repository and tag.

    Returns a dict: digest, changed, layers_pushed, layers_skipped, bytes_pushed, bytes_hashed, seconds.
    """
    t0 = time.monotonic()
    ref = client.ref
    client.ping()
    remote = client.get_manifest(ref.tag) if ref.tag else None
    remote_digests = set()
    remote_by_title = {}
    if remote is not None:
        try:
            rm = json.loads(remote[1])
            for d in rm.get("layers", []) + [rm.get("config") or {}]:
                remote_digests.add(d.get("digest"))
                title = (d.get("annotations") or {}).get(ANN_TITLE)
                if title:
                    remote_by_title[(title, d.get("size"))] = d.get("digest")
        except (ValueError, AttributeError):
            pass
    for layer in plan.layers:
        if not layer.digest:
            cache.lookup(layer)
    # Likely-unchanged files (same path and size as a layer of the current tag): hash locally, no upload needed.
    hash_first = [layer for layer in plan.layers if not layer.digest and (layer.title(), layer.size) in remote_by_title]
    if check_mode:
        hash_first = [layer for layer in plan.layers if not layer.digest]
    hashed_progress = Progress(sum(layer.size for layer in hash_first), None)
    resolve_digests(plan, cache, hashed_progress.add, only=hash_first)
    bytes_hashed = hashed_progress.done

    result = {"changed": False, "layers_pushed": 0, "layers_skipped": 0, "bytes_pushed": 0, "bytes_hashed": bytes_hashed,
              "remote_digest": remote[0] if remote else None}
    if all(layer.digest for layer in plan.layers):
        digest = plan.manifest_digest()
        if remote is not None and remote[0] == digest:
            result.update(digest=digest, layers_skipped=len(plan.layers), seconds=round(time.monotonic() - t0, 3))
            cache.save()
            return result

    # Which blobs must go up?
    todo = []
    seen = set()
    for layer in plan.layers:
        if layer.digest:
            if layer.digest in seen:
                continue
            seen.add(layer.digest)
            if layer.digest in remote_digests or client.blob_exists(layer.digest, layer.size):
                result["layers_skipped"] += 1
                continue
        todo.append(layer)
    total = sum(layer.size for layer in todo)
    progress = Progress(total, progress_cb, progress_interval)
    if check_mode:
        result.update(changed=True, layers_pushed=len(todo), bytes_pushed=total, digest=plan.manifest_digest(),
                      seconds=round(time.monotonic() - t0, 3))
        return result

    lock = threading.Lock()

    def push_one(layer):
        client.upload_blob(layer, progress)
        with lock:
            cache.store(layer)
            cache.save()
        return layer.size

    try:
        if todo:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as pool:
                futures = [pool.submit(push_one, layer) for layer in sorted(todo, key=lambda x: -x.size)]
                for fut in concurrent.futures.as_completed(futures):
                    result["bytes_pushed"] += fut.result()
                    result["layers_pushed"] += 1
        config = plan.config_source()
        if not (config.digest in remote_digests or client.blob_exists(config.digest, config.size)):
            client.upload_blob(config)
        data = plan.manifest_bytes()
        digest = sha256_digest(data)
        media_type = getattr(plan, "media_type", MT_MANIFEST)
        if remote is None or remote[0] != digest:
            got = client.put_manifest(ref.tag or digest, data, media_type)
            if got != digest:
                raise RegistryError("registry %s stored the manifest as %s, expected %s" % (client.registry, got, digest),
                                    hint="the registry rewrote the manifest; use a registry that stores OCI manifests as given")
            result["changed"] = True
        result["changed"] = result["changed"] or result["layers_pushed"] > 0
        result["digest"] = digest
    finally:
        cache.save()
        if progress.done:
            progress.finish()
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def format_progress(done, total, rate, final):
    mib = 1024.0 * 1024.0
    pct = (100.0 * done / total) if total else 100.0
    return "%s %.1f/%.1f MiB (%.0f%%) at %.1f MiB/s" % ("pushed" if final else "pushing", done / mib, total / mib, pct, rate / mib)


__all__ = ["ImageRef", "Progress", "RegistryAuthError", "RegistryClient", "RegistryError", "format_progress", "push_plan",
           "read_auth_file"]


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


# Module modelcar_image: the image of target and draft, as an OCI archive and/or pushed.

META_KEYS = (("model_name", "io.alauda.spec-decoding.model-name"), ("model_revision", "io.alauda.spec-decoding.model-revision"),
             ("draft_name", "io.alauda.spec-decoding.draft-name"))
MODELCAR_DEFAULTS = {"jobs": 3, "timeout": 120, "retries": 4}  # modelcar_image's defaults of these options


class _ProgressSink:
    def __init__(self, path):
        self.path = path
        self.lines = []

    def __call__(self, done, total, rate, final):
        line = "%s %s" % (time.strftime("%H:%M:%S"), format_progress(done, total, rate, final))
        self.lines.append(line)
        if len(self.lines) > 200:
            del self.lines[1:-100]
        if self.path:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

    def note(self, text):
        self.lines.append("%s %s" % (time.strftime("%H:%M:%S"), text))
        if self.path:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(self.lines[-1] + "\n")


def build_modelcar(p, check_mode=False, diff=False, warn=None, hide=None):
    """Module modelcar_image: build the Modelcar image of target (and draft) from directories (or an OCI archive), write
    it as an archive and/or push it; returns the module's result. `warn(text)` passes the plan's warnings on, `hide` as
    for open_client."""
    for key, low in (("jobs", 1), ("timeout", 1), ("retries", 0)):
        if p[key] < low:
            raise ValidationError("must be at least %d, got %d" % (low, p[key]), field=key, hint="use the default (%s)" % MODELCAR_DEFAULTS[key])
    if p["target_dir"] and not (p["image"] or p["archive"]):
        raise ValidationError("give image (registry/repository:tag) to push to, or archive to only write an OCI archive", field="image")
    if p["from_archive"] and not p["image"]:
        raise ValidationError("from_archive pushes an archive, so image (registry/repository:tag) is required", field="image")
    ref = ImageRef.parse(p["image"]) if p["image"] else None
    if ref is not None and ref.digest and not ref.tag:
        raise ValidationError("push to a tag (registry/repository:tag); the digest is returned", field="image")

    labels = dict((str(k), str(v)) for k, v in p["labels"].items())
    annotations = dict((str(k), str(v)) for k, v in p["annotations"].items())
    for opt, key in META_KEYS:
        if p[opt]:
            labels.setdefault(key, p[opt])
            annotations.setdefault(key, p[opt])

    sink = _ProgressSink(p["progress_log"])
    cache = DigestCache(p["cache_dir"])
    if p["from_archive"]:
        plan = plan_from_layout(p["from_archive"])
    else:
        plan = build_plan(p["target_dir"], p["draft_dir"], layout=p["layout"], base=p["base"], labels=labels, annotations=annotations,
                          max_layers=p["max_layers"], follow_external_symlinks=p["follow_external_symlinks"])
    result = dict(changed=False, image=str(ref) if ref else None, digest=None, storage_uri=None, layers_pushed=0, layers_skipped=0,
                  bytes_pushed=0, bytes_hashed=0, archive=None, archive_bytes_written=0, seconds=0.0, rate_mib_s=0.0)

    if p["archive"]:
        ref_name = ref.tag if ref and ref.tag else "latest"
        if check_mode:
            hashed = resolve_digests(plan, cache)
            result["bytes_hashed"] += sum(layer.size for layer in hashed)
            result["archive_bytes_written"] = 0
        else:
            sink.note("writing archive %s" % p["archive"])
            written = write_archive(plan, p["archive"], ref_name, cache)
            cache.save()
            result["archive_bytes_written"] = written
            result["changed"] = result["changed"] or written > 0
        result["archive"] = p["archive"]

    if ref is not None:
        client = open_client(ref, p["username"], p["password"], p["auth_file"], hide=hide, tls_verify=p["tls_verify"], ca_file=p["ca_file"],
                             timeout=p["timeout"], retries=p["retries"])
        try:
            pushed = push_plan(plan, client, cache, jobs=p["jobs"], progress_cb=sink, check_mode=check_mode)
        finally:
            client.close()
        for key in ("digest", "layers_pushed", "layers_skipped", "bytes_pushed", "seconds"):
            result[key] = pushed[key]
        result["bytes_hashed"] += pushed["bytes_hashed"]
        result["changed"] = result["changed"] or pushed["changed"]
        result["storage_uri"] = "oci://" + ref.with_digest(pushed["digest"])
        if pushed["seconds"] and pushed["bytes_pushed"]:
            result["rate_mib_s"] = round(pushed["bytes_pushed"] / pushed["seconds"] / 1048576.0, 1)
        if diff:
            result["diff"] = {"before": {"image": str(ref), "digest": pushed.get("remote_digest")},
                              "after": {"image": str(ref), "digest": pushed["digest"]}}
        verb = "would push" if check_mode else "pushed"
        sink.note("%s %s: %d layers pushed (%d bytes), %d present" % (verb, result["storage_uri"], pushed["layers_pushed"],
                                                                      pushed["bytes_pushed"], pushed["layers_skipped"]))
    else:
        result["digest"] = plan.manifest_digest()
    result["layers"] = [{"title": (layer.annotations or {}).get(ANN_TITLE, ""), "digest": layer.digest, "size": layer.size} for layer in plan.layers]
    result["progress"] = sink.lines
    for warning in plan.warnings:
        if warn is not None:
            warn(warning)
    return result
