# -*- coding: utf-8 -*-
# Copyright: Alauda
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where vLLM's HTTP server listens in a pod: ``--port`` / ``--ssl-certfile`` in the container's command and args (also
inside a ``bash -c`` script, ``$PORT`` from the container's env; read by vllm.command_line), else its container ports;
and the check of a ``port`` option before any API call.

Plain Python, no Ansible imports, no API calls: it reads a pod spec (a dict with the API's camelCase keys).
"""

from __future__ import annotations

import re

from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError
from ansible_collections.alauda.spec_decoding.plugins.module_utils.kube.defaults import DEFAULT_CONTAINER, DEFAULT_HTTP_PORT
from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import command_line as vllm_command

# vLLM's own flag; KServe's model servers (huggingfaceserver) use --http_port. vllm_command reads ``_`` and ``-`` alike.
PORT_FLAGS = ("--port", "--http-port")
TLS_FLAGS = ("--ssl-certfile",)
HTTP_PORT_NAMES = ("http", "http1", "h2c", "http-server", "metrics", "http-metrics")


_PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")


def check_port(port, field="port"):
    """A port as the pod proxy takes it: a number 1-65535 or a container port name (IANA_SVC_NAME: at most 15
    lowercase letters, digits and inner dashes, at least one letter). Checked before any API call."""
    text = None if port is None else str(port).strip()
    if not text:
        return None
    if text.isdigit():
        if not 1 <= int(text) <= 65535:
            raise ValidationError("port %s is out of range" % text, field=field, hint="give a port number from 1 to 65535, or a container port name")
        return int(text)
    if not _PORT_NAME.match(text) or "--" in text:
        raise ValidationError("%r is neither a port number nor a valid container port name" % text, field=field,
                              hint="give a number from 1 to 65535, or the name of a port in the pod spec (e.g. http)")
    return text


def pod_http_target(pod, container=DEFAULT_CONTAINER, port=None, scheme=None):
    """Where vLLM's HTTP server listens in a pod (a dict with the API's camelCase keys).

    Returns ``{"scheme", "port", "container", "how"}``. ``port`` as given: a number is used as is; a name is
    looked up among the pod's container ports (the pod proxy only takes numbers). Without it: ``--port`` (or
    KServe's ``--http_port``) in the container's command/args, which is what the server binds; else the
    container's port named http/http1/h2c/metrics, else its first TCP port; else 8080. ``scheme`` without a
    value: https when the container passes ``--ssl-certfile`` to vLLM, else http.
    """
    spec = (pod or {}).get("spec") or {}
    pod_name = ((pod or {}).get("metadata") or {}).get("name") or "?"
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    chosen = None
    for item in containers:
        if item.get("name") == container:
            chosen = item
    how = []
    if chosen is None:
        chosen = containers[0] if containers else {}
        if containers:
            how.append("pod has no container %r, used %r" % (container, chosen.get("name")))
    argv = list(chosen.get("command") or []) + list(chosen.get("args") or [])
    ports = [p for p in chosen.get("ports") or [] if isinstance(p, dict) and p.get("containerPort")]
    resolved = None
    checked = check_port(port)
    text = None if checked is None else str(checked)
    if text:
        if text.isdigit():
            resolved, source = int(text), "given"
        else:
            named = [(c.get("name"), p) for c in [chosen] + [c for c in containers if c is not chosen]
                     for p in c.get("ports") or [] if isinstance(p, dict) and p.get("name") == text]
            if not named:
                names = sorted({p.get("name") for c in containers for p in c.get("ports") or [] if isinstance(p, dict) and p.get("name")})
                raise ValidationError("pod %s has no container port named %r (named ports: %s)"
                                      % (pod_name, text, ", ".join(names) or "none"), field="port",
                                      hint="give the port number, or one of the pod's port names")
            resolved, source = int(named[0][1]["containerPort"]), "from the port named %r of container %s" % (text, named[0][0])
    if resolved is None:
        flag = vllm_command.find_option(argv, PORT_FLAGS, chosen.get("env"))
        if flag is not None and flag[1].isdigit():
            resolved, source = int(flag[1]), "from %s in the command/args of %s" % (flag[0], chosen.get("name"))
    if resolved is None and ports:
        tcp = [p for p in ports if str(p.get("protocol") or "TCP").upper() == "TCP"]
        named = [p for p in tcp if str(p.get("name") or "").lower() in HTTP_PORT_NAMES]
        plain = [p for p in tcp if "grpc" not in str(p.get("name") or "").lower()]
        pick = (named or plain or tcp or ports)[0]
        resolved, source = int(pick["containerPort"]), "from containerPort%s of %s" % (
            " %r" % pick["name"] if pick.get("name") else "", chosen.get("name"))
    if resolved is None:
        resolved, source = DEFAULT_HTTP_PORT, "by default (no --port and no containerPort on %s)" % (chosen.get("name") or "the pod")
    how.append("port %s %s" % (resolved, source))
    if scheme:
        chosen_scheme = scheme
        how.append("scheme %s given" % scheme)
    elif vllm_command.option_value(argv, TLS_FLAGS, chosen.get("env")):
        chosen_scheme = "https"
        how.append("https because %s passes --ssl-certfile" % chosen.get("name"))
    else:
        chosen_scheme = "http"
    return {"scheme": chosen_scheme, "port": resolved, "container": chosen.get("name"), "how": "; ".join(how)}
