# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Verified, resumable copy of model artifacts into a directory (a PVC subdirectory).

Plain Python, standard library only: the stage_pvc role ships this very file in a ConfigMap and runs it
with the vLLM runtime image's python3, so it must work as a single script (``python3 artifact_sync.py
--source ... --dest ...``) as well as an importable module_utils file.

What a run guarantees
- Every file is copied to ``<dest>/.spec-decoding-tmp/<path>.part``, hashed (sha256) while it is copied
  (one read into a private 256 KiB buffer, the hash of that buffer, the write of that same buffer: the
  bytes written are the bytes hashed), fsynced, journaled and renamed into place. Several files are
  copied at once (``--workers``); the fsyncs run on a flusher thread so the disk writes while the CPUs
  hash; memory stays bounded (a few buffers per worker, no memory maps of the files). Local files that
  are not in the page cache are read with O_DIRECT into those buffers (``--no-direct-io`` turns it off).
- ``<dest>/.spec-decoding-manifest.json`` (per-file size and sha256) is written last, after every file
  and directory is durable, and is removed first when a run is about to change anything: a directory
  with a manifest is always complete.
- A journal (``.spec-decoding-journal.json``) records finished files, so a rerun after a kill copies
  only what is missing; a partial file is resumed where it stopped (same node: everything written;
  after a reboot: up to the last fdatasync checkpoint).
- Files already present are skipped by a cheap size+mtime check against the manifest or journal, then
  re-hashed by the verify pass (``--verify auto``); a mismatch is recopied. ``--verify full`` re-hashes
  freshly copied files too, ``--verify quick`` trusts size+mtime.
- A directory holding another model (manifest ``name`` differs) or files this tool did not write is
  refused without ``--force``.

Sources: a local directory (``/path`` or ``file:///path``), an HTTP(S) mirror (``https://host/dir/``;
file list from the mirror's ``.spec-decoding-manifest.json``, a JSON ``--index-url``, or an HTML
directory listing), a Hugging Face compatible mirror (``hf://<repo>[@<revision>]`` with
``HF_ENDPOINT``), and S3-compatible buckets readable anonymously (``s3://bucket/prefix`` with
``--s3-endpoint``). ``--air-gapped`` refuses every public hub host, redirects included.

The last line on stdout is one JSON object ``{"spec_decoding_sync": {...}}`` summarising the run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import errno
import fnmatch
import functools
import hashlib
import html.parser
import io
import json
import mmap
import os
import posixpath
import queue
import shutil
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET

try:
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
except ImportError:  # running as a standalone script inside the stager Job

    class SpecDecodingError(Exception):  # type: ignore[no-redef]
        """Base class: invalid input or a failed operation, with a user-facing message."""

        def __init__(self, message, field=None, hint=None):
            self.field = field
            self.hint = hint
            text = message
            if field and not message.startswith(field):
                text = "%s: %s" % (field, message)
            if hint:
                text = "%s. Fix: %s" % (text.rstrip("."), hint)
            super().__init__(text)
            self.message = text

    class ValidationError(SpecDecodingError):  # type: ignore[no-redef]
        """The input is wrong; nothing was written anywhere."""


__version__ = "1"

MANIFEST_NAME = ".spec-decoding-manifest.json"
JOURNAL_NAME = ".spec-decoding-journal.json"
TMP_DIR = ".spec-decoding-tmp"
INTERNAL_NAMES = (MANIFEST_NAME, JOURNAL_NAME, TMP_DIR)
MANIFEST_SCHEMA = "alauda.spec_decoding/artifact-manifest/v1"
RESULT_KEY = "spec_decoding_sync"
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
DEFAULT_BUFFER = 256 << 10  # fits the L2 cache: hashed, then written while still hot
DEFAULT_CHECKPOINT = 1 << 30
PIPELINE_DEPTH = 4
WRITEBACK_WINDOW = 64 << 20
# Direct reads (O_DIRECT) of local files that are not in the page cache: this many bytes per read, this many
# reads in flight per file, offsets and sizes in multiples of DIRECT_ALIGN (covers 512 and 4096 byte blocks).
# Files smaller than DIRECT_MIN_BYTES go through the page cache.
DIRECT_BUFFER = 2 << 20
DIRECT_DEPTH = 3
DIRECT_ALIGN = 4096
DIRECT_MIN_BYTES = 8 << 20
VERIFY_MODES = ("auto", "full", "quick")

# Hosts of public model hubs. An air-gapped run refuses them (and their subdomains), redirects included.
PUBLIC_HUB_HOSTS = (
    "huggingface.co",
    "hf.co",
    "hf-mirror.com",
    "xethub.hf.co",
    "modelscope.cn",
    "modelscope.ai",
    "ollama.com",
    "registry.ollama.ai",
    "kaggle.com",
)


class SyncError(SpecDecodingError):
    """A copy, download or verification failed; the message says which file and why."""


# --------------------------------------------------------------------------------------------------
# Small helpers


def is_public_hub(host):
    """True when ``host`` is a public model hub (or a subdomain of one)."""
    host = (host or "").lower().rstrip(".")
    return any(host == h or host.endswith("." + h) for h in PUBLIC_HUB_HOSTS)


def check_url_allowed(url, air_gapped, field="source"):
    """Raise ValidationError when an air-gapped run would reach a public hub."""
    if not air_gapped:
        return
    host = urllib.parse.urlsplit(url).hostname or ""
    if is_public_hub(host):
        raise ValidationError(
            "air-gapped mode refuses the public hub host %r (%s)" % (host, url),
            field=field,
            hint="point the source at an internal mirror (HF_ENDPOINT / --hf-endpoint, an http(s) or s3 mirror, "
            "or a directory), or allow network access in the inventory",
        )


