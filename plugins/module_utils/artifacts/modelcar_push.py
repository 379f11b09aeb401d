# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Modelcar push: ``push_plan`` (which blobs the registry lacks, parallel uploads, the manifest last) and
``build_modelcar``, the modelcar_image module's work (an OCI archive and/or a push).

The manifest is ``PUT`` last, so a tag only ever names a manifest whose blobs all exist; a push that dies midway
leaves the old tag untouched, and the rerun skips the blobs that made it. Apart from registry.py, which is the
client these run on (auth, retries, blob sessions).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.modelcar_image import build_plan, plan_from_layout
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import (
    ANN_TITLE, MT_MANIFEST, DigestCache, resolve_digests, sha256_digest,
)
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_layout import write_archive
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.registry import ImageRef, Progress, RegistryError, open_client


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
