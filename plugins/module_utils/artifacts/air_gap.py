# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Air-gapped inventories: find every source that would need the internet before anything is written.

``problems(spec)`` walks what a deploy would use (artifacts, predictor env, extra vLLM args, PVC staging items, the
LLMInferenceService's image, the images of the Jobs and CronJobs the roles create, the ServingRuntime the
InferenceService names) and returns one ValidationError per source that points at a public model hub, a public
container registry (or an image reference without a registry host, which means Docker Hub) or a public object store.
Each message names the field and the fix. An empty list means nothing in the inventory needs the internet.
docs/playbooks.md "Air-gapped clusters: every image" lists each image, where it comes from and how to mirror it.
"""

from __future__ import annotations

import urllib.parse

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts.artifact_sync import DEFAULT_HF_ENDPOINT, is_public_hub
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError

# Public container registries (a subdomain counts too). An image reference without a host is Docker Hub.
PUBLIC_REGISTRY_HOSTS = (
    "docker.io",
    "registry-1.docker.io",
    "index.docker.io",
    "registry.hub.docker.com",
    "quay.io",
    "ghcr.io",
    "gcr.io",
    "pkg.dev",
    "registry.k8s.io",
    "k8s.gcr.io",
    "nvcr.io",
    "public.ecr.aws",
    "mcr.microsoft.com",
    "registry.redhat.io",
    "registry.access.redhat.com",
    "registry.gitlab.com",
)

# Public object stores and code hosts a model URL may point at.
PUBLIC_STORE_HOSTS = (
    "amazonaws.com",
    "storage.googleapis.com",
    "blob.core.windows.net",
    "github.com",
    "githubusercontent.com",
)

FLAG = "spec_decoding_air_gapped: true"
URI_HINT = ("use pvc://<claim>/<path>, oci://<internal registry>/<repo>:<tag> or an http(s)/s3 URL of an internal mirror; "
            "or stage the files onto a PVC from the internal mirror (spec_decoding_stage_pvc); or set spec_decoding_air_gapped: false "
            "when the cluster can reach the internet")
IMAGE_HINT = ("push the image to the internal registry (alauda.spec_decoding.modelcar_image) and reference it with the registry host, "
              "e.g. registry.internal.example:5000/models/llama-eagle3:v1")


# Every image the roles run besides the model's, by the inventory variable that sets it: what it is and its default.
# The inventory_check role refuses a public one at the start of every playbook; the inference_service role checks the
# stager's effective image (its default is public) when it stages.
ROLE_IMAGES = {
    "stage_pvc_image": "the PVC stager Job (stage_pvc role)",
    "rollback_draft_job_image": "the draft remover Job (rollback role, PVC mode)",
    "rollback_schedule_image": "the scheduled rollback and watch CronJobs (rollback_schedule role)",
    "benchmark_image": "the benchmark's serving image (benchmark role)",
    "benchmark_load_image": "the benchmark's load Job (benchmark role)",
    "tune_load_job.image": "the load Jobs of tune.yml's sweep (tune role)",
}
# roles/stage_pvc/defaults/main.yml stage_pvc_image (a unit test keeps the two equal): the stager's image when the
# inventory sets none.
STAGER_DEFAULT_IMAGE = "docker.io/vllm/vllm-openai:latest"
LLMISVC_IMAGE_EXAMPLE = "registry.internal.example:5000/vllm/vllm-openai:v0.32.0"


def _matches(host, hosts):
    host = (host or "").lower().rstrip(".")
    return any(host == h or host.endswith("." + h) for h in hosts)


def public_host(host):
    """True when ``host`` is a public model hub, container registry or object store."""
    return is_public_hub(host) or _matches(host, PUBLIC_REGISTRY_HOSTS) or _matches(host, PUBLIC_STORE_HOSTS)


def image_registry(ref):
    """The registry host of an image reference (``docker.io`` when the reference has none, as Docker reads it)."""
    ref = ref[len("oci://"):] if ref.startswith("oci://") else ref
    first, sep, _rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first.lower()
    return "docker.io"


def check_image(ref, field, what=None, hint=IMAGE_HINT):
    """Raise ValidationError when an air-gapped deploy would pull ``ref`` from a public registry; ``what`` says what runs it."""
    host = image_registry(ref)
    if public_host(host.split(":")[0]):
        implicit = "" if ref.replace("oci://", "").lower().startswith(host) else " (no registry host means Docker Hub)"
        runs = " for " + what if what else ""
        raise ValidationError("%s refuses the image %r from the public registry %s%s%s" % (FLAG, ref, host, implicit, runs),
                              field=field, hint=hint)


def check_uri(uri, field):
    """Raise ValidationError when an air-gapped deploy would fetch ``uri`` from the internet."""
    text = uri.strip()
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme == "hf":
        raise ValidationError("%s refuses %r: KServe's storage initializer downloads hf:// from %s" % (FLAG, uri, DEFAULT_HF_ENDPOINT),
                              field=field, hint=URI_HINT)
    if scheme == "gs":
        raise ValidationError("%s refuses %r: gs:// is read from the public Google Cloud Storage endpoint" % (FLAG, uri),
                              field=field, hint=URI_HINT)
    if scheme == "oci":
        check_image(text, field)
        return
    if scheme in ("http", "https"):
        host = urllib.parse.urlsplit(text).hostname or ""
        if public_host(host):
            raise ValidationError("%s refuses %r: %s is a public host" % (FLAG, uri, host), field=field, hint=URI_HINT)


def _url_values(value):
    """The http(s) URLs inside a string (an env value or a vLLM argument may hold one among other text)."""
    for token in str(value).replace(",", " ").replace("=", " ").split():
        token = token.strip("'\"")
        if token.lower().startswith(("http://", "https://", "hf://", "gs://")):
            yield token


def _walk(value, field):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, "%s.%s" % (field, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _walk(item, "%s[%d]" % (field, index))
    elif isinstance(value, str):
        yield field, value


def _collect(errors, func, *args):
    try:
        func(*args)
    except ValidationError as exc:
        errors.append(exc)


def _check_artifacts(errors, artifacts):
    for field, value in _walk(artifacts or {}, "artifacts"):
        key = field.rsplit(".", 1)[-1]
        if key == "modelcar_image" or (key.endswith("image") and "://" not in value):
            _collect(errors, check_image, value, field)
        elif "://" in value:
            _collect(errors, check_uri, value, field)


def _check_env(errors, env):
    for name, value in (env or {}).items():
        field = "env.%s" % name
        if name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") and str(value).strip().lower() in ("0", "false", "no", "off"):
            errors.append(ValidationError("%s conflicts with %s=%s: vLLM would try to reach the hub" % (FLAG, name, value), field=field,
                                          hint="remove %s or set it to 1" % name))
            continue
        for url in _url_values(value):
            if url.lower().startswith(("hf://", "gs://")):
                _collect(errors, check_uri, url, field)
                continue
            host = urllib.parse.urlsplit(url).hostname or ""
            if public_host(host):
                what = "the Hugging Face endpoint" if name == "HF_ENDPOINT" else "a URL"
                errors.append(ValidationError("%s refuses %s %s on the public host %s" % (FLAG, what, url, host), field=field,
                                              hint="point %s at the internal mirror (e.g. https://hf.internal.example) or drop it" % name))


def _check_args(errors, args, field="extra_args"):
    for index, arg in enumerate(args or []):
        for url in _url_values(arg):
            _collect(errors, check_uri, url, "%s[%d]" % (field, index))


def _check_stage_items(errors, items, hf_endpoint, s3_endpoint):
    for index, item in enumerate(items or []):
        if not isinstance(item, dict):
            continue
        field = "stage_pvc_items[%d].source" % index
        source = str(item.get("source") or "")
        if source.startswith("hf://"):
            endpoint = item.get("hf_endpoint") or hf_endpoint or DEFAULT_HF_ENDPOINT
            host = urllib.parse.urlsplit(endpoint).hostname or ""
            if public_host(host):
                errors.append(ValidationError("%s refuses %s: hf:// sources are read from %s, a public hub" % (FLAG, source, endpoint),
                                              field=field, hint="set stage_pvc_hf_endpoint (or the item's hf_endpoint) to the internal "
                                              "Hugging Face mirror, or stage from an internal http/s3 mirror or a directory"))
        elif source.startswith("s3://"):
            endpoint = item.get("s3_endpoint") or s3_endpoint or ""
            host = urllib.parse.urlsplit(endpoint).hostname or ""
            if not endpoint or public_host(host):
                errors.append(ValidationError("%s refuses %s: without an internal s3_endpoint it is read from AWS" % (FLAG, source),
                                              field=field, hint="set stage_pvc_s3_endpoint (or the item's s3_endpoint) to the internal "
                                              "object store, e.g. http://minio.internal.example:9000"))
        elif source.lower().startswith(("http://", "https://", "gs://")):
            _collect(errors, check_uri, source, field)


def _repository(ref):
    """``ref`` without its registry host (``vllm/vllm-openai:v0.32.0`` for ``docker.io/vllm/vllm-openai:v0.32.0``)."""
    ref = ref[len("oci://"):] if ref.startswith("oci://") else ref
    first, sep, rest = ref.partition("/")
    return rest if sep and image_registry(ref) == first.lower() else ref


def _mirror_hint(variable, ref):
    return ("mirror the image into the internal registry (e.g. skopeo copy docker://%s docker://registry.internal.example:5000/%s) "
            "and set %s to registry.internal.example:5000/%s" % (ref, _repository(ref), variable, _repository(ref)))


def _check_llmisvc(errors, llmisvc):
    """The LLMInferenceService's main container image. Without one (and without baseRefs of the user's own presets) KServe's
    well-known presets (config/llmisvc/config-llm-template.yaml: kserve-config-llm-template) give it their public llm-d
    image, which an air-gapped cluster cannot pull."""
    if llmisvc is None:
        return
    image = str((llmisvc or {}).get("image") or "")
    if image:
        _collect(errors, check_image, image, "spec_decoding_llmisvc.image", "the LLMInferenceService's main container", _mirror_hint(
            "spec_decoding_llmisvc.image", image))
    elif not (llmisvc or {}).get("base_refs"):
        errors.append(ValidationError(
            "%s refuses an LLMInferenceService without an image: its main container would take the public image of KServe's "
            "well-known presets (kserve-config-llm-template)" % FLAG, field="spec_decoding_llmisvc.image",
            hint="mirror the vLLM image into the internal registry and set spec_decoding_llmisvc.image to it, e.g. %s "
                 "(or name your own preset with spec_decoding_llmisvc.base_refs)" % LLMISVC_IMAGE_EXAMPLE))


def _check_images(errors, images):
    """``{variable: image}`` of the Jobs and CronJobs the roles create (empty values are not used)."""
    for name, image in sorted((images or {}).items()):
        if image:
            _collect(errors, check_image, str(image), name, ROLE_IMAGES.get(name), _mirror_hint(name, str(image)))


def _runtime_containers(runtimes, namespace, runtime):
    """(kind/name, containers) of the runtime the InferenceService names, from kserve_info's snapshot; None when the snapshot
    does not hold it (no cluster read, another namespace): KServe's lookup order, the namespace's ServingRuntime first
    (kserve/isvc/runtime_selection.get_serving_runtime)."""
    held = (runtimes or {}).get("get") or {}
    for key in ("ServingRuntime/%s/%s" % (namespace, runtime), "ClusterServingRuntime/%s" % runtime):
        found = held.get(key)
        if isinstance(found, dict):
            return key.rsplit("/", 1)[0].split("/")[0] + " " + runtime, ((found.get("spec") or {}).get("containers") or [])
    return None, []


def _check_runtime(errors, runtimes, namespace, runtime):
    where, containers = _runtime_containers(runtimes, namespace, runtime)
    for container in containers:
        image = str((container or {}).get("image") or "")
        if not image:
            continue
        host = image_registry(image)
        if public_host(host.split(":")[0]):
            errors.append(ValidationError(
                "%s refuses the %s: its container %s pulls %r from the public registry %s" % (FLAG, where, container.get("name"), image, host),
                field="spec_decoding_runtime", hint="mirror the image into the internal registry (e.g. skopeo copy docker://%s "
                "docker://registry.internal.example:5000/%s), point the runtime's image at it (kubectl edit %s), or set "
                "spec_decoding_runtime to a runtime whose image is internal" % (image, _repository(image), where.replace(" ", "/").lower())))


def problems(spec):
    """Every source in ``spec`` an air-gapped deploy could not reach, as ValidationErrors (field + fix).

    ``spec`` keys (all optional): artifacts (dict), env (dict), extra_args (list), stage_items (list),
    stage_hf_endpoint, stage_s3_endpoint (str), hf_endpoint (str, e.g. a global HF_ENDPOINT setting), llmisvc (dict with
    image and base_refs, given only for an LLMInferenceService), stage_image (the stager Job's image, checked when stage_items
    are staged; empty: the stage_pvc role's default; absent: not checked), images ({variable: image} of the Jobs and CronJobs),
    runtimes (kserve_info's snapshot) with namespace and runtime (the ServingRuntime the InferenceService names).
    """
    spec = spec or {}
    errors = []
    _check_artifacts(errors, spec.get("artifacts"))
    _check_env(errors, spec.get("env"))
    _check_args(errors, spec.get("extra_args"))
    _check_stage_items(errors, spec.get("stage_items"), spec.get("stage_hf_endpoint") or spec.get("hf_endpoint"),
                       spec.get("stage_s3_endpoint"))
    _check_llmisvc(errors, spec.get("llmisvc"))
    images = dict(spec.get("images") or {})
    if spec.get("stage_items") and "stage_image" in spec:
        images["stage_pvc_image"] = spec["stage_image"] or STAGER_DEFAULT_IMAGE
    _check_images(errors, images)
    if spec.get("runtimes") and spec.get("runtime"):
        _check_runtime(errors, spec["runtimes"], spec.get("namespace"), spec["runtime"])
    return errors


def messages(spec):
    """``problems`` as plain strings (what the role prints)."""
    return [str(exc) for exc in problems(spec)]