def boot_id():
    """The kernel's boot id: page-cache contents survive a process kill but not a reboot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def normalize_relpath(path, field="source"):
    """Validate a file path relative to the model root (POSIX separators, no escapes)."""
    if not isinstance(path, str) or not path:
        raise ValidationError("empty file path in the source listing", field=field)
    rel = path.replace("\\", "/")
    if rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
        raise ValidationError("unsafe file path %r in the source listing" % path, field=field,
                              hint="file paths must be relative and must not contain '..'")
    if rel.split("/")[0] in INTERNAL_NAMES:
        return None
    return rel


def emit(stream, line):
    """Write one line and flush (progress to stderr, the summary to stdout)."""
    stream.write(line + "\n")
    stream.flush()


def human_bytes(num):
    """1536 -> '1.5 KiB'."""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return ("%d %s" % (value, unit)) if unit == "B" else ("%.1f %s" % (value, unit))
        value /= 1024
    return "%d B" % num  # pragma: no cover


def atomic_write_json(path, data, fsync=True):
    """Write JSON to ``path`` via a temp file, fsync and rename."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path):
    """fsync a directory so renames inside it are durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def peak_rss_mib():
    """This process's peak resident memory in MiB (VmHWM; None where /proc is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_json(path):
    """Parsed JSON or None when missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def tree_digest(files):
    """One sha256 over the sorted (path, size, sha256) triples: the identity of a staged tree."""
    h = hashlib.sha256()
    for path in sorted(files):
        entry = files[path]
        h.update(("%s\0%d\0%s\n" % (path, entry["size"], entry.get("sha256") or "")).encode("utf-8"))
    return h.hexdigest()


def read_manifest(dest):
    """The manifest of ``dest`` (dict) or None when absent or not ours."""
    data = read_json(os.path.join(dest, MANIFEST_NAME))
    if isinstance(data, dict) and data.get("schema") == MANIFEST_SCHEMA and isinstance(data.get("files"), dict):
        return data
    return None


class SourceFile:
    """One file of a source listing."""

    __slots__ = ("path", "size", "sha256", "fingerprint", "url", "local")

    def __init__(self, path, size, sha256=None, fingerprint=None, url=None, local=None):
        self.path = path
        self.size = size
        self.sha256 = sha256.lower() if sha256 else None
        self.fingerprint = fingerprint or ("sha256:%s" % self.sha256 if self.sha256 else "size:%s" % size)
        self.url = url
        self.local = local

    def as_dict(self):
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


# --------------------------------------------------------------------------------------------------
# Sources


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


# --------------------------------------------------------------------------------------------------
# The engine


def _advise(fd, advice, offset=0, length=0):
    """posix_fadvise where the platform has it; advice is a name such as ``POSIX_FADV_SEQUENTIAL``."""
    try:
        os.posix_fadvise(fd, offset, length, getattr(os, advice))
    except (AttributeError, OSError):
        pass


@functools.lru_cache(maxsize=None)
def _libc():
    """ctypes and the C library with mmap, munmap and mincore typed (loaded once), or None (no ctypes, not
    Linux/glibc-like)."""
    try:
        import ctypes  # pylint: disable=import-outside-toplevel
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    except (ImportError, OSError, AttributeError):
        return None
    return ctypes, lib


def _mincore_resident(fd, offsets):
    """Whether the page of each offset of ``fd`` is in the page cache, from mincore(2) on a mapping of that page
    (neither the mapping nor mincore reads the file); None when it cannot be asked."""
    loaded = _libc()
    if loaded is None:
        return None
    ctypes, lib = loaded
    page = mmap.PAGESIZE
    failed = ctypes.c_void_p(-1).value
    vec = ctypes.create_string_buffer(1)
    for offset in offsets:
        base = offset - offset % page
        addr = lib.mmap(None, page, mmap.PROT_READ, mmap.MAP_SHARED, fd, base)
        if addr is None or addr == failed:
            return None
        try:
            if lib.mincore(addr, page, vec) != 0:
                return None
        finally:
            lib.munmap(addr, page)
        if not ord(vec.raw[:1]) & 1:
            return False
    return True


def _page_cached(fd, start, end):
    """Whether the bytes of ``fd`` from ``start`` to ``end`` look resident in the page cache.

    Looks at one page at the start, the middle and the end with mincore(2), which reads nothing. Where mincore
    cannot be called, probes one byte there with ``preadv(..., RWF_NOWAIT)``, which fails with EAGAIN instead
    of waiting for the device; but a buffered read that misses the cache starts readahead before it gives up,
    and on a fast disk that read can land before the kernel looks again, so a cold file can pass for a warm one
    (seen on a busy 2-core VM). True when neither can tell (no RWF_NOWAIT, or the file system refuses the flag):
    then the caller keeps reading through the page cache, as before.
    """
    if end <= start:
        return True
    offsets = (start, start + (end - start) // 2, end - 1)
    resident = _mincore_resident(fd, offsets)
    if resident is not None:
        return resident
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or not hasattr(os, "preadv"):
        return True
    probe = bytearray(1)
    for offset in offsets:
        try:
            os.preadv(fd, [probe], offset, flag)
        except BlockingIOError:
            return False
        except OSError:
            return True
    return True


def _read_ahead(readinto, size, depth, aligned=False):
    """Yield memoryviews filled by a reader thread, ``depth`` buffers of ``size`` bytes in flight at most.

    A view handed out is not refilled before the consumer asks for the next one. The reader stops (and is
    joined) when the generator is closed, also on errors; a reader error is raised in the consumer.
    ``aligned`` buffers are anonymous memory maps (page-aligned, as O_DIRECT reads need).
    """
    if aligned:
        views = [memoryview(mmap.mmap(-1, size)) for _slot in range(depth)]
    else:
        views = [memoryview(bytearray(size)) for _slot in range(depth)]
    free = queue.Queue()
    full = queue.Queue()
    stop = threading.Event()
    for i in range(depth):
        free.put(i)

    def reader():
        try:
            while True:
                i = free.get()
                if i is None or stop.is_set():
                    return
                num = readinto(views[i])
                full.put((i, num, None))
                if not num:
                    return
        except BaseException as exc:  # pylint: disable=broad-exception-caught
            full.put((None, 0, exc))

    thread = threading.Thread(target=reader, name="artifact-sync-reader", daemon=True)
    thread.start()
    try:
        while True:
            i, num, exc = full.get()
            if exc is not None:
                raise exc
            if not num:
                return
            chunk = views[i][:num]
            try:
                yield chunk
            finally:
                chunk.release()
            free.put(i)
    finally:
        stop.set()
        free.put(None)
        thread.join()


class _InlineExecutor:  # pylint: disable=too-few-public-methods
    """The flusher when no flusher thread runs (a copy_file call outside a run): each flush runs at once."""

    @staticmethod
    def submit(func, *args):
        future = concurrent.futures.Future()
        try:
            future.set_result(func(*args))
        except Exception as exc:  # pylint: disable=broad-exception-caught
            future.set_exception(exc)
        return future


_INLINE = _InlineExecutor()


class _Progress:
    """Thread-safe byte counter with a periodic stderr line."""

    def __init__(self, total, label, interval=5.0, stream=None):
        self.total = total
        self.label = label
        self.interval = interval
        self.stream = stream
        self.lock = threading.Lock()
        self.done = 0
        self.start = time.monotonic()
        self.last = self.start

    def add(self, num):
        with self.lock:
            self.done += num
            now = time.monotonic()
            if self.stream is not None and now - self.last >= self.interval:
                self.last = now
                rate = self.done / max(now - self.start, 1e-6)
                emit(self.stream, "%s: %s / %s (%.0f MiB/s)" % (self.label, human_bytes(self.done), human_bytes(self.total), rate / 1048576))


class Syncer:  # pylint: disable=too-many-instance-attributes
    """Copy one source listing into one destination directory."""

    def __init__(self, source, dest, name=None, include=None, exclude=None, force=False, verify="auto", workers=None,
                 buffer_size=DEFAULT_BUFFER, fsync=True, checkpoint_bytes=DEFAULT_CHECKPOINT, log=None, max_rate=0,
                 read_ahead=None, direct_io=True):
        if verify not in VERIFY_MODES:
            raise ValidationError("unknown verify mode %r" % verify, field="verify", hint="use one of %s" % ", ".join(VERIFY_MODES))
        self.source = source
        self.dest = os.path.abspath(dest)
        self.name = name or source.default_name()
        self.include = list(include or [])
        self.exclude = list(exclude or [])
        self.force = force
        self.verify = verify
        self.workers = max(1, int(workers or min(4, os.cpu_count() or 1)))
        self.buffer_size = max(64 * 1024, int(buffer_size))
        if read_ahead is None:
            # Local files: the kernel reads ahead asynchronously already, a thread would only add hand-offs.
            read_ahead = 0 if isinstance(source, LocalSource) else PIPELINE_DEPTH
        self.read_ahead = max(0, int(read_ahead))
        self.direct_io = bool(direct_io)
        self._flusher = None
        self.fsync = fsync
        self.checkpoint_bytes = max(self.buffer_size, int(checkpoint_bytes))
        self.log = log
        self.tmp_root = os.path.join(self.dest, TMP_DIR)
        self.manifest_path = os.path.join(self.dest, MANIFEST_NAME)
        self.journal_path = os.path.join(self.dest, JOURNAL_NAME)
        self.journal_lock = threading.Lock()
        self.journal = None
        self.journal_written = 0.0
        self.boot = boot_id()
        self.stats = {"copied_files": 0, "copied_bytes": 0, "resumed_bytes": 0, "skipped_files": 0, "verified_files": 0,
                      "verified_bytes": 0, "direct_read_bytes": 0}
        self.stats_lock = threading.Lock()
        self.recopied = []
        self.deleted = []
        self.progress = None
        self.max_rate = float(max_rate or 0)
        self.rate_lock = threading.Lock()
        self.rate_bytes = 0
        self.rate_start = None

    # -- logging ---------------------------------------------------------------------------------
    def _log(self, msg):
        if self.log is not None:
            emit(self.log, "[artifact-sync] %s" % msg)

    def _count(self, **kw):
        with self.stats_lock:
            for key, value in kw.items():
                self.stats[key] += value

    # -- planning --------------------------------------------------------------------------------
    def listing(self):
        files = select_files(self.source.list_files(), self.include, self.exclude)
        if not files:
            raise ValidationError("the source %s has no files to stage (after include/exclude filters)" % self.source.uri, field="source",
                                  hint="check the source path and the include/exclude patterns")
        return files

    def _dest_entries(self):
        """Relative paths of regular files under dest (internal names excluded)."""
        out = []
        if not os.path.isdir(self.dest):
            return out
        for dirpath, dirnames, filenames in os.walk(self.dest):
            rel_dir = os.path.relpath(dirpath, self.dest)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d not in INTERNAL_NAMES]
                filenames = [f for f in filenames if f not in INTERNAL_NAMES and not f.startswith(JOURNAL_NAME) and not f.startswith(MANIFEST_NAME)]
            for name in filenames:
                out.append(name if rel_dir == "." else "%s/%s" % (rel_dir.replace(os.sep, "/"), name))
        return sorted(out)

    def check_ownership(self, manifest, journal):
        """Refuse a directory that holds another model, or files we did not write, unless forced."""
        owner = None
        for doc in (journal, manifest):
            if doc and doc.get("name"):
                owner = doc["name"]
                break
        if owner is not None and owner != self.name and not self.force:
            raise ValidationError(
                "%s holds the model %r, not %r" % (self.dest, owner, self.name),
                field="dest",
                hint="stage into another subdirectory, or pass --force (stage_pvc_force: true) to replace it",
            )
        if owner is None and not self.force:
            foreign = self._dest_entries()
            if foreign:
                raise ValidationError(
                    "%s already holds %d file(s) this tool did not write (e.g. %s)" % (self.dest, len(foreign), foreign[0]),
                    field="dest",
                    hint="stage into an empty subdirectory, or pass --force (stage_pvc_force: true) to replace its content",
                )
        return owner

    def check_space(self, needed):
        """Fail early when the file system cannot hold what is still to be copied."""
        try:
            st = os.statvfs(self.dest)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if needed > free:
            raise ValidationError(
                "%s needs %s more but only %s is free" % (self.dest, human_bytes(needed), human_bytes(free)),
                field="dest",
                hint="use a larger volume (stage_pvc_size / stage_pvc_headroom_percent) or free space",
            )

    # -- journal ---------------------------------------------------------------------------------
    def _write_journal(self, force=False):
        with self.journal_lock:
            now = time.monotonic()
            if not force and now - self.journal_written < 1.0:
                return
            atomic_write_json(self.journal_path, self.journal, fsync=self.fsync)
            self.journal_written = now

    def _record(self, entry, sha, st):
        with self.journal_lock:
            self.journal["files"][entry.path] = {"size": st.st_size, "sha256": sha, "mtime_ns": st.st_mtime_ns, "source": entry.fingerprint}
        # Every finished file is journaled at once (a few hundred microseconds), so a kill right after it never
        # makes the rerun copy it again.
        self._write_journal(force=True)

    # -- copy ------------------------------------------------------------------------------------
    def _tmp_paths(self, rel):
        tmp = os.path.join(self.tmp_root, rel.replace("/", os.sep) + ".part")
        return tmp, tmp + ".ckpt"

    def _resume_offset(self, entry, tmp, ckpt):
        """How many bytes of a previous partial copy can be trusted."""
        state = read_json(ckpt)
        if not isinstance(state, dict) or state.get("source") != entry.fingerprint:
            return 0
        try:
            size = os.stat(tmp).st_size
        except OSError:
            return 0
        trusted = size if (state.get("boot_id") and state.get("boot_id") == self.boot) else int(state.get("synced", 0))
        trusted = min(trusted, size)
        if entry.size is not None:
            trusted = min(trusted, entry.size)
        return max(0, trusted)

    def _hash_prefix(self, tmp, offset, hasher):
        """Feed the first ``offset`` bytes of a partial file to ``hasher`` as they are on disk now, so the final
        hash covers exactly the bytes the file holds; False when the file is shorter than that."""
        view = memoryview(bytearray(self.buffer_size))
        left = offset
        with open(tmp, "rb", buffering=0) as prefix:
            while left:
                num = prefix.readinto(view[: min(len(view), left)])
                if not num:
                    return False
                hasher.update(view[:num])
                left -= num
        return True

    @classmethod
    def _open_part(cls, tmp, offset):
        """The partial file, positioned at ``offset`` and holding exactly that many bytes.

        Starting over means a new file, never a truncation to zero: ext4 (auto_da_alloc) flushes a file that
        was truncated to zero when it is closed, synchronously in close(), which cost a third of a second per
        shard and left the disk idle meanwhile.
        """
        if not offset:
            cls._discard(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != offset:
                os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def copy_file(self, entry, attempt=0):
        """Copy one file (resuming a partial copy); return its manifest entry, or a Future of it with fsync.

        Durability never blocks the copying thread: with fsync, the writeback kicks, the fdatasync
        checkpoints and the final fsync + journal + rename of each file run in order on one flusher
        thread (``self._flusher``) through a duplicate of the file descriptor, while this thread goes on
        reading, hashing and writing. The manifest is written only after every flush has finished.
        """
        tmp, ckpt = self._tmp_paths(entry.path)
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        offset = self._resume_offset(entry, tmp, ckpt) if attempt == 0 else 0
        hasher = hashlib.sha256()
        if offset and not self._hash_prefix(tmp, offset, hasher):
            offset, hasher = 0, hashlib.sha256()
        src, offset_ok = self.source.open(entry, offset)
        if offset_ok != offset:
            offset, hasher = 0, hashlib.sha256()
        try:
            fd = self._open_part(tmp, offset)
        except BaseException:
            src.close()
            raise
        flusher = (self._flusher or _INLINE) if self.fsync else None
        sync_fd = os.dup(fd) if flusher is not None else -1
        try:
            if offset:
                self._count(resumed_bytes=offset)
                self._log("resuming %s at %s" % (entry.path, human_bytes(offset)))
            atomic_write_json(ckpt, {"source": entry.fingerprint, "boot_id": self.boot, "synced": offset}, fsync=False)
            # No posix_fallocate: it would extend the file size, which is what resume trusts on the same boot.
            written = offset
            next_ckpt = offset + self.checkpoint_bytes
            flushed = offset
            with src:
                chunks = self._chunks(src)
                try:
                    for chunk in chunks:
                        # Hash, then write the very same private buffer: the bytes written are the bytes hashed.
                        hasher.update(chunk)
                        n = len(chunk)
                        try:
                            w = os.write(fd, chunk)
                            while w < n:
                                w += os.write(fd, chunk[w:])
                        except OSError as exc:
                            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                                raise SyncError("no space left while writing %s (%s)" % (entry.path, human_bytes(entry.size or written)),
                                                field="dest", hint="use a larger volume (stage_pvc_size / stage_pvc_headroom_percent)") from exc
                            raise
                        written += n
                        if self.progress is not None:
                            self.progress.add(n)
                        if self.max_rate:
                            self._throttle(n)
                        if flusher is not None and written - flushed >= WRITEBACK_WINDOW:
                            # Start writeback of what was just written (Linux: FADV_DONTNEED on dirty pages issues
                            # asynchronous writeback), so the disk is busy from the start and the final fsync is short.
                            flusher.submit(_advise, sync_fd, "POSIX_FADV_DONTNEED", flushed, written - flushed)
                            flushed = written
                        if flusher is not None and written >= next_ckpt:
                            flusher.submit(self._checkpoint, sync_fd, tmp, ckpt, entry, written)
                            next_ckpt = written + self.checkpoint_bytes
                finally:
                    chunks.close()  # joins a reader thread before the source is closed
            if os.fstat(fd).st_size != written:  # not expected (sequential writes from offset); never a truncation to zero
                os.ftruncate(fd, written)
            if entry.size is not None and written != entry.size:
                raise SyncError("%s: got %d bytes, expected %d" % (entry.path, written, entry.size), field="source",
                                hint="the source changed or the transfer was cut; rerun to resume")
            sha = hasher.hexdigest()
            if entry.sha256 and sha != entry.sha256:
                self._discard(tmp, ckpt)
                if attempt == 0:
                    self._log("%s: sha256 mismatch (%s != %s), copying it again" % (entry.path, sha, entry.sha256))
                    return self.copy_file(entry, attempt=1)
                raise SyncError("%s: sha256 %s does not match the source's %s" % (entry.path, sha, entry.sha256), field="source",
                                hint="the mirror serves different bytes than its index says; fix the mirror")
            done = (entry, sha, tmp, ckpt, written - offset)
            if flusher is not None:
                result = flusher.submit(self._finish, sync_fd, *done)
                sync_fd = -1  # _finish closes it
                return result
            return self._finish(-1, *done)
        finally:
            src.close()  # already closed when the copy got that far
            os.close(fd)
            if sync_fd >= 0:
                flusher.submit(os.close, sync_fd)  # after the flushes already queued for it

    def _checkpoint(self, sync_fd, tmp, ckpt, entry, written):
        """Flusher: make the first ``written`` bytes durable and record it, so a resume after a reboot trusts them."""
        try:
            os.fdatasync(sync_fd)
            if os.fstat(sync_fd).st_ino != os.stat(tmp).st_ino:
                return  # the partial file was discarded and started again meanwhile: this offset is not its own
        except OSError:
            return  # the final fsync reports the error
        atomic_write_json(ckpt, {"source": entry.fingerprint, "boot_id": self.boot, "synced": written}, fsync=False)

    def _finish(self, sync_fd, entry, sha, tmp, ckpt, copied):
        """fsync (when ``sync_fd`` is given), journal, move into place; return the manifest entry."""
        if sync_fd >= 0:
            try:
                os.fsync(sync_fd)
            finally:
                os.close(sync_fd)
        # Journal the file before it moves into place (a rename keeps size and mtime): a kill after the rename
        # can never leave a finished file the rerun does not know. A kill between the two leaves the complete
        # .part file, which the rerun resumes at its full length (nothing copied) and renames.
        st = os.stat(tmp)
        self._record(entry, sha, st)
        final = os.path.join(self.dest, entry.path.replace("/", os.sep))
        os.makedirs(os.path.dirname(final), exist_ok=True)
        if os.path.isdir(final) and not os.path.islink(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        self._discard(ckpt)
        self._count(copied_files=1, copied_bytes=copied)
        return {"size": st.st_size, "sha256": sha, "mtime_ns": st.st_mtime_ns, "source": entry.fingerprint}

    def _throttle(self, num):
        """Keep the total copy rate under ``max_rate`` bytes/s (shared by all workers)."""
        with self.rate_lock:
            now = time.monotonic()
            if self.rate_start is None:
                self.rate_start = now
            self.rate_bytes += num
            delay = self.rate_start + self.rate_bytes / self.max_rate - now
        if delay > 0:
            time.sleep(delay)

    def _chunks(self, src):
        """Yield memoryviews of the (already positioned) source, each valid until the next one is asked for.

        The bytes come in private buffers owned by this generator: the caller hashes a buffer and writes
        that same buffer, so what is hashed is exactly what is written (a source file changed meanwhile
        cannot make them differ, as it could with a memory map). With ``self.read_ahead`` a reader thread
        fills the next buffers (that many, so memory stays bounded) while the caller
        hashes and writes the current one: read(), hashlib's update() and write() release the GIL, so
        reading (disk or network) overlaps hashing and writing.
        """
        if isinstance(src, io.FileIO):
            direct = self._direct_chunks(src)
            if direct is not None:
                yield from direct
                return
            fd = src.fileno()

            def readinto(view):
                return os.readv(fd, [view])
        else:
            raw_readinto = getattr(src, "readinto", None)

            def readinto(view):
                if raw_readinto is not None:
                    return raw_readinto(view) or 0
                data = src.read(len(view))
                view[: len(data)] = data
                return len(data)

        size = self.buffer_size
        if self.read_ahead < 1:
            view = memoryview(bytearray(size))
            while True:
                num = readinto(view)
                if not num:
                    return
                yield view[:num]
        else:
            yield from _read_ahead(readinto, size, self.read_ahead)

    def _direct_chunks(self, src):
        """A generator of ``_chunks`` for a local file read with O_DIRECT, or None to read through the page cache.

        Staging reads each model byte once, usually from a volume that does not have it in memory (the "cold"
        case). Read through the page cache, every byte costs a page-cache fill and a copy into the buffer,
        which on a 2-core node is CPU that the hash needs. O_DIRECT reads land in the buffer straight from the
        device and leave the page cache to the destination's writeback. A reader thread keeps DIRECT_DEPTH
        reads of DIRECT_BUFFER bytes in flight, since there is no kernel readahead on this path; the consumer
        gets ``self.buffer_size`` slices, hashed and written while they are still in the CPU cache, and each
        slice is the very buffer that is written, as on the page-cache path.

        Used only when the file is big enough, the start offset is block-aligned (a resume at an odd offset
        reads through the page cache) and the file is not already resident (``_page_cached``: re-reading a
        warm file from the device would be slower). A file system that refuses O_DIRECT (tmpfs, some FUSE) at
        open or at the first read falls back to the page cache.
        """
        if not self.direct_io or not hasattr(os, "O_DIRECT") or not hasattr(os, "preadv"):
            return None
        fd = src.fileno()
        try:
            pos = os.lseek(fd, 0, os.SEEK_CUR)
            end = os.fstat(fd).st_size
        except OSError:
            return None
        if pos % DIRECT_ALIGN or end - pos < DIRECT_MIN_BYTES or _page_cached(fd, pos, end):
            return None
        try:
            # The same open file (not the same path name, which may have been replaced meanwhile).
            direct_fd = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_DIRECT)  # pylint: disable=no-member
        except OSError:
            return None
        return self._direct_gen(fd, direct_fd, pos)

    def _direct_gen(self, fd, direct_fd, pos):
        state = {"pos": pos, "direct": True}

        def readinto(view):
            if state["direct"]:
                try:
                    num = os.preadv(direct_fd, [view], state["pos"])
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    num = None  # the file system takes the flag at open but not the read: page cache from here
                state["direct"] = num == len(view)
                if num:
                    state["pos"] += num
                    self._count(direct_read_bytes=num)
                    return num
            # After a short direct read (the end of the file, its partial last block included) the page cache
            # confirms the end, or reads on should the file have grown meanwhile.
            num = os.preadv(fd, [view], state["pos"])
            state["pos"] += num
            return num

        step = self.buffer_size
        chunks = _read_ahead(readinto, DIRECT_BUFFER, DIRECT_DEPTH, aligned=True)
        try:
            for chunk in chunks:
                for start in range(0, len(chunk), step):
                    piece = chunk[start:start + step]
                    try:
                        yield piece
                    finally:
                        piece.release()
        finally:
            chunks.close()  # joins the reader before its descriptor is closed
            os.close(direct_fd)

    @staticmethod
    def _discard(*paths):
        for path in paths:
            try:
                os.unlink(path)
            except OSError:
                pass

    def _orphan_temp_files(self):
        """Temp files of journal/manifest writes by runs that were killed (``<name>.tmp.<pid>``, that pid gone)."""
        found = []
        try:
            names = os.listdir(self.dest)
        except OSError:
            return found
        for fname in names:
            base, sep, pid = fname.rpartition(".tmp.")
            if not sep or base not in (JOURNAL_NAME, MANIFEST_NAME) or not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
                continue  # a live process of that pid may be writing it
            except ProcessLookupError:
                found.append(os.path.join(self.dest, fname))
            except OSError:
                continue
        return found

    def hash_file(self, rel):
        """sha256 of a destination file."""
        hasher = hashlib.sha256()
        total = 0
        with open(os.path.join(self.dest, rel.replace("/", os.sep)), "rb", buffering=0) as fh:
            _advise(fh.fileno(), "POSIX_FADV_SEQUENTIAL")
            chunks = self._chunks(fh)
            try:
                for chunk in chunks:
                    hasher.update(chunk)
                    total += len(chunk)
            finally:
                chunks.close()
        self._count(verified_files=1, verified_bytes=total)
        return hasher.hexdigest()

    def _parallel(self, func, items):
        if not items:
            return []
        if self.workers == 1 or len(items) == 1:
            return [func(item) for item in items]
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(func, items))

    # -- the run ---------------------------------------------------------------------------------
    def run(self, files=None):  # pylint: disable=too-many-locals,too-many-branches,too-many-statements
        start = time.monotonic()
        files = files if files is not None else self.listing()
        by_path = {f.path: f for f in files}
        if len(by_path) != len(files):
            raise ValidationError("the source lists a file twice", field="source")
        if os.path.exists(self.dest) and not os.path.isdir(self.dest):
            raise ValidationError("%s exists and is not a directory" % self.dest, field="dest")
        os.makedirs(self.dest, exist_ok=True)
        manifest = read_manifest(self.dest)
        journal = read_json(self.journal_path)
        if not (isinstance(journal, dict) and isinstance(journal.get("files"), dict)):
            journal = None
        owner = self.check_ownership(manifest, journal)
        same_owner = owner == self.name
        known = {}
        if same_owner:
            if manifest:
                known.update(manifest["files"])
            if journal and journal.get("name") == self.name:
                known.update(journal["files"])

        keep, to_copy = {}, []
        for entry in files:
            rec = known.get(entry.path)
            path = os.path.join(self.dest, entry.path.replace("/", os.sep))
            try:
                st = os.stat(path)
            except OSError:
                st = None
            if (rec and st is not None and st.st_size == rec.get("size") == entry.size and st.st_mtime_ns == rec.get("mtime_ns")
                    and (rec.get("source") == entry.fingerprint or (entry.sha256 and entry.sha256 == rec.get("sha256")))):
                keep[entry.path] = dict(rec)
            else:
                to_copy.append(entry)
        stale = [p for p in self._dest_entries() if p not in by_path and (p in known or self.force or not same_owner)]
        needed = sum(e.size or 0 for e in to_copy)
        self.check_space(needed)
        changing = bool(to_copy or stale)
        self._log("%s: %d file(s), %s; %d to copy (%s), %d present, %d stale" % (
            self.dest, len(files), human_bytes(sum(f.size or 0 for f in files)), len(to_copy), human_bytes(needed), len(keep), len(stale)))

        self.journal = {"schema": MANIFEST_SCHEMA, "name": self.name, "source": self.source.uri, "files": dict(keep)}

        def invalidate():
            """Before touching data: record ownership in the journal, then drop the manifest (fsynced).

            In this order a kill at any point leaves either the old (still true) manifest or the journal, so the
            rerun always recognises the directory as its own (the other order left neither: "files this tool did
            not write")."""
            self._write_journal(force=True)
            if os.path.exists(self.manifest_path):
                os.unlink(self.manifest_path)
                if self.fsync:
                    fsync_dir(self.dest)

        if changing:
            invalidate()
            for rel in stale:
                path = os.path.join(self.dest, rel.replace("/", os.sep))
                try:
                    os.unlink(path)
                except IsADirectoryError:
                    shutil.rmtree(path)
                except FileNotFoundError:
                    pass
                self.deleted.append(rel)
            self._copy_all(to_copy, keep)

        # Verify: re-hash what was skipped (auto) or everything (full); recopy mismatches.
        if self.verify != "quick":
            fresh = {e.path for e in to_copy}
            check = [p for p in sorted(keep) if self.verify == "full" or p not in fresh]
            hashes = self._parallel(self.hash_file, check)
            bad = [p for p, h in zip(check, hashes) if h != keep[p].get("sha256") or (by_path[p].sha256 and h != by_path[p].sha256)]
            if bad:
                self._log("verify: %d file(s) differ from the manifest, copying them again: %s" % (len(bad), ", ".join(bad)))
                if not changing:
                    invalidate()
                    changing = True
                self.recopied.extend(bad)
                for p in bad:
                    keep.pop(p, None)
                    with self.journal_lock:
                        self.journal["files"].pop(p, None)
                self._copy_all([by_path[p] for p in bad], keep)
                if self.verify == "full":
                    again = self._parallel(self.hash_file, bad)
                    still = [p for p, h in zip(bad, again) if h != keep[p]["sha256"]]
                    if still:
                        raise SyncError("files still differ after recopying: %s" % ", ".join(still), field="dest",
                                        hint="the volume corrupts data; check the storage")
        self._count(skipped_files=len(files) - len(to_copy))

        # Final check: everything listed is present with the right size.
        for entry in files:
            rec = keep.get(entry.path)
            path = os.path.join(self.dest, entry.path.replace("/", os.sep))
            try:
                st = os.stat(path)
            except OSError as exc:
                raise SyncError("%s is missing after the copy" % entry.path, field="dest") from exc
            if rec is None or st.st_size != rec["size"] or (entry.size is not None and st.st_size != entry.size):
                raise SyncError("%s has the wrong size after the copy" % entry.path, field="dest")

        manifest_files = {p: {"size": keep[p]["size"], "sha256": keep[p]["sha256"], "mtime_ns": keep[p]["mtime_ns"],
                              "source": keep[p]["source"]} for p in sorted(keep)}
        digest = tree_digest(manifest_files)
        if changing or manifest is None or manifest.get("tree_sha256") != digest or manifest.get("files") != manifest_files:
            if self.fsync:
                dirs = {os.path.dirname(os.path.join(self.dest, p.replace("/", os.sep))) for p in keep}
                for d in sorted(dirs, key=len, reverse=True):
                    fsync_dir(d)
            doc = {
                "schema": MANIFEST_SCHEMA,
                "name": self.name,
                "source": self.source.uri,
                "tool_version": __version__,
                "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "total_bytes": sum(f["size"] for f in manifest_files.values()),
                "file_count": len(manifest_files),
                "tree_sha256": digest,
                "files": manifest_files,
            }
            atomic_write_json(self.manifest_path, doc, fsync=self.fsync)
            if self.fsync:
                fsync_dir(self.dest)
            changed_manifest = True
        else:
            changed_manifest = False
        self._discard(self.journal_path, *self._orphan_temp_files())
        if os.path.isdir(self.tmp_root):
            shutil.rmtree(self.tmp_root, ignore_errors=True)
        seconds = time.monotonic() - start
        return {
            "ok": True,
            "name": self.name,
            "source": self.source.uri,
            "dest": self.dest,
            "changed": bool(changing or changed_manifest),
            "files": len(files),
            "bytes": sum(f["size"] for f in manifest_files.values()),
            "tree_sha256": digest,
            "manifest": self.manifest_path,
            "recopied": sorted(set(self.recopied)),
            "deleted": sorted(self.deleted),
            "seconds": round(seconds, 3),
            "peak_rss_mib": peak_rss_mib(),
            "copy_mib_s": round(self.stats["copied_bytes"] / 1048576 / seconds, 1) if seconds > 0 else 0.0,
            **self.stats,
        }

    def _copy_all(self, entries, keep):
        if not entries:
            return
        entries = sorted(entries, key=lambda e: -(e.size or 0))
        self.progress = _Progress(sum(e.size or 0 for e in entries), "copy %s" % self.name, stream=self.log)
        self._flusher = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="artifact-sync-flush") if self.fsync else None
        try:
            results = self._parallel(self.copy_file, entries)
            results = [r.result() if isinstance(r, concurrent.futures.Future) else r for r in results]
        finally:
            if self._flusher is not None:
                self._flusher.shutdown(wait=True)  # every queued flush (and fd close) has run
                self._flusher = None
        for entry, rec in zip(entries, results):
            keep[entry.path] = rec
        self._write_journal(force=True)


