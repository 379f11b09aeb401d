# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stager's constants, its errors and the small helpers every part uses (JSON files, fsync, the public-hub rule)."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse

# Relative, so the same import works in the collection and inside the stager's zip application (see bundle.py).
from ...errors import SpecDecodingError, ValidationError

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
