# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Credentials for private artifact sources, as KServe expects them, and redaction of secret values.

KServe's storage initializer reads credentials from the Secrets listed in the predictor's ServiceAccount
(``secrets:``): a Secret with key ``HF_TOKEN`` gives ``hf://`` access, one with ``AWS_SECRET_ACCESS_KEY``
(and ``AWS_ACCESS_KEY_ID``) gives ``s3://`` access, tuned by the annotations ``serving.kserve.io/s3-endpoint``,
``s3-usehttps``, ``s3-region``, ``s3-verifyssl``, ``s3-usevirtualbucket``, ``s3-useanoncredential``,
``s3-cabundle``. Images (Modelcar ``oci://`` sidecars, the stager Job) are pulled with the
``kubernetes.io/dockerconfigjson`` Secrets in the ServiceAccount's ``imagePullSecrets``, which the API server
copies into every pod that names the ServiceAccount.

``build_cluster_plan`` returns the Secrets and the ServiceAccount to apply (values inside: callers keep them
behind ``no_log``). ``build_gitops_plan`` returns manifests that carry no value at all: the ServiceAccount
plus, per Secret, an ExternalSecret, a SealedSecret placeholder or nothing (a reference to a Secret that
must exist). ``redact`` / ``redact_obj`` hide secret values (and their base64 forms) in any text or data.

Plain Python, no Ansible imports.
"""

from __future__ import annotations

import base64
import copy
import json
import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError, optional_import

yaml = optional_import("yaml")[0]  # reported by the caller
HAS_YAML = yaml is not None

KSERVE_ANNOTATION = "serving.kserve.io/"
S3_ANNOTATIONS = {
    # option key -> annotation KServe reads on the Secret
    "endpoint": "serving.kserve.io/s3-endpoint",
    "use_https": "serving.kserve.io/s3-usehttps",
    "region": "serving.kserve.io/s3-region",
    "verify_ssl": "serving.kserve.io/s3-verifyssl",
    "use_virtual_bucket": "serving.kserve.io/s3-usevirtualbucket",
    "use_anonymous_credential": "serving.kserve.io/s3-useanoncredential",
    "ca_bundle": "serving.kserve.io/s3-cabundle",
    "ca_bundle_configmap": "serving.kserve.io/s3-cabundle-configmap",
}
HF_TOKEN_KEY = "HF_TOKEN"
S3_ACCESS_KEY_ID_KEY = "AWS_ACCESS_KEY_ID"
S3_SECRET_ACCESS_KEY_KEY = "AWS_SECRET_ACCESS_KEY"
DOCKERCONFIG_KEY = ".dockerconfigjson"
DOCKERCONFIG_TYPE = "kubernetes.io/dockerconfigjson"
MANAGED_BY = {"app.kubernetes.io/managed-by": "alauda.spec_decoding", "app.kubernetes.io/component": "artifact-credentials"}
GITOPS_STYLES = ("reference", "external_secret", "sealed_secret")
REDACTED = "<redacted>"
SEALED_PLACEHOLDER = "REPLACE-WITH-kubeseal-OUTPUT"
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BOOL_ANNOTATIONS = ("use_https", "verify_ssl", "use_virtual_bucket", "use_anonymous_credential")


def _b64(text):
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def _check_name(value, field):
    if not value or len(value) > 253 or not _DNS1123.match(value):
        raise ValidationError("%r is not a valid Kubernetes object name" % (value,), field=field,
                              hint="use lower-case letters, digits, '-' and '.', starting and ending with a letter or digit")
    return value


def _annotation_value(key, value):
    if key in _BOOL_ANNOTATIONS:
        text = str(value).strip().lower()
        words = ("true", "false") if key == "use_anonymous_credential" else ("1", "0")
        if value is True or text in ("1", "true", "yes", "on"):
            return words[0]
        if value is False or text in ("0", "false", "no", "off"):
            return words[1]
        raise ValidationError("%r is not a boolean" % (value,), field="s3.%s" % key, hint="write true or false")
    return str(value)


def registry_server(server):
    """The registry host as Docker config keys it: no scheme, no path (``docker.io`` stays as given)."""
    text = str(server or "").strip()
    text = re.sub(r"^[a-z]+://", "", text)
    return text.split("/", 1)[0]


def dockerconfigjson(registries):
    """The ``.dockerconfigjson`` document for ``[{server, username, password, email?}]`` (a JSON string)."""
    auths = {}
    for index, reg in enumerate(registries or []):
        field = "registries[%d]" % index
        if not isinstance(reg, dict):
            raise ValidationError("expected a dict with server, username, password", field=field)
        server = registry_server(reg.get("server"))
        if not server:
            raise ValidationError("server is required (e.g. registry.internal.example:5000)", field=field + ".server")
        username, password = reg.get("username"), reg.get("password")
        if not username or password in (None, ""):
            raise ValidationError("username and password (or a token as password) are required for %s" % server, field=field,
                                  hint="put them in a vaulted variable")
        entry = {"username": str(username), "password": str(password), "auth": _b64("%s:%s" % (username, password))}
        if reg.get("email"):
            entry["email"] = str(reg["email"])
        auths[server] = entry
    return json.dumps({"auths": auths}, sort_keys=True, separators=(",", ":"))


def _meta(name, namespace, labels=None, annotations=None):
    meta = {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY, **(labels or {}))}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _secret(name, namespace, data, secret_type="Opaque", labels=None, annotations=None):
    return {"apiVersion": "v1", "kind": "Secret", "type": secret_type,
            "metadata": _meta(name, namespace, labels, annotations),
            "data": {k: _b64(v) for k, v in sorted(data.items())}}


def _s3_annotations(s3):
    annotations = {}
    for key, annotation in S3_ANNOTATIONS.items():
        value = s3.get(key)
        if value is None or value == "":
            continue
        if key == "endpoint":
            value = re.sub(r"^https?://", "", str(value)).rstrip("/")
        annotations[annotation] = _annotation_value(key, value)
    return annotations


def normalise(params):
    """Check and complete the role's inputs; returns a new dict (names filled in, empty sources dropped)."""
    p = dict(params or {})
    namespace = _check_name(p.get("namespace") or "", "namespace")
    sa = _check_name(p.get("service_account_name") or "", "service_account_name")
    p["namespace"], p["service_account_name"] = namespace, sa
    hf_token = p.get("hf_token") or ""
    s3 = dict(p.get("s3") or {})
    registries = list(p.get("registries") or [])
    p["hf_secret_name"] = _check_name(p.get("hf_secret_name") or "%s-hf" % sa, "hf_secret_name")
    p["s3_secret_name"] = _check_name(p.get("s3_secret_name") or "%s-s3" % sa, "s3_secret_name")
    p["registry_secret_name"] = _check_name(p.get("registry_secret_name") or "%s-registry" % sa, "registry_secret_name")
    has_s3_keys = bool(s3.get("access_key_id") or s3.get("secret_access_key"))
    if has_s3_keys and not (s3.get("access_key_id") and s3.get("secret_access_key")):
        raise ValidationError("needs both access_key_id and secret_access_key", field="s3",
                              hint="set both, or neither with use_anonymous_credential: true")
    p["hf_token"] = hf_token
    p["s3"] = s3
    p["registries"] = registries
    p["use_hf"] = bool(hf_token) or bool(p.get("hf_enabled"))
    p["use_s3"] = has_s3_keys or bool(s3.get("use_anonymous_credential")) or bool(p.get("s3_enabled"))
    p["use_registry"] = bool(registries) or bool(p.get("registry_enabled"))
    p["existing_secrets"] = [_check_name(n, "existing_secrets") for n in p.get("existing_secrets") or []]
    p["existing_pull_secrets"] = [_check_name(n, "existing_pull_secrets") for n in p.get("existing_pull_secrets") or []]
    style = p.get("gitops_style") or "external_secret"
    if style not in GITOPS_STYLES:
        raise ValidationError("unknown style %r" % style, field="gitops_style", hint="use one of %s" % ", ".join(GITOPS_STYLES))
    p["gitops_style"] = style
    return p


def _names(p):
    storage = ([p["hf_secret_name"]] if p["use_hf"] else []) + ([p["s3_secret_name"]] if p["use_s3"] else [])
    storage += [n for n in p["existing_secrets"] if n not in storage]
    pulls = ([p["registry_secret_name"]] if p["use_registry"] else [])
    pulls += [n for n in p["existing_pull_secrets"] if n not in pulls]
    return storage, pulls


def service_account(p, storage_secrets, pull_secrets):
    """The predictor's ServiceAccount: storage Secrets in ``secrets`` (KServe reads them), pull Secrets in ``imagePullSecrets``."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount",
          "metadata": _meta(p["service_account_name"], p["namespace"], p.get("labels"))}
    if storage_secrets:
        sa["secrets"] = [{"name": n} for n in storage_secrets]
    if pull_secrets:
        sa["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    return sa


def build_cluster_plan(params):
    """Secrets (with values, base64 in ``data``) and the ServiceAccount to apply. Keep the result behind no_log."""
    p = normalise(params)
    labels = p.get("labels")
    secrets = []
    if p["use_hf"] and p["hf_token"]:
        secrets.append(_secret(p["hf_secret_name"], p["namespace"], {HF_TOKEN_KEY: p["hf_token"]}, labels=labels))
    if p["use_s3"]:
        s3 = p["s3"]
        data = {}
        if s3.get("access_key_id"):
            data[s3.get("access_key_id_name") or S3_ACCESS_KEY_ID_KEY] = str(s3["access_key_id"])
            data[s3.get("secret_access_key_name") or S3_SECRET_ACCESS_KEY_KEY] = str(s3["secret_access_key"])
        if data or s3.get("use_anonymous_credential"):
            secrets.append(_secret(p["s3_secret_name"], p["namespace"], data, labels=labels, annotations=_s3_annotations(s3)))
    if p["registries"]:
        secrets.append(_secret(p["registry_secret_name"], p["namespace"], {DOCKERCONFIG_KEY: dockerconfigjson(p["registries"])},
                               secret_type=DOCKERCONFIG_TYPE, labels=labels))
    storage, pulls = _names(p)
    return {"secrets": secrets, "service_account": service_account(p, storage, pulls),
            "secret_names": storage, "pull_secret_names": pulls, "service_account_name": p["service_account_name"],
            "namespace": p["namespace"], "secret_values": secret_values(p)}


def secret_values(params):
    """Every value that must never be printed (tokens, keys, passwords, and their base64/auth forms)."""
    p = params
    values = []
    if p.get("hf_token"):
        values.append(str(p["hf_token"]))
    s3 = p.get("s3") or {}
    for key in ("access_key_id", "secret_access_key"):
        if s3.get(key):
            values.append(str(s3[key]))
    for reg in p.get("registries") or []:
        if isinstance(reg, dict) and reg.get("password"):
            values.append(str(reg["password"]))
            if reg.get("username"):
                values.append("%s:%s" % (reg["username"], reg["password"]))
    return values


def _external_secret(p, name, keys, secret_type="Opaque", annotations=None):
    store = p.get("external_secret_store") or {}
    remote_prefix = (p.get("external_secret_remote_prefix") or "%s/" % p["namespace"]).rstrip("/") + "/"
    template = {"type": secret_type, "metadata": {"labels": dict(MANAGED_BY, **(p.get("labels") or {}))}}
    if annotations:
        template["metadata"]["annotations"] = dict(annotations)
    return {"apiVersion": p.get("external_secret_api_version") or "external-secrets.io/v1", "kind": "ExternalSecret",
            "metadata": _meta(name, p["namespace"], p.get("labels")),
            "spec": {"refreshInterval": p.get("external_secret_refresh_interval") or "1h",
                     "secretStoreRef": {"name": store.get("name") or "vault", "kind": store.get("kind") or "ClusterSecretStore"},
                     "target": {"name": name, "creationPolicy": "Owner", "template": template},
                     "data": [{"secretKey": key, "remoteRef": {"key": remote_prefix + name, "property": key}} for key in keys]}}


def _sealed_secret(p, name, keys, secret_type="Opaque", annotations=None):
    meta = {"name": name, "namespace": p["namespace"], "labels": dict(MANAGED_BY, **(p.get("labels") or {}))}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "bitnami.com/v1alpha1", "kind": "SealedSecret",
            "metadata": _meta(name, p["namespace"], p.get("labels"), {"sealedsecrets.bitnami.com/placeholder": "true"}),
            "spec": {"encryptedData": {key: SEALED_PLACEHOLDER for key in keys},
                     "template": {"type": secret_type, "metadata": meta}}}


def build_gitops_plan(params):
    """Manifests without any secret value: ServiceAccount + per Secret an ExternalSecret, a SealedSecret
    placeholder, or nothing (``reference``: the Secret must be created out of band). Also the notes a README needs."""
    p = normalise(params)
    style = p["gitops_style"]
    wanted = []  # (name, keys, type, annotations)
    if p["use_hf"]:
        wanted.append((p["hf_secret_name"], [HF_TOKEN_KEY], "Opaque", None))
    if p["use_s3"]:
        s3 = p["s3"]
        keys = [] if s3.get("use_anonymous_credential") and not s3.get("access_key_id") and not p.get("s3_enabled") else \
            [s3.get("access_key_id_name") or S3_ACCESS_KEY_ID_KEY, s3.get("secret_access_key_name") or S3_SECRET_ACCESS_KEY_KEY]
        wanted.append((p["s3_secret_name"], keys, "Opaque", _s3_annotations(s3)))
    if p["use_registry"]:
        wanted.append((p["registry_secret_name"], [DOCKERCONFIG_KEY], DOCKERCONFIG_TYPE, None))
    manifests, notes = [], []
    for name, keys, secret_type, annotations in wanted:
        if style == "external_secret":
            manifests.append(_external_secret(p, name, keys, secret_type, annotations))
            notes.append("ExternalSecret %s: store the keys %s under %s in the secret store" % (
                name, ", ".join(keys) or "(none)", (p.get("external_secret_remote_prefix") or p["namespace"]).rstrip("/") + "/" + name))
        elif style == "sealed_secret":
            manifests.append(_sealed_secret(p, name, keys, secret_type, annotations))
            notes.append("SealedSecret %s: replace each %s with `kubeseal` output for the keys %s" % (name, SEALED_PLACEHOLDER, ", ".join(keys)))
        else:
            notes.append("Secret %s/%s (type %s, keys %s%s) must exist before sync: create it out of band" % (
                p["namespace"], name, secret_type, ", ".join(keys) or "(none)",
                ", annotations " + ", ".join("%s=%s" % kv for kv in sorted(annotations.items())) if annotations else ""))
    storage, pulls = _names(p)
    manifests.insert(0, service_account(p, storage, pulls))
    return {"manifests": manifests, "notes": notes, "secret_names": storage, "pull_secret_names": pulls,
            "service_account_name": p["service_account_name"], "namespace": p["namespace"],
            "yaml": gitops_yaml(manifests, notes)}


def gitops_yaml(manifests, notes):
    """One multi-document YAML file, notes as comments on top; deterministic so reruns are byte-identical."""
    # A JSON round trip turns the caller's str/dict subclasses (Ansible's tagged values) into plain types yaml can dump.
    manifests = json.loads(json.dumps(manifests))
    head = ["# Credentials for private artifact sources (alauda.spec_decoding): references only, never values."]
    head += ["# - %s" % note for note in notes]
    if not HAS_YAML:
        docs = [json.dumps(m, sort_keys=True, indent=2) for m in manifests]
    else:
        docs = [yaml.safe_dump(m, sort_keys=True, default_flow_style=False) for m in manifests]
    return "\n".join(head) + "\n" + "".join("---\n" + d if d.endswith("\n") else "---\n" + d + "\n" for d in docs)


# ----------------------------------------------------------------------------------------------------
# Redaction

_SECRET_WORDS = ("token", "password", "passwd", "secret", "apikey", "credential", "credentials")


def is_secret_name(name):
    """Whether a flag or variable name (``--hf-token``, ``AWS_SECRET_ACCESS_KEY``) names a secret.

    Word-wise, so ``--tokenizer``, ``--max-num-batched-tokens`` and ``num_speculative_tokens`` are not secrets."""
    words = [w for w in re.split(r"[-_.\s]+", str(name or "").lower().lstrip("-")) if w]
    joined = "".join(words)
    if any(w in _SECRET_WORDS for w in words):
        return True
    return "apikey" in joined or "accesskey" in joined and "id" not in words


def _flag_repl(match):
    if is_secret_name(match.group(1)):
        return "%s%s%s" % (match.group(1), match.group(2), REDACTED)
    return match.group(0)


def _env_repl(match):
    if is_secret_name(match.group(1)):
        return "%s=%s" % (match.group(1), REDACTED)
    return match.group(0)


_TOKEN_PATTERNS = [
    # --flag=value and --flag value forms of secret-named command-line options
    (re.compile(r"(--?[A-Za-z][A-Za-z0-9_-]*)(=|[ \t]+)(?!-)([^\s'\"]+)"), _flag_repl),
    # KEY=value assignments of secret-named environment variables (upper case, as shells and env dumps print them)
    (re.compile(r"\b([A-Z][A-Z0-9_]*)=([^\s'\"]+)"), _env_repl),
    # Python/JSON dict reprs such as vLLM's "non-default args: {'api_key': '...'}"
    (re.compile(r"""(['"])([A-Za-z0-9_.-]+)\1(\s*:\s*)(['"])([^'"]*)\4"""),
     lambda m: m.group(0) if not is_secret_name(m.group(2)) or not m.group(5) else
     "%s%s%s%s%s%s%s" % (m.group(1), m.group(2), m.group(1), m.group(3), m.group(4), REDACTED, m.group(4))),
    (re.compile(r"(?i)(authorization:\s*(?:bearer|basic)\s+)(\S+)"), lambda m: m.group(1) + REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}\b"), lambda m: REDACTED),
    (re.compile(r"(?i)(https?://[^\s:/@]+:)([^\s@/]+)(@)"), lambda m: m.group(1) + REDACTED + m.group(3)),
]


def _variants(values, min_length=4):
    out = set()
    for value in values or []:
        if value is None:
            continue
        text = str(value)
        if len(text) < min_length:   # too short to redact safely (would mangle ordinary text)
            continue
        out.add(text)
        out.add(_b64(text))
        out.add(_b64(text).rstrip("="))
    return sorted(out, key=len, reverse=True)


def redact(text, secrets=None, patterns=True, mask=REDACTED, min_length=4):
    """``text`` with every known secret value (plain or base64, longest first) and, with ``patterns``, token-looking
    arguments replaced by ``mask``. The one secret masker: the Git client and the registry client mask what they were
    given (``patterns=False``, every value however short: it is a password, not a guess)."""
    if text is None:
        return text
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for value in _variants(secrets, min_length):
        text = text.replace(value, mask)
    if patterns:
        for regex, repl in _TOKEN_PATTERNS:
            text = regex.sub(repl, text)
    return text


def redact_container(container, secrets=None):
    """A container spec with env values that look secret replaced, args/command redacted; secretKeyRefs are kept
    (they name the Secret, not the value)."""
    c = copy.deepcopy(container)
    for env in c.get("env") or []:
        if not isinstance(env, dict):
            continue
        if "value" in env and env["value"] not in (None, ""):
            if is_secret_name(env.get("name")):
                env["value"] = REDACTED
            else:
                env["value"] = redact(str(env["value"]), secrets)
    for key in ("command", "args"):
        if isinstance(c.get(key), list):
            joined = [redact(str(a), secrets) for a in c[key]]
            # "--hf-token", "<value>" as two items
            for i in range(1, len(joined)):
                prev = joined[i - 1]
                if prev.startswith("-") and "=" not in prev and is_secret_name(prev) and not joined[i].startswith("-"):
                    joined[i] = REDACTED
            c[key] = joined
    return c


def redact_obj(obj, secrets=None):
    """Deep copy of any JSON-like data: Secret ``data``/``stringData`` values dropped, containers redacted,
    every string passed through ``redact``."""
    if isinstance(obj, dict):
        if obj.get("kind") == "Secret":
            obj = dict(obj)
            for key in ("data", "stringData"):
                if isinstance(obj.get(key), dict):
                    obj[key] = {k: REDACTED for k in obj[key]}
        if any(isinstance(obj.get(k), list) for k in ("args", "command", "env")):
            obj = redact_container(obj, secrets)   # containers, and the InferenceService's predictor.model
        out = {}
        for key, value in obj.items():
            if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(value, list):
                out[key] = [redact_obj(redact_container(c, secrets), secrets) if isinstance(c, dict) else c for c in value]
            elif key == "last-applied-configuration" or key == "kubectl.kubernetes.io/last-applied-configuration":
                out[key] = REDACTED
            else:
                out[key] = redact_obj(value, secrets)
        return out
    if isinstance(obj, list):
        return [redact_obj(v, secrets) for v in obj]
    if isinstance(obj, str):
        return redact(obj, secrets)
    return obj