def check_dest(dest, name=None, rehash=True, workers=None):
    """Verify a staged directory against its manifest: every file present, sizes and (optionally) hashes."""
    manifest = read_manifest(dest)
    if manifest is None:
        raise SyncError("%s has no complete manifest (%s): the staging did not finish" % (dest, MANIFEST_NAME), field="dest",
                        hint="run the stager again; it resumes where it stopped")
    if name and manifest.get("name") != name:
        raise SyncError("%s holds %r, expected %r" % (dest, manifest.get("name"), name), field="dest")
    files = manifest["files"]
    problems = []
    for rel, rec in sorted(files.items()):
        try:
            st = os.stat(os.path.join(dest, rel))
        except OSError:
            problems.append("%s missing" % rel)
            continue
        if st.st_size != rec.get("size"):
            problems.append("%s has %d bytes, manifest says %d" % (rel, st.st_size, rec.get("size")))
    if not problems and rehash:
        syncer = Syncer(LocalSource(dest), dest, workers=workers)
        rels = sorted(files)
        for rel, sha in zip(rels, syncer._parallel(syncer.hash_file, rels)):  # pylint: disable=protected-access
            if sha != files[rel].get("sha256"):
                problems.append("%s sha256 %s, manifest says %s" % (rel, sha, files[rel].get("sha256")))
    if problems:
        raise SyncError("%s does not match its manifest: %s" % (dest, "; ".join(problems[:10])), field="dest",
                        hint="run the stager again; it recopies what differs")
    return {"ok": True, "dest": os.path.abspath(dest), "name": manifest.get("name"), "files": len(files),
            "bytes": manifest.get("total_bytes"), "tree_sha256": manifest.get("tree_sha256"), "rehashed": bool(rehash)}


