# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The API calls of the preflight's PVC read: create the read-only Job artifacts/pvc_metadata.py plans, wait for it to end
and read its pod's log (the cluster service's ``job_outcome``), delete the Job. Every failure is a MetadataUnreadable (the
check could not run: the caller says so and the rollout goes on), naming what the identity or the image lacks."""

from __future__ import annotations

import time

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import air_gap, model_metadata, pvc_metadata
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import SpecDecodingError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import wait as kube_wait

MAX_LOG_BYTES = 64 << 20
RBAC_HINT = ("the identity needs get on persistentvolumeclaims, create, get and delete on jobs, list on pods and get on pods/log "
             "in the PVC's namespace; or set spec_decoding_preflight: off")


def _kube():
    # pylint: disable=import-outside-toplevel
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import client as kube_client
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import pods as kube_pods
    return kube_client, kube_pods


# The inventory variable the deploy takes the Job's image from (roles/inference_service/tasks/main.yml).
IMAGE_HINT = ("set stage_pvc_image (the image of the PVC read Job and of the stager; it needs python3) to the vLLM image in your "
              "internal registry, e.g. registry.internal.example:5000/vllm/vllm-openai:v0.32.0, or spec_decoding_preflight: off")


def _unreadable(text, field="namespace", hint=RBAC_HINT):
    return model_metadata.MetadataUnreadable(text, field=field, hint=hint)


class NothingOnTheClaim(model_metadata.MetadataUnreadable):
    """The claim does not exist or has no volume yet: there are no files to check (the deploy's own wait reports a
    predictor that cannot mount it), so the preflight is skipped, not warned about."""


def _check_claims(api_client, namespace, locations):
    """NothingOnTheClaim for a claim that is absent or not bound to a volume (``spec.volumeName`` unset: a
    WaitForFirstConsumer claim no pod used yet is empty), before a Job would wait for it."""
    kube_client, kube_pods = _kube()
    for claim in sorted(pvc_metadata.plan(locations)["claims"]):
        try:
            pvc = kube_client.request(api_client, "GET", "/api/v1/namespaces/%s/persistentvolumeclaims/%s" % (namespace, claim))
        except kube_client.ApiException as exc:
            if getattr(exc, "status", None) == 404:
                raise NothingOnTheClaim("the PVC %s/%s does not exist: nothing to read" % (namespace, claim), field="namespace") from exc
            raise _unreadable("reading the PVC %s/%s failed: %s" % (namespace, claim, kube_pods.api_error_message(exc))) from exc
        if not (pvc.get("spec") or {}).get("volumeName"):
            raise NothingOnTheClaim("the PVC %s/%s is not bound to a volume yet: nothing on it to read" % (namespace, claim), field="namespace")
        if (pvc.get("spec") or {}).get("accessModes") == ["ReadWriteOncePod"]:
            # one pod at a time: the serving pod holds it, and a Job beside it would wait for ever
            raise _unreadable("the PVC %s/%s is ReadWriteOncePod: no Job can mount it beside the pod that uses it" % (namespace, claim),
                              hint="give the model store ReadOnlyMany or ReadWriteMany access, or set spec_decoding_preflight: off")


def read_pvc_locations(connect, namespace, locations, image, timeout=120, air_gapped=False, annotations=None, clock=time.monotonic,
                       sleep=time.sleep):
    """``{role: checkpoint}`` (model_metadata.read_checkpoint's dict, plus ``job``) of each pvc:// location in ``locations``,
    read by one Job in ``namespace``, in ``image`` (None: the stager's default image). ``connect()`` returns the API
    client (built only now: a run without a PVC never needs one).

    Under the air gap an image given on a public registry is refused, as the stager refuses it; the default image (public)
    is not a choice the user made, so the check is not run (a warning naming the variable) rather than the deploy refused."""
    if air_gapped:
        if image:
            air_gap.check_image(image, "pvc_image", "the preflight's PVC read Job", hint=IMAGE_HINT)
        else:
            raise _unreadable("the PVC read Job needs an image from the internal registry under spec_decoding_air_gapped: true, and none is "
                              "set (the default is %s)" % air_gap.STAGER_DEFAULT_IMAGE, field="pvc_image", hint=IMAGE_HINT)
    image = image or air_gap.STAGER_DEFAULT_IMAGE
    job = pvc_metadata.job_manifest(namespace, locations, image, timeout=timeout, annotations=annotations)
    try:
        api_client = connect()
    except Exception as exc:  # pylint: disable=broad-except
        # no kubeconfig (a GitOps render on a machine without cluster access): the pods will read the PVC, this host cannot
        raise _unreadable("no cluster to run the PVC read Job on (%s)" % exc, field="kubeconfig",
                          hint="give the deploy a kubeconfig that reaches the PVC's namespace, or set spec_decoding_preflight: off") from exc
    _check_claims(api_client, namespace, locations)
    kube_client, kube_pods = _kube()
    base = "/apis/batch/v1/namespaces/%s/jobs" % namespace
    try:
        created = kube_client.request(api_client, "POST", base, body=job)
    except kube_client.ApiException as exc:
        raise _unreadable("creating the PVC read Job in %s failed: %s" % (namespace, kube_pods.api_error_message(exc))) from exc
    name = created["metadata"]["name"]
    try:
        outcome = _outcome(api_client, namespace, name, timeout, clock, sleep)
    finally:
        try:
            kube_client.request(api_client, "DELETE", "%s/%s" % (base, name), query={"propagationPolicy": "Background"})
        except kube_client.ApiException:
            pass  # its ttlSecondsAfterFinished removes it
    text = outcome["log"]
    found = pvc_metadata.parse_log(text)
    if found is None or outcome["pod_phase"] != "Succeeded":
        tail = "\n".join(text.splitlines()[-10:]) or "(empty)"
        raise _unreadable("the PVC read Job %s/%s ended %s without a result; the end of its log:\n%s" % (
            namespace, name, outcome["pod_phase"], tail), field="pvc_image",
            hint="give pvc_image an image with python3 (3.6 or later) the nodes can pull")
    layout = pvc_metadata.plan(locations)
    out = {}
    for role, location in locations.items():
        entry = found.get(layout["dirs"][role]) or {}
        if entry.get("error"):
            raise model_metadata.MetadataUnreadable("cannot read the metadata of %s: %s" % (location, entry["error"]), field=role,
                                                    hint="point at the checkpoint's directory on the claim (pvc://<claim>/<path>)")
        try:
            ckpt = model_metadata.read_checkpoint(pvc_metadata.DumpReader(entry), location)
        except model_metadata.MetadataUnreadable as exc:
            raise model_metadata.MetadataUnreadable("cannot read the metadata of %s: %s" % (location, model_metadata.plain(exc)),
                                                    field=role, hint=exc.hint) from exc
        ckpt["job"] = "%s/%s" % (namespace, name)
        out[role] = ckpt
    return out


def _outcome(api_client, namespace, name, timeout, clock, sleep):
    """The Job's end with its pod that ran and that pod's log (kube/service.ClusterService.job_outcome: the one waiter's
    Job row, its pods looked at every second for one that cannot start); MetadataUnreadable when a pod cannot start, the
    Job ended without a pod that ran, time is up, or the Job or the log cannot be read. The Job's own
    activeDeadlineSeconds is ``timeout``; 30 s more give the Job controller time to say so."""
    kube_client, kube_pods = _kube()
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube import service as kube_service  # pylint: disable=import-outside-toplevel
    try:
        outcome = kube_service.service_of(api_client).job_outcome(
            namespace, name, timeout + 30, container=pvc_metadata.CONTAINER, interval=1.0, max_bytes=MAX_LOG_BYTES, clock=clock, sleep=sleep)
    except kube_wait.PodCannotStart as exc:
        raise _unreadable("the PVC read Job's pod %s/%s cannot start: %s: %s" % (namespace, exc.pod, exc.reason, exc.detail),
                          field="pvc_image", hint="give pvc_image (the deploy: stage_pvc_image) an image the nodes can pull, with python3") from exc
    except kube_wait.WaitTimeout as exc:
        raise _unreadable("the PVC read Job %s/%s did not end within %d s (a claim not bound, a node that cannot mount it?)"
                          % (namespace, name, timeout), field="pvc_timeout",
                          hint="check the claim is Bound and mountable (kubectl describe pod -n %s -l job-name=%s), or raise pvc_timeout"
                          % (namespace, name)) from exc
    except kube_client.ApiException as exc:
        raise _unreadable("reading the PVC read Job %s/%s failed: %s" % (namespace, name, kube_pods.api_error_message(exc))) from exc
    except SpecDecodingError as exc:  # its pods' list or log refused (saying which), the Job gone (deleted by hand)
        raise _unreadable("the PVC read Job %s/%s: %s" % (namespace, name, exc)) from exc
    if outcome["pod"] is None:
        # ended without a pod that ran (its deadline passed before one started, the pod was deleted): the Job says why
        condition = outcome["condition"]
        raise _unreadable("the PVC read Job %s/%s failed: %s: %s" % (namespace, name, condition.get("reason"), condition.get("message") or ""),
                          hint="see the Job's events (kubectl describe job -n %s %s)" % (namespace, name))
    return outcome
