# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The small metadata of a checkpoint, read wherever the checkpoint lives, never its weights: ``config.json``,
``tokenizer_config.json``, and the names of the weight tensors (``model.safetensors.index.json``, else the header of
``model.safetensors``: its 8-byte little-endian length and the JSON after it, read with ranged GETs).

Sources: a local directory (option B's build input, a staged copy), an http(s) mirror directory, ``hf://<org>/<name>[@rev]``
(a Hugging Face compatible endpoint; refused when air-gapped, as every other hub read is: artifacts/air_gap.py), and a
Modelcar image in a registry (``oci://``: only the layers holding those files, found by the per-file layer titles
artifacts/modelcar_image.py writes; the safetensors layer is read only as far as its header), and an S3-compatible
store (``s3://bucket/prefix`` on an endpoint: path-style GETs of the same files, ranged for the header, unsigned, as the
PVC stager reads S3: artifact_sync/sources.py ``S3Source``). A PVC (``pvc://claim/path``) is read by a short Job
(artifacts/pvc_metadata.py plans it, ops/draft_preflight_pvc.py runs it), whose output ``read_checkpoint`` parses the same way.
vllm/draft_preflight.py checks what this returns.

Plain Python, stdlib only; no Ansible imports.
"""

from __future__ import annotations

import json
import os
import struct
import tarfile
import urllib.error
import urllib.parse

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import air_gap, s3_sign
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync.common import DEFAULT_HF_ENDPOINT
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync.sources import HttpClient
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import ANN_FILES, ANN_TITLE
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.registry import ImageRef, RegistryError, open_client

CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
INDEX = "model.safetensors.index.json"
SAFETENSORS = "model.safetensors"
MAX_SMALL_FILE = 8 << 20
MAX_HEADER = 100 << 20  # safetensors' own limit on the header (safetensors/src/tensor.rs MAX_HEADER_SIZE)
READABLE = ("local", "http", "hf", "oci", "s3", "pvc")  # pvc: through a Job (ops/draft_preflight_pvc.py), not reader_for
INDEX_MEDIA = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")


def location_kind(location):
    """local, http, hf, oci, pvc, s3 or other."""
    text = (location or "").strip()
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme in ("", "file"):
        return "local"
    if scheme in ("http", "https"):
        return "http"
    if scheme in ("hf", "pvc", "s3", "oci"):
        return scheme
    return "other"


class MetadataUnreadable(ValidationError):
    """The metadata could not be read (missing file, network, registry): the preflight could not run."""


class LocalReader:
    def __init__(self, path):
        self.root = path[len("file://"):] if path.startswith("file://") else path
        if not os.path.isdir(self.root):
            raise MetadataUnreadable("%s is not a directory" % self.root, field="source", hint="give the checkpoint's directory")

    def read(self, name, limit=MAX_SMALL_FILE):
        path = os.path.join(self.root, name)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as fh:
            return fh.read(limit)

    def read_range(self, name, start, length):
        path = os.path.join(self.root, name)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as fh:
            fh.seek(start)
            return fh.read(length)


class HttpReader:
    """A directory on an http(s) mirror, or a hub's ``resolve`` URLs: small GETs, ranged GETs for the safetensors header."""

    def __init__(self, base, client):
        self.base = base if base.endswith("/") else base + "/"
        self.client = client

    def _get(self, name, headers):
        url = self.base + urllib.parse.quote(name)
        try:
            return self.client.request(url, headers=headers)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise MetadataUnreadable("HTTP %d from %s" % (exc.code, url), field="source",
                                     hint="check the mirror's address and that it serves %s" % name) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise MetadataUnreadable("cannot reach %s (%s)" % (url, getattr(exc, "reason", exc)), field="source",
                                     hint="check the mirror's address and that this host can reach it") from exc

    def read(self, name, limit=MAX_SMALL_FILE):
        resp = self._get(name, {})
        if resp is None:
            return None
        with resp:
            return resp.read(limit)

    def read_range(self, name, start, length):
        resp = self._get(name, {"Range": "bytes=%d-%d" % (start, start + length - 1)})
        if resp is None:
            return None
        with resp:
            if resp.status == 206:
                return resp.read(length)
            # A server without ranges sends the whole file: read only what is needed and drop the connection.
            resp.read(start)
            return resp.read(length)


class S3Reader(HttpReader):
    """An ``s3://bucket/prefix`` directory on an S3-compatible endpoint: the same small and ranged GETs, path-style,
    signed with SigV4 (artifacts/s3_sign.py) when an access key is given, else anonymous as the stager reads S3."""

    def __init__(self, base, client, access_key_id=None, secret_access_key=None, region=None):
        super().__init__(base, client)
        self.keys = (access_key_id, secret_access_key) if access_key_id and secret_access_key else None
        self.region = region or "us-east-1"

    def _get(self, name, headers):
        if self.keys:
            headers = s3_sign.sign_get(self.base + urllib.parse.quote(name), self.keys[0], self.keys[1], self.region, headers)
        return super()._get(name, headers)


class ModelcarReader:
    """The files of one directory (``/models/<subdir>``) of a Modelcar image, layer by layer, as modelcar_image lays them out:
    one tar layer per file titled with its path (``org.opencontainers.image.title``), small files grouped in one layer
    listing them (``io.alauda.spec-decoding.files``). An image built elsewhere (one layer for everything) is scanned."""

    def __init__(self, client, reference, subdir):
        self.client = client
        self.prefix = "models/" + ("%s/" % subdir.strip("/") if subdir.strip("/") else "")
        found = client.get_manifest(reference)
        if found is None:
            raise MetadataUnreadable("the image %s:%s does not exist" % (client.repository, reference), field="source",
                                     hint="push the Modelcar image first or fix its reference")
        _digest, data, media_type = found
        manifest = json.loads(data.decode("utf-8"))
        if media_type in INDEX_MEDIA or manifest.get("manifests"):
            first = manifest["manifests"][0]["digest"]
            _digest, data, _mt = client.get_manifest(first)
            manifest = json.loads(data.decode("utf-8"))
        self.layers = manifest.get("layers") or []
        self.layers_read = 0

    def _layer_for(self, name):
        path = self.prefix + name
        for layer in self.layers:
            ann = layer.get("annotations") or {}
            if ann.get(ANN_TITLE) == path or path in [p.strip().strip("/") for p in (ann.get(ANN_FILES) or "").split(",")]:
                return [layer]
        titled = [layer for layer in self.layers if (layer.get("annotations") or {}).get(ANN_TITLE)]
        # Layers this collection titled that do not hold it: the file is not there. Untitled layers: look in each.
        return [] if titled and len(titled) == len(self.layers) else [layer for layer in self.layers if layer not in titled]

    def _member(self, name, reader):
        """Open the layers that may hold ``name`` and call ``reader(fileobj)`` on the member; None when absent."""
        path = self.prefix + name
        for layer in self._layer_for(name):
            blob = self.client.open_blob(layer["digest"])
            self.layers_read += 1
            try:
                with tarfile.open(fileobj=blob, mode="r|*") as tar:
                    for member in tar:
                        if member.name.lstrip("./").lstrip("/") == path and member.isfile():
                            return reader(tar.extractfile(member))
            except tarfile.TarError as exc:
                raise MetadataUnreadable("layer %s is not a tar archive (%s)" % (layer["digest"], exc), field="source") from exc
            finally:
                blob.close()
        return None

    def read(self, name, limit=MAX_SMALL_FILE):
        return self._member(name, lambda fh: fh.read(limit))

    def read_range(self, name, start, length):
        def part(fh):
            fh.read(start)
            return fh.read(length)
        return self._member(name, part)


def s3_endpoint_of(s3):
    """The endpoint URL of artifact_credentials' ``s3`` dict (KServe's annotations: ``endpoint`` host[:port], a scheme
    stripped; ``use_https``, default true as in KServe's storage initializer), or None."""
    s3 = dict(s3 or {})
    host = (s3.get("endpoint") or "").strip()
    if not host:
        return None
    host = host.split("://", 1)[-1].rstrip("/")
    return "%s://%s" % ("http" if s3.get("use_https") is False else "https", host)


def s3_base(location, endpoint, field="source"):
    """The path-style URL of the ``s3://bucket/prefix/`` directory on ``endpoint`` (KServe's storage initializer and the
    stager default to path-style addressing; artifact_sync/sources.py ``S3Source`` builds its URLs the same way)."""
    split = urllib.parse.urlsplit(location)
    if not split.netloc:
        raise ValidationError("%s names no bucket" % location, field=field, hint="write s3://<bucket>/<prefix>")
    if not endpoint:
        # KServe's storage initializer would fall back to AWS; the preflight does not guess: the check cannot run
        raise MetadataUnreadable("%s needs an S3 endpoint" % location, field="s3_endpoint",
                                 hint="set s3_endpoint (the deploy: stage_pvc_s3_endpoint), e.g. https://s3.internal:9000, or AWS_ENDPOINT_URL")
    prefix = split.path.strip("/")
    return "%s/%s/%s" % (endpoint.rstrip("/"), urllib.parse.quote(split.netloc), urllib.parse.quote(prefix + "/" if prefix else ""))


def reader_for(location, air_gapped=False, hf_endpoint=None, revision=None, subdir=None, registry=None, field="source", s3_endpoint=None,
               s3=None):
    """A reader of ``location``; ValidationError for what cannot be read (air gap, unsupported kind). ``s3``: the
    artifact_credentials role's S3 dict (keys, endpoint, use_https, region, verify_ssl)."""
    kind = location_kind(location)
    if air_gapped:
        air_gap.check_uri(location, field)
    registry = dict(registry or {})
    if kind == "local":
        return LocalReader(location)
    client = HttpClient(air_gapped=air_gapped, token=registry.get("token"), insecure=not registry.get("tls_verify", True),
                        ca_bundle=registry.get("ca_file"), timeout=registry.get("timeout", 60.0))
    if kind == "http":
        return HttpReader(location, client)
    if kind == "s3":
        s3 = dict(s3 or {})
        endpoint = s3_endpoint or s3_endpoint_of(s3) or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if air_gapped and endpoint:
            air_gap.check_uri(endpoint, "s3_endpoint")
        if s3.get("verify_ssl") is False:
            client = HttpClient(air_gapped=air_gapped, insecure=True, timeout=registry.get("timeout", 60.0))
        keys = (None, None) if s3.get("use_anonymous_credential") else (s3.get("access_key_id"), s3.get("secret_access_key"))
        return S3Reader(s3_base(location, endpoint, field), client, keys[0], keys[1], s3.get("region"))
    if kind == "hf":
        repo = location.split("://", 1)[1].strip("/")
        if "@" in repo:
            repo, revision = repo.split("@", 1)
        endpoint = (hf_endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
        if air_gapped:
            air_gap.check_uri(endpoint, field)
        return HttpReader("%s/%s/resolve/%s/" % (endpoint, repo, urllib.parse.quote(revision or "main", safe="")), client)
    if kind == "oci":
        try:
            ref = ImageRef.parse(location.split("://", 1)[1], field=field)
        except ValidationError as exc:  # the render refuses the reference with its own message; the check cannot run
            raise MetadataUnreadable("%s is no image reference: %s" % (location, plain(exc)), field=field, hint=exc.hint) from exc
        client = open_client(ref, username=registry.get("username"), password=registry.get("password"),
                             auth_file=registry.get("auth_file"), tls_verify=registry.get("tls_verify", True),
                             ca_file=registry.get("ca_file"), timeout=registry.get("timeout", 60.0), retries=1)
        try:
            client.ping()
            return ModelcarReader(client, ref.digest or ref.tag or "latest", "target" if subdir is None else subdir)
        except RegistryError as exc:
            raise MetadataUnreadable(plain(exc), field=field, hint=exc.hint) from exc
    raise ValidationError("%s sources are not read by the preflight%s" % (kind, " here (a PVC is read by a Job)" if kind == "pvc" else ""),
                          field=field, hint="give a local directory, an http(s) mirror, hf://, s3://, pvc:// or an oci:// Modelcar image, "
                          "or set preflight: off")


def plain(exc):
    """An error's text without its field prefix and its fix (the wrapper adds its own field and keeps the fix)."""
    text = exc.message
    if exc.field and text.startswith(exc.field + ": "):
        text = text[len(exc.field) + 2:]
    if exc.hint and text.endswith(". Fix: %s" % exc.hint):
        text = text[:-len(". Fix: %s" % exc.hint)]
    return text


def _json(data, where):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise MetadataUnreadable("%s is not JSON (%s)" % (where, exc), field="source", hint="check the checkpoint's files") from exc


def safetensors_header(reader, name=SAFETENSORS):
    """The JSON header of a safetensors file: 8 bytes of little-endian length, then the header (safetensors' format)."""
    head = reader.read_range(name, 0, 8)
    if head is None:
        return None
    if len(head) != 8:
        raise MetadataUnreadable("%s is shorter than a safetensors header" % name, field="source")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER:
        raise MetadataUnreadable("%s declares a %d-byte header, over safetensors' limit" % (name, length), field="source")
    return _json(reader.read_range(name, 8, length) or b"", name)


def read_checkpoint(reader, where, with_tensors=True):
    """``{"where", "config", "tokenizer", "tensors", "total_size", "files_read"}`` of one checkpoint."""
    files_read = []
    data = reader.read(CONFIG)
    if data is None:
        raise MetadataUnreadable("%s/%s does not exist" % (where.rstrip("/"), CONFIG), field="source",
                                 hint="point at the checkpoint's directory (the one holding config.json)")
    config = _json(data, CONFIG)
    files_read.append(CONFIG)
    tokenizer = None
    data = reader.read(TOKENIZER_CONFIG)
    if data is not None:
        tokenizer = _json(data, TOKENIZER_CONFIG)
        # chat templates make this file large; only the names are compared
        tokenizer = {key: tokenizer.get(key) for key in ("tokenizer_class", "bos_token", "eos_token", "model_max_length") if key in tokenizer}
        files_read.append(TOKENIZER_CONFIG)
    tensors, total_size = None, None
    try:
        tensors, total_size = _tensors(reader, files_read) if with_tensors else (None, None)
    except MetadataUnreadable:
        # The names serve one check (the d2t map), which then says it could not look; the rest runs on config.json.
        tensors, total_size = None, None
    return {"where": where, "config": config, "tokenizer": tokenizer, "tensors": tensors, "total_size": total_size,
            "files_read": files_read}


def _tensors(reader, files_read):
    """(tensor names, bytes of weights) from the index, else the single file's header; (None, None) when neither exists."""
    data = reader.read(INDEX)
    if data is not None:
        index = _json(data, INDEX)
        files_read.append(INDEX)
        return sorted((index.get("weight_map") or {}).keys()), (index.get("metadata") or {}).get("total_size")
    header = safetensors_header(reader)
    if header is None:
        return None, None
    files_read.append(SAFETENSORS + " (header)")
    ends = [end for item in header.values() if isinstance(item, dict) for end in item.get("data_offsets", [0])]
    return sorted(key for key in header if key != "__metadata__"), max(ends or [0])


def read_location(location, air_gapped=False, hf_endpoint=None, subdir=None, registry=None, field="source", with_tensors=True,
                  s3_endpoint=None, s3=None):
    """Read the metadata of the checkpoint at ``location`` (see reader_for); MetadataUnreadable when it cannot."""
    where = location if location_kind(location) != "oci" else "%s//models/%s" % (location, ("target" if subdir is None else subdir).strip("/"))
    try:
        reader = reader_for(location, air_gapped=air_gapped, hf_endpoint=hf_endpoint, subdir=subdir, registry=registry, field=field,
                            s3_endpoint=s3_endpoint, s3=s3)
        ckpt = read_checkpoint(reader, where, with_tensors=with_tensors)
    except (RegistryError, MetadataUnreadable) as exc:
        raise MetadataUnreadable("cannot read the metadata of %s: %s" % (location, plain(exc)), field=field, hint=exc.hint) from exc
    if isinstance(reader, ModelcarReader):
        ckpt["layers_read"] = reader.layers_read
    return ckpt


def sources_from_deploy(artifacts, modelcar_build=None, stage_items=None, stage=False):
    """Where the inference_service role's target and draft can be read before anything is written:
    ``{"target": location or None, "draft": ..., "target_subdir", "draft_subdir", "skipped": reason or None}``.

    Order: the Modelcar build's local directories (option B's input), the PVC stager's sources (option C's input), the
    storageUris (option A), the pushed Modelcar image, the PVC the render mounts at /mnt/models (``pvc://<pvc_name>/<subdir>``,
    the subdirectories as the render lays them out: kserve/isvc/render.py pvc mode)."""
    artifacts = dict(artifacts or {})
    build = dict(modelcar_build or {})
    out = {"target": None, "draft": None, "target_subdir": artifacts.get("target_subdir") or "target",
           "draft_subdir": artifacts.get("draft_subdir") or "draft", "skipped": None}
    if build.get("target_dir"):
        out.update(target=build.get("target_dir"), draft=build.get("draft_dir"))
    elif stage and stage_items:
        items = list(stage_items)
        out.update(target=items[0].get("source"), draft=items[1].get("source") if len(items) > 1 else None)
    elif artifacts.get("target_uri") or artifacts.get("storage_uri"):
        # option A: each oci:// entry is an image of its own, its files directly under /models
        out.update(target=artifacts.get("target_uri") or artifacts.get("storage_uri"), draft=artifacts.get("draft_uri"),
                   target_subdir="", draft_subdir="")
    elif artifacts.get("modelcar_image"):
        image = artifacts["modelcar_image"]
        image = image if "://" in image else "oci://" + image
        out.update(target=image, draft=image)
    elif artifacts.get("pvc_name"):
        pvc = artifacts["pvc_name"]
        out.update(target="pvc://%s/%s" % (pvc, out["target_subdir"]), draft="pvc://%s/%s" % (pvc, out["draft_subdir"]))
    else:
        out["skipped"] = "no target or draft location in the artifacts"
        return out
    unreadable = [v for v in (out["target"], out["draft"]) if v and location_kind(v) not in READABLE]
    if unreadable:
        out["skipped"] = "%s is a %s location, which the preflight does not read yet" % (unreadable[0], location_kind(unreadable[0]))
    return out