# --------------------------------------------------------------------------------------------------
# A tiny file server for the controller-directory source (the Job pulls from it)


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


# --------------------------------------------------------------------------------------------------
# CLI


def _truthy(value):
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="artifact_sync.py",
        description="Copy model files into a directory with a sha256 manifest written last; resumable and verified.")
    parser.add_argument("--source", help="directory, file://, http(s)://mirror/dir/, hf://<repo>[@rev] or s3://bucket/prefix")
    parser.add_argument("--dest", help="destination directory (e.g. /mnt/pvc/Meta-Llama-3.1-8B-Instruct)")
    parser.add_argument("--name", help="model identity recorded in the manifest (default: derived from the source)")
    parser.add_argument("--revision", help="hub revision for hf:// sources (default main)")
    parser.add_argument("--include", action="append", default=[], help="glob of files to copy (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], help="glob of files to skip (repeatable)")
    parser.add_argument("--config", help="JSON file with {'items': [{source, dest, name, ...}], ...} to stage several models")
    parser.add_argument("--air-gapped", action="store_true", default=_truthy(os.environ.get("SPEC_DECODING_AIR_GAPPED")),
                        help="refuse public hub hosts (default from SPEC_DECODING_AIR_GAPPED)")
    parser.add_argument("--hf-endpoint", help="Hugging Face mirror (default HF_ENDPOINT, else huggingface.co)")
    parser.add_argument("--s3-endpoint", help="S3-compatible endpoint for s3:// sources")
    parser.add_argument("--index-url", help="JSON file list for an http(s) mirror")
    parser.add_argument("--insecure", action="store_true", help="skip TLS verification of the mirror")
    parser.add_argument("--ca-bundle", help="CA bundle for the mirror's TLS certificate")
    parser.add_argument("--force", action="store_true", help="replace a different model or foreign files in dest")
    parser.add_argument("--verify", choices=VERIFY_MODES, default="auto",
                        help="auto: re-hash files skipped by the size+mtime check; full: re-hash everything; quick: trust size+mtime")
    parser.add_argument("--workers", type=int, default=None, help="files copied in parallel (default min(4, CPUs))")
    parser.add_argument("--buffer-size", type=int, default=DEFAULT_BUFFER, help="copy buffer in bytes")
    parser.add_argument("--read-ahead", type=int, default=None,
                        help="buffers a reader thread fills ahead of hashing and writing, per file (0: read in the copying thread; "
                        "default %d for network sources, 0 for local files, where the kernel's readahead already overlaps)" % PIPELINE_DEPTH)
    parser.add_argument("--no-direct-io", action="store_true",
                        help="read local files through the page cache even when they are not in it (default: O_DIRECT for those)")
    parser.add_argument("--checkpoint-bytes", type=int, default=DEFAULT_CHECKPOINT, help="fdatasync + resume checkpoint interval")
    parser.add_argument("--max-rate", type=float, default=0, help="cap the copy rate in MiB/s (0: no cap), e.g. to spare shared storage")
    parser.add_argument("--no-fsync", action="store_true", help="skip fsync (benchmarks only: a crash can lose data)")
    parser.add_argument("--plan", action="store_true", help="list the source (files, total size) and exit")
    parser.add_argument("--check", action="store_true", help="verify --dest (or each config item) against its manifest and exit")
    parser.add_argument("--no-rehash", action="store_true", help="with --check: sizes only")
    parser.add_argument("--serve", metavar="DIR", help="serve DIR over HTTP for a stager to pull (with --bind/--port)")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--idle-exit", type=float, default=0, help="with --serve: stop after this many idle seconds")
    parser.add_argument("--ready-file", help="with --serve: write the URL to this file once the port is bound")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def _items_from_args(args):
    if args.config:
        data = read_json(args.config)
        if not isinstance(data, dict) or not isinstance(data.get("items"), list) or not data["items"]:
            raise ValidationError("%s is not a JSON object with a non-empty 'items' list" % args.config, field="config")
        defaults = {k: v for k, v in data.items() if k != "items"}
        return [dict(defaults, **item) for item in data["items"]]
    if not args.dest or (not args.source and not args.check):
        raise ValidationError("--source and --dest are required (or --config)", field="source")
    return [{"source": args.source, "dest": args.dest, "name": args.name, "revision": args.revision, "include": args.include,
             "exclude": args.exclude}]


def run_item(item, args, log):
    """Stage one item (a dict with source, dest and optional settings); returns its summary."""
    air_gapped = bool(item.get("air_gapped", False)) or args.air_gapped
    source = make_source(
        item.get("source"), air_gapped=air_gapped, hf_endpoint=item.get("hf_endpoint") or args.hf_endpoint,
        revision=item.get("revision"), s3_endpoint=item.get("s3_endpoint") or args.s3_endpoint,
        index_url=item.get("index_url") or args.index_url, token=os.environ.get(item.get("token_env") or "HF_TOKEN"),
        insecure=bool(item.get("insecure")) or args.insecure, ca_bundle=item.get("ca_bundle") or args.ca_bundle)
    syncer = Syncer(source, item["dest"], name=item.get("name"), include=item.get("include"), exclude=item.get("exclude"),
                    force=bool(item.get("force")) or args.force, verify=item.get("verify") or args.verify,
                    workers=item.get("workers") or args.workers, buffer_size=args.buffer_size, fsync=not args.no_fsync,
                    checkpoint_bytes=args.checkpoint_bytes, log=log, max_rate=(item.get("max_rate_mib_s") or args.max_rate) * 1048576,
                    read_ahead=args.read_ahead, direct_io=not args.no_direct_io)
    if args.plan:
        files = syncer.listing()
        return {"ok": True, "name": syncer.name, "source": source.uri, "dest": syncer.dest, "files": len(files),
                "bytes": sum(f.size or 0 for f in files), "listing": [f.as_dict() for f in files]}
    return syncer.run()


def _failed_item(exc):
    """(exit code, result item) of an error that ends a CLI run: 2 for bad input, 1 for anything else."""
    if isinstance(exc, ValidationError):
        return 2, {"ok": False, "error": str(exc), "field": exc.field, "kind": "validation"}
    if isinstance(exc, SpecDecodingError):
        return 1, {"ok": False, "error": str(exc), "field": exc.field, "kind": "sync"}
    return 1, {"ok": False, "error": "%s: %s" % (getattr(exc, "filename", "") or "", exc.strerror or exc), "kind": "os"}


def main(argv=None):
    """CLI entry point; returns the exit code (0 ok, 2 bad input, 1 failure)."""
    args = build_parser().parse_args(argv)
    log = None if args.quiet else sys.stderr
    if args.serve:
        try:
            serve(args.serve, args.bind, args.port, idle_exit=args.idle_exit, ready_file=args.ready_file)
        except OSError as exc:
            emit(sys.stderr, "[artifact-sync] ERROR: cannot serve %s on %s:%d: %s" % (args.serve, args.bind, args.port, exc.strerror or exc))
            return 1
        return 0
    results = []
    code = 0
    try:
        items = _items_from_args(args)
        for item in items:
            if args.check:
                results.append(check_dest(item["dest"], name=item.get("name"), rehash=not args.no_rehash, workers=args.workers))
            else:
                results.append(run_item(item, args, log))
                if not args.plan:
                    # The layout check the role reads from this line: the manifest is complete and every file is there.
                    results[-1]["verified_layout"] = bool(check_dest(item["dest"], name=results[-1]["name"], rehash=False)["ok"])
                if log is not None and not args.plan:
                    r = results[-1]
                    emit(log, "[artifact-sync] %s: done, %d file(s) %s, copied %d (%s), skipped %d, verified %d, %.1f s" % (
                        r["dest"], r["files"], human_bytes(r["bytes"]), r.get("copied_files", 0), human_bytes(r.get("copied_bytes", 0)),
                        r.get("skipped_files", 0), r.get("verified_files", 0), r.get("seconds", 0)))
    except (SpecDecodingError, OSError) as exc:
        code, item = _failed_item(exc)
        results.append(item)
    if code and log is not None:
        emit(log, "[artifact-sync] ERROR: %s" % results[-1]["error"])
    summary = {"ok": code == 0, "mode": "check" if args.check else ("plan" if args.plan else "sync"), "items": results}
    root = (read_json(args.config) or {}).get("root") if args.config else None
    if root and os.path.isdir(root):
        summary["layout"] = sorted(n for n in os.listdir(root) if not n.startswith("."))
    emit(sys.stdout, json.dumps({RESULT_KEY: summary}, sort_keys=True))
    return code


# --------------------------------------------------------------------------------------------------
# Removing a staged subdirectory (the rollback role's draft-remover Job). Separate from the copy engine:
# the Job runs it with ``python3 -c "import runpy, sys; ..." artifact_sync.py --config plan.json`` (see
# REMOVE_LAUNCHER), so this file's CLI stays as it is.

REMOVE_LAUNCHER = "import runpy, sys; sys.exit(runpy.run_path(sys.argv[1])['remove_subdir_main'](sys.argv[2:]))"


def _remove_relpath(path, field):
    """A clean relative path below the root: no absolute path, no '..', '.', empty or internal names."""
    if not isinstance(path, str) or not path.strip("/").strip():
        raise ValidationError("is empty (that would be the whole volume)", field=field, hint="give the draft's subdirectory, e.g. draft")
    if path.startswith("/") or "\\" in path or "\0" in path:
        raise ValidationError("%r is not a relative path inside the volume" % path, field=field, hint="give a path such as draft")
    parts = path.rstrip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValidationError("%r leaves the volume or is not normalised ('..', '.', '//')" % path, field=field,
                              hint="give a plain path such as draft or models/draft")
    if any(p in INTERNAL_NAMES for p in parts):
        raise ValidationError("%r names the sync engine's own files" % path, field=field)
    return "/".join(parts)


def _drop_from_record(path, rel_prefix, fsync=True):
    """Drop the entries under ``rel_prefix`` from the manifest or journal at ``path``; True when it changed."""
    data = read_json(path)
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA or not isinstance(data.get("files"), dict):
        return False
    files = data["files"]
    keep = {p: e for p, e in files.items() if not (p == rel_prefix or p.startswith(rel_prefix + "/"))}
    if len(keep) == len(files):
        return False
    data["files"] = keep
    if os.path.basename(path) == MANIFEST_NAME:
        data["tree_sha256"] = tree_digest(keep)
        data["total_bytes"] = sum(int(e.get("size") or 0) for e in keep.values())
        data["file_count"] = len(keep)
    atomic_write_json(path, data, fsync=fsync)
    return True


def remove_staged(root, subdir, keep=(), name=None, fsync=True, log=None):
    """Remove ``root/subdir`` (a staged model directory) so that no manifest claims it any more.

    Order: the subdirectory's own manifest goes first (fsynced), then its journal and files; manifests and
    journals of enclosing directories (a tree staged as one item) lose the entries below it. Refuses paths
    outside ``root``, symlinked components, a directory holding (or equal to) one of ``keep`` (what the
    serving command still uses), and, with ``name``, a directory whose manifest names another model.
    Idempotent: an absent directory is reported with ``removed: false``.
    """
    rel = _remove_relpath(subdir, "subdir")
    root_real = os.path.realpath(root)
    if not os.path.isdir(root_real):
        raise ValidationError("%s is not a directory (is the volume mounted?)" % root, field="root")
    for kept in keep or ():
        kept_rel = _remove_relpath(kept, "keep")
        if kept_rel == rel or kept_rel.startswith(rel + "/"):
            raise ValidationError("%s holds %s, which the serving command still uses" % (rel, kept_rel), field="subdir",
                                  hint="remove only the draft's own directory")
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        if os.path.islink(os.path.join(root_real, *parts[:i])):
            raise ValidationError("%s is a symlink; refusing to follow it out of the draft's directory" % "/".join(parts[:i]),
                                  field="subdir", hint="remove the link by hand after checking where it points")
    dest = os.path.join(root_real, *parts)
    if not os.path.realpath(dest).startswith(root_real.rstrip(os.sep) + os.sep):
        raise ValidationError("%s resolves outside %s" % (rel, root), field="subdir")
    result = {"ok": True, "dest": dest, "subdir": rel, "removed": False, "files": 0, "bytes": 0, "records_updated": []}
    if os.path.lexists(dest) and not os.path.isdir(dest):
        raise ValidationError("%s is not a directory" % dest, field="subdir", hint="remove it by hand if it is the draft")
    if os.path.isdir(dest):
        manifest = read_manifest(dest)
        if name and manifest is not None and manifest.get("name") and manifest.get("name") != name:
            raise ValidationError("%s holds %r, not the draft %r" % (dest, manifest.get("name"), name), field="subdir",
                                  hint="check which model the directory holds before removing it")
        result["name"] = (manifest or {}).get("name")
        for dirpath, _dirs, filenames in os.walk(dest):
            for fname in filenames:
                if fname.startswith((MANIFEST_NAME, JOURNAL_NAME)) or TMP_DIR in dirpath:
                    continue
                try:
                    result["bytes"] += os.lstat(os.path.join(dirpath, fname)).st_size
                except OSError:
                    pass
                result["files"] += 1
        for internal in (MANIFEST_NAME, JOURNAL_NAME):
            path = os.path.join(dest, internal)
            if os.path.lexists(path):
                os.unlink(path)
                if fsync:
                    fsync_dir(dest)
        shutil.rmtree(dest)
        if fsync:
            fsync_dir(os.path.dirname(dest))
        result["removed"] = True
    for i in range(len(parts)):
        ancestor = os.path.join(root_real, *parts[:i]) if i else root_real
        prefix = "/".join(parts[i:])
        for record in (MANIFEST_NAME, JOURNAL_NAME):
            path = os.path.join(ancestor, record)
            if os.path.isfile(path) and _drop_from_record(path, prefix, fsync=fsync):
                result["records_updated"].append(path)
    if log is not None:
        emit(log, "[artifact-sync] %s: %s, %d file(s) %s; %d manifest/journal record(s) updated" % (
            dest, "removed" if result["removed"] else "already absent", result["files"], human_bytes(result["bytes"]),
            len(result["records_updated"])))
    return result


def remove_subdir_main(argv=None):
    """CLI of the remover: ``--config plan.json`` ({root, remove: [{subdir, name, keep}]}) or ``--root/--subdir``."""
    parser = argparse.ArgumentParser(prog="artifact_sync.py (remove)", description="Remove staged subdirectories of a volume.")
    parser.add_argument("--config", help="JSON file with {'root': DIR, 'remove': [{'subdir': ..., 'name': ..., 'keep': [...]}]}")
    parser.add_argument("--root", help="the volume's mount point")
    parser.add_argument("--subdir", action="append", default=[], help="subdirectory to remove (repeatable)")
    parser.add_argument("--keep", action="append", default=[], help="subdirectory that must survive (repeatable)")
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    log = None if args.quiet else sys.stderr
    results = []
    code = 0
    root = args.root
    try:
        if args.config:
            data = read_json(args.config)
            if not isinstance(data, dict) or not isinstance(data.get("remove"), list) or not data["remove"]:
                raise ValidationError("%s is not a JSON object with a non-empty 'remove' list" % args.config, field="config")
            root = data.get("root") or root
            todo = [dict(item) for item in data["remove"] if isinstance(item, dict)]
        else:
            todo = [{"subdir": s, "keep": args.keep} for s in args.subdir]
        if not root or not todo:
            raise ValidationError("--root and --subdir are required (or --config)", field="root")
        for item in todo:
            results.append(remove_staged(root, item.get("subdir"), keep=item.get("keep") or (), name=item.get("name"),
                                         fsync=not args.no_fsync, log=log))
    except (SpecDecodingError, OSError) as exc:
        code, item = _failed_item(exc)
        results.append(item)
    if code and log is not None:
        emit(log, "[artifact-sync] ERROR: %s" % results[-1]["error"])
    summary = {"ok": code == 0, "mode": "remove", "items": results}
    if root and os.path.isdir(root):
        summary["layout"] = sorted(n for n in os.listdir(root) if not n.startswith("."))
    emit(sys.stdout, json.dumps({RESULT_KEY: summary}, sort_keys=True))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
