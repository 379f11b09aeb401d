"""Container images for process-mode pods (pod_process.py), from the registries the test bed knows.

A container's `image` counts as an image here when its registry host (the part before the first `/`, as Docker reads a
reference) is one the node was told about: `kubelet.add_registry(host, ...)` (what a node's registries.conf and auth.json
say: TLS, CA, credentials). Any other image name is a label only, and the container runs on this host's files.

- Pull: `skopeo copy docker://<image> oci:<layout>` (uncompressed layers accepted as they are), with the credentials the
  kubelet would try, in its order: each of the pod's `imagePullSecrets` that names the registry
  (`kubernetes.io/dockerconfigjson` or `kubernetes.io/dockercfg`), then the node's own, else anonymous. Credentials go to
  skopeo in a 0600 auth file, never on its command line. `imagePullPolicy` as the kubelet applies it when a pod starts:
  `Always` pulls, `IfNotPresent` reuses what an earlier pull of the same reference unpacked, `Never` never pulls.
- Unpack: the manifest's layers in order into one root filesystem per manifest digest (cached for the node's life,
  shared read-only by every container of that image; pod_sandbox.py lays a writable overlay over it per container).
  OCI whiteouts are honoured: `.wh.<name>` removes `<name>` of the layers below, `.wh..wh..opq` empties its directory of
  what the layers below put there. Entries are extracted with tarfile's `tar` filter (nothing lands outside the root).
- The image config's `Entrypoint`, `Cmd`, `Env` and `WorkingDir` are returned for the kubelet's command rules.

`pull()` and `unpack()` are also the Modelcar tests' way to read an image back (tests/integration/test_modelcar.py).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading

from .pod_sandbox import PodConfigError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class ImagePullError(PodConfigError):
    """The image could not be pulled or unpacked (the kubelet's ErrImagePull)."""
    reason = "ErrImagePull"


@dataclasses.dataclass
class RegistryAccess:
    """What the node knows about one registry: TLS (verify, or a CA file) and its own credentials, if any."""
    tls_verify: bool = True
    ca_file: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass
class Pulled:
    """An image in an OCI layout: its manifest digest, manifest, config, and the layer blobs' paths in order."""
    digest: str
    manifest: dict
    config: dict
    layers: list


@dataclasses.dataclass
class Image:
    """An unpacked image: `rootfs` (read-only for its users), `config` (the image config's `config` object) and the
    imageID the kubelet reports (`<repository>@<digest>`)."""
    digest: str
    rootfs: str
    config: dict
    image_id: str


def registry_host(image: str) -> str | None:
    """The registry host of an image reference as Docker reads it (first component with `.` or `:`, or localhost)."""
    first, sep, _rest = (image or "").partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def _repository(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[:len(name) - len(last)] + last.split(":", 1)[0]


def pull(image: str, dest: str, skopeo_args=()) -> Pulled:
    """`skopeo copy docker://<image> oci:<dest>:pulled` (dest must not exist), then the layout read back.
    `skopeo_args`: TLS and credential flags for the source (`--src-tls-verify=false`, `--src-authfile F`, ...)."""
    proc = subprocess.run(["skopeo", "--insecure-policy", "copy", *skopeo_args, "--dest-oci-accept-uncompressed-layers",
                           "docker://" + image, f"oci:{dest}:pulled"], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise ImagePullError(f"pulling {image}: skopeo exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    blobs = os.path.join(dest, "blobs")

    def blob(digest):
        algorithm, _sep, value = digest.partition(":")
        return os.path.join(blobs, algorithm, value)
    with open(os.path.join(dest, "index.json"), encoding="utf-8") as fh:
        digest = json.load(fh)["manifests"][0]["digest"]
    with open(blob(digest), encoding="utf-8") as fh:
        manifest = json.load(fh)
    with open(blob(manifest["config"]["digest"]), encoding="utf-8") as fh:
        config = json.load(fh)
    return Pulled(digest, manifest, config, [blob(layer["digest"]) for layer in manifest["layers"]])


def _clean(name: str) -> str:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImagePullError(f"layer entry {name!r} leaves the root filesystem")
    return "/".join(parts)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def unpack(layer_paths, dest: str) -> str:
    """Apply the layers (tar, or gzip/bzip2/xz-compressed tar) in order onto `dest`, whiteouts honoured. Returns dest."""
    os.makedirs(dest, exist_ok=True)
    for path in layer_paths:
        with tarfile.open(path, "r:*") as tf:
            members = tf.getmembers()
            # Whiteouts hide what the layers below put there, never this layer's own entries: apply them first.
            for member in members:
                name = _clean(member.name)
                parent, base = os.path.split(name)
                if base == OPAQUE:
                    directory = os.path.join(dest, parent)
                    if os.path.isdir(directory) and not os.path.islink(directory):
                        for entry in os.listdir(directory):
                            _remove(os.path.join(directory, entry))
                elif base.startswith(WHITEOUT):
                    _remove(os.path.join(dest, parent, base[len(WHITEOUT):]))
            for member in members:
                name = _clean(member.name)
                if not name or os.path.basename(name).startswith(WHITEOUT):
                    continue
                target = os.path.join(dest, name)
                # A file over a directory, a directory over a file, any entry over a symlink: the old entry goes (writing
                # through a symlink could land outside the root).
                if os.path.lexists(target) and not (member.isdir() and os.path.isdir(target) and not os.path.islink(target)):
                    _remove(target)
                member.name = name
                tf.extract(member, dest, filter="tar", numeric_owner=True)
    return dest


def _auth_key_host(key: str) -> str:
    """The registry host of a key of a docker config's `auths` (`https://host/v1/`, `host`, `host/path`)."""
    for scheme in ("https://", "http://"):
        if key.startswith(scheme):
            key = key[len(scheme):]
    return key.split("/", 1)[0]


def secret_auths(secret: dict, host: str) -> list:
    """The `auths` entries of a pull Secret that name `host` (each a mapping with `auth` or `username`/`password`)."""
    data = secret.get("data") or {}
    try:
        if ".dockerconfigjson" in data:
            auths = json.loads(base64.b64decode(data[".dockerconfigjson"])).get("auths") or {}
        elif ".dockercfg" in data:
            auths = json.loads(base64.b64decode(data[".dockercfg"]))
        else:
            return []
    except ValueError:
        return []
    return [entry for key, entry in auths.items() if _auth_key_host(key) == host and isinstance(entry, dict)]


class ImageStore:
    """The node's images: registries it knows, and the unpacked root filesystems by manifest digest."""

    def __init__(self, directory: str | None = None):
        self.directory = directory
        self.registries = {}   # host -> RegistryAccess
        self._resolved = {}    # image reference -> manifest digest of its last pull
        self._lock = threading.Lock()
        self._image_locks = {}

    def knows(self, image: str) -> bool:
        return registry_host(image) in self.registries

    def _candidates(self, host: str, secrets) -> list:
        """Auth files to try, in the kubelet's order: the pull secrets' entries, the node's credentials; None: anonymous."""
        entries = [entry for secret in secrets for entry in secret_auths(secret, host)]
        access = self.registries[host]
        if access.username is not None:
            entries.append({"username": access.username, "password": access.password or ""})
        out = []
        for entry in entries:
            auth = entry.get("auth") or base64.b64encode(f"{entry.get('username', '')}:{entry.get('password', '')}".encode()).decode()
            out.append({"auths": {host: {"auth": auth}}})
        return out or [None]

    def _tls_args(self, host: str) -> list:
        access = self.registries[host]
        if access.ca_file:
            certs = os.path.join(self.directory, "certs", host)
            os.makedirs(certs, exist_ok=True)
            shutil.copyfile(access.ca_file, os.path.join(certs, "ca.crt"))
            return ["--src-cert-dir", certs]
        return [] if access.tls_verify else ["--src-tls-verify=false"]

    def get(self, image: str, policy: str = "IfNotPresent", secrets=()) -> Image:
        """The unpacked image, pulled per `policy`. `secrets`: the pod's pull Secrets (API objects). Raises
        ImagePullError (the message never holds a credential)."""
        host = registry_host(image)
        if host not in self.registries:
            raise ImagePullError(f"{image}: registry {host} is not one the test bed's node knows")
        with self._lock:
            lock = self._image_locks.setdefault(image, threading.Lock())
        with lock:
            digest = self._resolved.get(image)
            if digest and policy != "Always" and os.path.isdir(self._rootfs(digest)):
                return self._image(image, digest)
            if policy == "Never":
                raise ImagePullError(f'Container image "{image}" is not present with pull policy of Never')
            digest = self._pull(image, host, secrets)
            self._resolved[image] = digest
            return self._image(image, digest)

    def _rootfs(self, digest: str) -> str:
        return os.path.join(self.directory, "rootfs", digest.replace(":", "-"))

    def _image(self, image: str, digest: str) -> Image:
        with open(self._rootfs(digest) + ".json", encoding="utf-8") as fh:
            config = json.load(fh).get("config") or {}
        return Image(digest, self._rootfs(digest), config, f"{_repository(image)}@{digest}")

    def _pull(self, image: str, host: str, secrets) -> str:
        os.makedirs(os.path.join(self.directory, "rootfs"), exist_ok=True)
        work = tempfile.mkdtemp(prefix="pull-", dir=self.directory)
        try:
            error = None
            tls = self._tls_args(host)  # the same for every credential tried (the CA copied once)
            for i, auth in enumerate(self._candidates(host, secrets)):
                args = list(tls)
                if auth is not None:
                    authfile = os.path.join(work, f"auth-{i}.json")
                    with open(os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as fh:
                        json.dump(auth, fh)
                    args += ["--src-authfile", authfile]
                try:
                    pulled = pull(image, os.path.join(work, f"layout-{i}"), args)
                    break
                except ImagePullError as exc:
                    error = exc
            else:
                raise error
            rootfs = self._rootfs(pulled.digest)
            if not os.path.isdir(rootfs):  # one root per digest: another reference to the same image reuses it
                staging = unpack(pulled.layers, os.path.join(work, "rootfs"))
                with open(rootfs + ".json", "w", encoding="utf-8") as fh:
                    json.dump(pulled.config, fh)
                try:
                    os.rename(staging, rootfs)
                except OSError:
                    if not os.path.isdir(rootfs):  # not a reference to the same digest unpacked meanwhile
                        raise
            return pulled.digest
        except (OSError, tarfile.TarError, ValueError, KeyError) as exc:
            raise ImagePullError(f"unpacking {image}: {exc}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
