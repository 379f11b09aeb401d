# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where model files come from: a local directory, an HTTP(S) mirror, a Hugging Face compatible mirror, an S3 bucket.

Each source lists its files (``SourceFile``: path, size, sha256 when the source knows it) and opens one at an offset,
so a copy resumes where it stopped.
"""

from __future__ import annotations

import fnmatch
import html.parser
import json
import os
import posixpath
import ssl
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

from .common import (DEFAULT_HF_ENDPOINT, INTERNAL_NAMES, JOURNAL_NAME, MANIFEST_NAME, SourceFile, SyncError, ValidationError,
                     __version__, check_url_allowed, is_public_hub, normalize_relpath)


class LocalSource:
    """A directory readable by this process (the controller's disk or a volume mounted into the Job)."""

    kind = "local"

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.uri = "file://" + self.root

    def default_name(self):
        return os.path.basename(self.root.rstrip("/")) or "model"

    def list_files(self):
        if not os.path.isdir(self.root):
            raise ValidationError("source directory %s does not exist or is not a directory" % self.root, field="source",
                                  hint="give an existing directory holding the model files")
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            rel_dir = os.path.relpath(dirpath, self.root)
            if rel_dir == ".":
                # .git and the huggingface-cli download metadata (.cache/huggingface) are not model files.
                dirnames[:] = [d for d in dirnames if d not in INTERNAL_NAMES and d not in (".git", ".cache")]
            dirnames.sort()
            for name in sorted(filenames):
                rel = name if rel_dir == "." else "%s/%s" % (rel_dir.replace(os.sep, "/"), name)
                if rel_dir == "." and (name in INTERNAL_NAMES or name.startswith(JOURNAL_NAME)):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except OSError as exc:
                    raise ValidationError("cannot read %s: %s" % (full, exc.strerror), field="source") from exc
                out.append(SourceFile(rel, st.st_size, fingerprint="local:%d:%d" % (st.st_size, st.st_mtime_ns), local=full))
        return out

    def open(self, entry, offset):
        """(readable raw file, offset actually honoured)."""
        fh = open(entry.local, "rb", buffering=0)  # pylint: disable=consider-using-with
        if offset:
            fh.seek(offset)
        try:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        return fh, offset


class _GuardedRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects to public hubs in air-gapped mode."""

    def __init__(self, air_gapped):
        super().__init__()
        self.air_gapped = air_gapped

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # pylint: disable=too-many-arguments,too-many-positional-arguments
        check_url_allowed(newurl, self.air_gapped, field="source (redirect from %s)" % req.full_url)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class HttpClient:
    """urllib with air-gap guard, optional bearer token (never forwarded on redirects), TLS options."""

    def __init__(self, air_gapped=False, token=None, insecure=False, ca_bundle=None, timeout=60.0):
        self.air_gapped = air_gapped
        self.token = token
        self.timeout = timeout
        ctx = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()
        if insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self.opener = urllib.request.build_opener(_GuardedRedirect(air_gapped), urllib.request.HTTPSHandler(context=ctx))

    def request(self, url, method="GET", headers=None, auth=True):
        check_url_allowed(url, self.air_gapped)
        req = urllib.request.Request(url, method=method, headers=dict(headers or {}))
        req.add_header("User-Agent", "alauda-spec-decoding-artifact-sync/%s" % __version__)
        if auth and self.token:
            req.add_unredirected_header("Authorization", "Bearer %s" % self.token)
        return self.opener.open(req, timeout=self.timeout)

    def get_json(self, url, what):
        try:
            with self.request(url, headers={"Accept": "application/json"}) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            raise SyncError("%s: HTTP %d from %s" % (what, exc.code, url), field="source") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise SyncError("%s: cannot reach %s (%s)" % (what, url, getattr(exc, "reason", exc)), field="source",
                            hint="check the mirror address and that this pod/host can reach it") from exc
        except ValueError as exc:
            raise SyncError("%s: %s did not return JSON" % (what, url), field="source") from exc

    def open_range(self, url, offset, auth=True):
        """(response, offset honoured): asks for bytes from ``offset``; a server without ranges restarts at 0."""
        headers = {"Range": "bytes=%d-" % offset} if offset else {}
        try:
            resp = self.request(url, headers=headers, auth=auth)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and offset:
                return self.open_range(url, 0, auth=auth)
            raise SyncError("download failed: HTTP %d from %s" % (exc.code, url), field="source") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise SyncError("download failed: cannot reach %s (%s)" % (url, getattr(exc, "reason", exc)), field="source") from exc
        if offset and resp.status != 206:
            return resp, 0
        return resp, offset


def _files_from_index(data, base_url, what):
    """Parse a JSON index: our manifest ({"files": {path: {...}}}), {"files": [...]} or a list."""
    files = data.get("files") if isinstance(data, dict) else data
    items = []
    if isinstance(files, dict):
        items = [dict(v, path=k) if isinstance(v, dict) else {"path": k} for k, v in files.items()]
    elif isinstance(files, list):
        items = [f if isinstance(f, dict) else {"path": f} for f in files]
    else:
        raise SyncError("%s: index has no 'files' list or mapping" % what, field="source")
    out = []
    for item in items:
        rel = normalize_relpath(item.get("path") or item.get("name") or "")
        if rel is None:
            continue
        url = item.get("url") or urllib.parse.urljoin(base_url, urllib.parse.quote(rel))
        size = item.get("size")
        out.append(SourceFile(rel, int(size) if size is not None else None, sha256=item.get("sha256"), url=url,
                              fingerprint=item.get("fingerprint")))
    return out


class _LinkParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            for key, value in attrs:
                if key == "href" and value:
                    self.links.append(value)

    def error(self, message):  # pragma: no cover - py<3.10 abstract method
        pass


class HttpSource:
    """An HTTP(S) mirror directory: ``https://mirror/models/Llama-3.1-8B/``."""

    kind = "http"

    def __init__(self, url, client, index_url=None):
        self.base = url if url.endswith("/") else url + "/"
        self.uri = self.base
        self.client = client
        self.index_url = index_url
        check_url_allowed(self.base, client.air_gapped)

    def default_name(self):
        return posixpath.basename(urllib.parse.urlsplit(self.base).path.rstrip("/")) or "model"

    def list_files(self):
        if self.index_url:
            return self._fill_sizes(_files_from_index(self.client.get_json(self.index_url, "mirror index"), self.base, "mirror index"))
        try:
            with self.client.request(self.base + MANIFEST_NAME) as resp:
                data = json.loads(resp.read().decode("utf-8"))
            return self._fill_sizes(_files_from_index(data, self.base, "mirror manifest"))
        except urllib.error.HTTPError as exc:
            if exc.code not in (403, 404):
                raise SyncError("mirror manifest: HTTP %d from %s" % (exc.code, self.base + MANIFEST_NAME), field="source") from exc
        except ValueError:
            pass
        except (urllib.error.URLError, OSError) as exc:
            raise SyncError("cannot reach the mirror %s (%s)" % (self.base, getattr(exc, "reason", exc)), field="source",
                            hint="check the mirror address and that this pod/host can reach it") from exc
        return self._fill_sizes(self._crawl(self.base, ""))

    def _crawl(self, url, prefix, depth=0):
        """Walk an HTML directory listing (nginx autoindex, python -m http.server, Apache)."""
        if depth > 16:
            return []
        try:
            with self.client.request(url) as resp:
                body = resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            raise SyncError("mirror listing: HTTP %d from %s" % (exc.code, url), field="source",
                            hint="serve %s or a directory listing, or pass an index with --index-url" % MANIFEST_NAME) from exc
        parser = _LinkParser()
        parser.feed(body)
        out = []
        seen = set()
        for href in parser.links:
            split = urllib.parse.urlsplit(href)
            if split.scheme or split.netloc or split.query or href.startswith(("/", "#", "?", "..", "./")):
                continue
            name = urllib.parse.unquote(split.path)
            if not name or name in seen or name.rstrip("/") in INTERNAL_NAMES:
                continue
            seen.add(name)
            if name.endswith("/"):
                out.extend(self._crawl(urllib.parse.urljoin(url, split.path), prefix + name, depth + 1))
            else:
                rel = normalize_relpath(prefix + name)
                if rel:
                    out.append(SourceFile(rel, None, url=urllib.parse.urljoin(url, split.path)))
        if depth == 0 and not out:
            raise SyncError("mirror %s lists no files" % url, field="source",
                            hint="serve %s or a directory listing, or pass an index with --index-url" % MANIFEST_NAME)
        return out

    def _fill_sizes(self, files):
        out = []
        for entry in files:
            if entry.size is None or entry.fingerprint.startswith("size:"):
                try:
                    with self.client.request(entry.url, method="HEAD") as resp:
                        length = resp.headers.get("Content-Length")
                        tag = resp.headers.get("ETag") or resp.headers.get("Last-Modified") or ""
                except (urllib.error.URLError, OSError) as exc:
                    raise SyncError("cannot stat %s on the mirror (%s)" % (entry.url, getattr(exc, "reason", exc)), field="source") from exc
                size = entry.size if entry.size is not None else (int(length) if length is not None else None)
                if size is None:
                    raise SyncError("mirror gives no size for %s" % entry.url, field="source",
                                    hint="serve a JSON index with sizes (--index-url)")
                fp = ("sha256:%s" % entry.sha256) if entry.sha256 else "http:%d:%s" % (size, tag)
                entry = SourceFile(entry.path, size, sha256=entry.sha256, fingerprint=fp, url=entry.url)
            out.append(entry)
        return out

    def open(self, entry, offset):
        return self.client.open_range(entry.url, offset)


class HfSource:
    """A Hugging Face compatible hub or mirror: ``/api/models/<repo>/revision/<rev>`` + ``/<repo>/resolve/<rev>/<file>``."""

    kind = "hf"

    def __init__(self, repo, revision, endpoint, client):
        self.repo = repo.strip("/")
        self.revision = revision or "main"
        self.endpoint = (endpoint or DEFAULT_HF_ENDPOINT).rstrip("/")
        self.client = client
        self.commit = None
        self.uri = "hf://%s@%s" % (self.repo, self.revision)
        if self.repo.count("/") > 1 or not self.repo:
            raise ValidationError("invalid Hugging Face repo id %r" % repo, field="source", hint="use hf://<org>/<name>[@<revision>]")
        if client.air_gapped and is_public_hub(urllib.parse.urlsplit(self.endpoint).hostname):
            raise ValidationError(
                "air-gapped mode refuses the public hub %s for %s" % (self.endpoint, self.uri),
                field="source",
                hint="set HF_ENDPOINT (or --hf-endpoint) to the internal Hugging Face mirror, or stage from a directory or mirror",
            )
        check_url_allowed(self.endpoint, client.air_gapped)

    def default_name(self):
        return self.repo

    def list_files(self):
        url = "%s/api/models/%s/revision/%s?blobs=true" % (self.endpoint, self.repo, urllib.parse.quote(self.revision, safe=""))
        data = self.client.get_json(url, "hub model info")
        self.commit = data.get("sha") or None
        if self.commit:
            self.uri = "hf://%s@%s" % (self.repo, self.commit)
        out = []
        for sib in data.get("siblings") or []:
            rel = normalize_relpath(sib.get("rfilename") or "")
            if rel is None or rel == ".gitattributes":
                continue
            lfs = sib.get("lfs") or {}
            sha = lfs.get("sha256") or lfs.get("oid")
            size = lfs.get("size", sib.get("size"))
            file_url = "%s/%s/resolve/%s/%s" % (self.endpoint, self.repo, urllib.parse.quote(self.commit or self.revision, safe=""),
                                                urllib.parse.quote(rel))
            fp = ("sha256:%s" % sha) if sha else "hf:%s:%s:%s" % (self.commit or self.revision, sib.get("blobId") or "", size)
            out.append(SourceFile(rel, int(size) if size is not None else None, sha256=sha, fingerprint=fp, url=file_url))
        if not out:
            raise ValidationError("hub repo %s@%s lists no files" % (self.repo, self.revision), field="source")
        missing = [f for f in out if f.size is None]
        if missing:
            filled = HttpSource(self.endpoint + "/", self.client)._fill_sizes(missing)  # pylint: disable=protected-access
            by_path = {f.path: f for f in filled}
            out = [by_path.get(f.path, f) for f in out]
            for f in out:
                if not f.sha256:
                    f.fingerprint = "hf:%s:%s" % (self.commit or self.revision, f.size)
        return out

    def open(self, entry, offset):
        return self.client.open_range(entry.url, offset)


class S3Source:
    """An S3-compatible bucket readable anonymously (public-read or a gateway in front of it)."""

    kind = "s3"

    def __init__(self, url, endpoint, client):
        split = urllib.parse.urlsplit(url)
        self.bucket = split.netloc
        self.prefix = split.path.lstrip("/")
        if self.prefix and not self.prefix.endswith("/"):
            self.prefix += "/"
        if not endpoint:
            raise ValidationError("s3 sources need an endpoint", field="s3_endpoint",
                                  hint="pass --s3-endpoint https://s3.internal:9000 (or set AWS_ENDPOINT_URL)")
        self.endpoint = endpoint.rstrip("/")
        self.client = client
        self.uri = "s3://%s/%s" % (self.bucket, self.prefix)
        check_url_allowed(self.endpoint, client.air_gapped, field="s3_endpoint")

    def default_name(self):
        return posixpath.basename(self.prefix.rstrip("/")) or self.bucket

    def list_files(self):
        out = []
        token = None
        while True:
            query = {"list-type": "2", "prefix": self.prefix}
            if token:
                query["continuation-token"] = token
            url = "%s/%s?%s" % (self.endpoint, self.bucket, urllib.parse.urlencode(query))
            try:
                with self.client.request(url) as resp:
                    root = ET.fromstring(resp.read())
            except urllib.error.HTTPError as exc:
                raise SyncError("S3 listing: HTTP %d from %s" % (exc.code, url), field="source",
                                hint="the bucket must allow anonymous ListBucket/GetObject") from exc
            except (urllib.error.URLError, OSError) as exc:
                raise SyncError("cannot reach %s (%s)" % (url, getattr(exc, "reason", exc)), field="source") from exc
            ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
            for item in root.iter(ns + "Contents"):
                key = item.findtext(ns + "Key") or ""
                if key.endswith("/"):
                    continue
                rel = normalize_relpath(key[len(self.prefix):])
                if rel is None:
                    continue
                size = int(item.findtext(ns + "Size") or 0)
                etag = (item.findtext(ns + "ETag") or "").strip('"')
                out.append(SourceFile(rel, size, fingerprint="s3:%d:%s" % (size, etag),
                                      url="%s/%s/%s" % (self.endpoint, self.bucket, urllib.parse.quote(key))))
            if (root.findtext(ns + "IsTruncated") or "false").lower() == "true":
                token = root.findtext(ns + "NextContinuationToken")
                if token:
                    continue
            break
        if not out:
            raise ValidationError("S3 prefix %s holds no files" % self.uri, field="source")
        return out

    def open(self, entry, offset):
        return self.client.open_range(entry.url, offset)


def make_source(source, air_gapped=False, hf_endpoint=None, revision=None, s3_endpoint=None, index_url=None,
                token=None, insecure=False, ca_bundle=None):
    """Build a source object from a source string."""
    if not source or not isinstance(source, str):
        raise ValidationError("no source given", field="source", hint="pass a directory, http(s)://, hf:// or s3:// source")
    split = urllib.parse.urlsplit(source)
    scheme = split.scheme.lower()
    if scheme in ("", "file"):
        return LocalSource(split.path if scheme == "file" else source)
    client = HttpClient(air_gapped=air_gapped, token=token, insecure=insecure, ca_bundle=ca_bundle)
    if scheme in ("http", "https"):
        return HttpSource(source, client, index_url=index_url)
    if scheme == "hf":
        repo = (split.netloc + split.path).strip("/")
        rev = revision
        if "@" in repo:
            repo, rev = repo.split("@", 1)
        endpoint = hf_endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT
        return HfSource(repo, rev, endpoint, client)
    if scheme == "s3":
        return S3Source(source, s3_endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"), client)
    raise ValidationError("unsupported source scheme %r in %r" % (scheme, source), field="source",
                          hint="use a directory, file://, http(s)://, hf://<repo>[@rev] or s3://bucket/prefix")


def select_files(files, include=None, exclude=None):
    """Apply fnmatch include/exclude globs (matched against the relative path)."""
    out = []
    for entry in files:
        if include and not any(fnmatch.fnmatchcase(entry.path, pat) for pat in include):
            continue
        if exclude and any(fnmatch.fnmatchcase(entry.path, pat) for pat in exclude):
            continue
        out.append(entry)
    return out
