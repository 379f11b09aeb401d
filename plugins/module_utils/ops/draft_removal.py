# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Remove a rolled-back InferenceService's draft artifacts (``rollback_remove_draft_artifacts: true``).

The guide keeps the draft mounted after a rollback, so a roll-forward needs no download. When asked to
remove it, ``execute`` finds where the draft lives (ops/draft_location.py) and removes it:

- ``storage_uris``: a ``spec.predictor.storageUris`` entry of its own -> drop the entry (a guarded JSON patch).
- ``pvc``: a subdirectory of the PVC behind ``storageUri: pvc://<claim>/<prefix>`` -> the rollback role runs a
  short Job (the stager's image and zip application, ``artifact_sync.pyz remove``) that removes the
  subdirectory and every manifest's claim on it; the PVC's ``spec-decoding.alauda.io/staged`` record loses it.
- ``modelcar``: ``/models/<rel>`` inside the ``oci://`` image -> the image without the draft's layers
  (ops/draft_removal_modelcar.py), pushed under ``<tag>-nodraft`` (manifest last), and ``storageUri`` moves to
  its digest.

``execute`` runs over its API calls: module draft_artifacts gives it ops/draft_removal_cluster.calls (functions over
the cluster service), tests their own. Plain Python, no Ansible imports.
"""

from __future__ import annotations

import hashlib
import json

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import bundle as stager_bundle
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import patch_plan as isvc_patch
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.llmisvc import status as llmisvc_status
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import pvc_plan as pvc_stage
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError, ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.gitops import owner as gitops_owner
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.oci_blobs import sha256_digest
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.draft_location import FIELD, draft_path_from, is_llmisvc, is_under, locate, other_users
from ansible_collections.alauda.spec_decoding.plugins.module_utils.ops.draft_removal_modelcar import RemoteImage, nodraft_tag, plan_image

PVC_JOB_ROOT = "/mnt/pvc"
SCRIPT_DIR = "/opt/spec-decoding"
STAGED_ANNOTATION = "spec-decoding.alauda.io/staged"
RESULT_KEY = "spec_decoding_sync"


# --------------------------------------------------------------------------------------------------
# PVC: the remover Job's plan, its log, the PVC record
# --------------------------------------------------------------------------------------------------
def staged_records(pvc):
    """The PVC's subdir -> {name, ...} staging record (written by the stage_pvc role)."""
    return pvc_stage.staged_annotation(pvc)


def pvc_job(location, pvc=None, script_sha256="", job_root=PVC_JOB_ROOT):
    """The remover's plan (JSON for its ConfigMap) and the Job / ConfigMap names (stable for the same plan)."""
    subdir = location.details["subdir"]
    record = staged_records(pvc).get(subdir) or {}
    item = {"subdir": subdir, "keep": location.details.get("keep") or []}
    if record.get("name"):
        item["name"] = record["name"]
    plan = {"root": job_root, "items": [], "remove": [item]}
    plan_json = json.dumps(plan, sort_keys=True, indent=1)
    digest = hashlib.sha256(plan_json.encode("utf-8") + json.dumps(record, sort_keys=True).encode("utf-8")
                            + (script_sha256 or "").encode("utf-8")).hexdigest()
    claim = location.details["pvc"]
    stem = claim[:40].rstrip("-.")
    return {"pvc": claim, "subdir": subdir, "keep": item["keep"], "plan": plan, "plan_json": plan_json, "plan_sha256": digest,
            "job": "%s-rmdraft-%s" % (stem, digest[:10]), "configmap": "%s-rmdraft" % stem, "staged_record": record or None,
            "command": ["python3", "%s/%s" % (SCRIPT_DIR, stager_bundle.NAME), "remove", "--config", "%s/plan.json" % SCRIPT_DIR]}


def parse_remover_log(text, subdir):
    """The remover's summary item for ``subdir`` from its last JSON line; raise when it failed or is missing."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip().startswith("{") and RESULT_KEY in ln]
    try:
        summary = json.loads(lines[-1])[RESULT_KEY] if lines else None
    except (ValueError, KeyError, TypeError):
        summary = None
    if not isinstance(summary, dict) or summary.get("mode") != "remove":
        raise ValidationError("the remover's log has no summary line", field="remover log",
                              hint="the Job did not run the remover to the end; read its pod log")
    if not summary.get("ok"):
        errors = [it.get("error") for it in summary.get("items") or [] if it.get("error")]
        raise ValidationError("the remover failed: %s" % "; ".join(errors or ["unknown error"]), field="remover log")
    for item in summary.get("items") or []:
        if item.get("subdir") == subdir:
            if subdir.split("/")[0] in (summary.get("layout") or []) and "/" not in subdir:
                raise ValidationError("the PVC root still lists %s after the removal" % subdir, field="remover log")
            return item
    raise ValidationError("the remover's summary lacks %s" % subdir, field="remover log")


def staged_without(pvc, subdir):
    """(new annotation JSON, changed) for the PVC's staged record without ``subdir`` (and anything below it)."""
    staged = staged_records(pvc)
    keep = {k: v for k, v in staged.items() if not is_under("/" + k.strip("/"), "/" + subdir)}
    return json.dumps(keep, sort_keys=True), len(keep) != len(staged)


# --------------------------------------------------------------------------------------------------
# the whole step, over a small cluster interface (the module supplies it; tests can too)
# --------------------------------------------------------------------------------------------------
DRAFT_REMOVED_ANNOTATION = "spec-decoding.alauda.io/draft-removed"
REMOVED_PVC_ANNOTATION = "spec-decoding.alauda.io/draft-removed"


def _annotation_op(obj, key, value):
    annotations = ((obj or {}).get("metadata") or {}).get("annotations")
    if annotations is None:
        return {"op": "add", "path": "/metadata/annotations", "value": {key: value}}
    return {"op": "add", "path": "/metadata/annotations/" + isvc_patch.escape_pointer(key), "value": value}


def removed_records(pvc):
    ann = ((pvc or {}).get("metadata") or {}).get("annotations") or {}
    try:
        data = json.loads(ann.get(REMOVED_PVC_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def execute(params, cluster, open_registry=None, check_mode=False, warn=None):
    """Plan and (outside check mode) carry out the removal; returns the module result.

    ``cluster``: get_isvc(), patch_isvc(ops, dry_run), wait_ready(), get_pvc(name), patch_pvc_annotations(name, dict), and
    optionally list_users() -> (the namespace's InferenceServices and LLMInferenceServices, [kinds it could not list]):
    with it a PVC subdirectory another of them still uses (other_users), or that it could not check, is kept.
    ``open_registry(image_ref, repository=None)`` returns an oci_registry.RegistryClient (modelcar mode only).
    A removal that patches an object Argo CD, Flux or Helm manages is refused before anything is written or pushed
    (option gitops_owner); `warn(text)` gets the ignore warning.
    """
    isvc = cluster.get_isvc()
    state = readiness_of(isvc)
    if not (state["ready"] and state["up_to_date"]):
        raise ValidationError("the rolled-back revision is not Ready at generation %s yet (observedGeneration %s); the draft stays"
                              % (state["generation"], state["observed_generation"]), field=FIELD,
                              hint="wait for the rollback to be Ready (and proven) first")
    path, source = draft_path_from(isvc, params.get("previous_config"), params.get("draft_path"))
    loc = locate(isvc, path, source or "draft_path")
    result = {"changed": False, "source": source}
    result.update(loc.as_dict())
    if loc.mode in ("storage_uris", "modelcar"):  # both patch the serving object (the PVC mode only the PVC's annotations)
        meta = isvc.get("metadata") or {}
        gitops_owner.check_live_write(getattr(cluster, "api_client", None), isvc, params.get("gitops_owner", "refuse"),
                                      "%s %s/%s" % (isvc.get("kind") or "InferenceService", meta.get("namespace"), meta.get("name")),
                                      warn=warn)
    if loc.mode == "storage_uris":
        ops = list(loc.details["ops"]) + [_annotation_op(isvc, DRAFT_REMOVED_ANNOTATION, json.dumps(
            {"mode": "storage_uris", "draft_path": loc.draft_path, "entry": loc.details["removed"]}, sort_keys=True))]
        after = cluster.patch_isvc(ops, dry_run=check_mode)
        result.update(changed=True, removed=loc.details["removed"], patch=ops)
        if not check_mode and params.get("wait"):
            after = cluster.wait_ready()
        result["resource"] = after
    elif loc.mode == "pvc":
        pvc = cluster.get_pvc(loc.details["pvc"])
        if pvc is None:
            raise ValidationError("PVC %s (from %s) does not exist" % (loc.details["pvc"], loc.details["storage_uri"]), field="storageUri")
        job = pvc_job(loc, pvc, params.get("script_sha256") or "")
        result["pvc_job"] = job
        subdir = loc.details["subdir"]
        lister = getattr(cluster, "list_users", None)
        if params.get("remover_log") is None and lister is not None:
            objects, unchecked = lister()
            users = other_users(objects, isvc, loc.details["pvc"], subdir) + unchecked
            if users:
                result.update(run_job=False, kept=True, still_used_by=users,
                              note="the subdirectory %s of PVC %s is kept: still used by %s" % (subdir, loc.details["pvc"], "; ".join(users)))
                result["warnings"] = [result["note"]]
                return result
        staged = staged_records(pvc)
        done = removed_records(pvc).get(subdir)
        if params.get("remover_log") is None:
            result["run_job"] = bool(subdir in staged or not done)
            if not result["run_job"]:
                result["note"] = "the subdirectory %s of PVC %s was removed earlier (Job %s); nothing to do" % (subdir, loc.details["pvc"], done)
            return result
        item = parse_remover_log(params["remover_log"], subdir)
        new_staged, dropped = staged_without(pvc, subdir)
        removed = dict(removed_records(pvc))
        removed[subdir] = params.get("remover_job") or job["job"]
        annotations = {REMOVED_PVC_ANNOTATION: json.dumps(removed, sort_keys=True)}
        if dropped:
            annotations[STAGED_ANNOTATION] = new_staged
        if not check_mode:
            cluster.patch_pvc_annotations(loc.details["pvc"], annotations)
        result.update(changed=bool(item.get("removed") or dropped or item.get("records_updated")), removed=item, run_job=False,
                      staged_annotation=new_staged)
    elif loc.mode == "modelcar":
        result.update(modelcar_remove(params, cluster, isvc, loc, open_registry, check_mode))
    return result


def readiness_of(isvc):
    """Ready / up-to-date of an InferenceService (isvc_readers.readiness) or an LLMInferenceService (llmisvc_status.readiness)."""
    if is_llmisvc(isvc):
        return llmisvc_status.readiness(isvc)
    # imported here: k8s_pods loads the kubernetes client (40+ MiB), which the image rewrite does not need
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve.isvc import readers as isvc_readers  # pylint: disable=import-outside-toplevel
    return isvc_readers.readiness(isvc)


def modelcar_remove(params, cluster, isvc, loc, open_registry, check_mode):
    """Push the image without the draft (blobs reused, manifest last) and move storageUri to its digest."""
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.registry import ImageRef  # pylint: disable=import-outside-toplevel

    ref = ImageRef.parse(loc.details["image"], field="storageUri")
    src = open_registry(ref)
    try:
        src.ping()
        got = src.get_manifest(ref.reference)
        if got is None:
            raise ValidationError("the image %s is not in the registry" % ref, field="storageUri",
                                  hint="check the InferenceService's storageUri and the registry credentials")
        old_digest, manifest_bytes, _ctype = got
        if ref.digest and old_digest != ref.digest:
            raise SpecDecodingError("registry %s returned manifest %s for %s" % (ref.registry, old_digest, ref.digest), field="storageUri")
        media_type = json.loads(manifest_bytes).get("mediaType") or _ctype or "application/vnd.oci.image.manifest.v1+json"
        actions, _repl, new_manifest, _new_config, uploads = plan_image(RemoteImage(src), manifest_bytes, loc.details["image_path"], old_digest)
    finally:
        src.close()
    out = {"image": {"from": str(ref), "layers_dropped": actions.count("drop"), "layers_rewritten": actions.count("rewrite"),
                     "layers_kept": actions.count("keep")}}
    if new_manifest is None:
        out["note"] = "the image %s holds no /%s; nothing to remove" % (ref, loc.details["image_path"])
        out["removed"] = None
        return out
    new_ref = ImageRef(ref.registry, params.get("repository") or ref.repository, nodraft_tag(ref, params.get("tag")))
    new_digest = sha256_digest(new_manifest)
    new_uri = loc.details.get("scheme", "oci://") + new_ref.with_digest(new_digest)
    out["image"].update(to="%s/%s:%s" % (new_ref.registry, new_ref.repository, new_ref.tag), digest=new_digest, storage_uri=new_uri)
    ops = [{"op": "test", "path": loc.details["pointer"], "value": loc.details["storage_uri"]},
           {"op": "replace", "path": loc.details["pointer"], "value": new_uri},
           _annotation_op(isvc, DRAFT_REMOVED_ANNOTATION, json.dumps(
               {"mode": "modelcar", "draft_path": loc.draft_path, "previous_storage_uri": loc.details["storage_uri"]}, sort_keys=True))]
    out.update(changed=True, removed={"image_path": "/" + loc.details["image_path"], "previous_storage_uri": loc.details["storage_uri"]},
               patch=ops)
    if check_mode:
        out["resource"] = cluster.patch_isvc(ops, dry_run=True)
        return out
    dst = open_registry(new_ref)
    try:
        dst.ping()
        remote = RemoteImage(dst)
        manifest = json.loads(new_manifest)
        fresh = {u.digest for u in uploads}
        stats = {"present": 0, "mounted": 0, "uploaded": 0}
        for desc in manifest["layers"]:
            if desc["digest"] in fresh:
                continue
            stats[remote.mount_or_check(desc["digest"], desc["size"], ref.repository)] += 1
        for source in uploads:
            if not dst.blob_exists(source.digest, source.size):
                dst.upload_blob(source)
                stats["uploaded"] += 1
            else:
                stats["present"] += 1
        stored = dst.put_manifest(new_ref.tag, new_manifest, media_type)
        if stored != new_digest:
            raise SpecDecodingError("registry %s stored the manifest as %s, expected %s" % (new_ref.registry, stored, new_digest),
                                    field="storageUri", hint="use a registry that stores OCI manifests as given")
    finally:
        dst.close()
    out["image"]["blobs"] = stats
    after = cluster.patch_isvc(ops, dry_run=False)
    if params.get("wait"):
        after = cluster.wait_ready()
    out["resource"] = after
    return out
