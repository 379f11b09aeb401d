"""Process mode's images (tests/testbed/images.py, pod_sandbox.py): layers unpacked with OCI whiteouts, paths resolved
inside an image's root, the kubelet's command/args/Env rules over an image config, pull credentials as the kubelet picks
them. Pure parts; the pull itself runs in tests/integration/test_process_pods.py."""
import base64
import io
import json
import os
import tarfile

import pytest

from tests.testbed import images, pod_process, pod_sandbox


def _layer(path, entries):
    """A tar layer at `path`: entries are (name, content) for a file, (name, None) for a directory, (name, "->target")
    for a symlink."""
    with tarfile.open(path, "w") as tf:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            elif content.startswith("->"):
                info.type, info.linkname = tarfile.SYMTYPE, content[2:]
                tf.addfile(info)
            else:
                data = content.encode()
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return str(path)


def _tree(root):
    out = {}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(base, name)
            rel = os.path.relpath(full, root)
            out[rel] = "->" + os.readlink(full) if os.path.islink(full) else (None if os.path.isdir(full) else open(full).read())
    return out


def test_layers_apply_in_order_with_whiteouts_and_opaque_directories(tmp_path):
    base = _layer(tmp_path / "0.tar", [("etc", None), ("etc/a", "a0"), ("etc/b", "b0"), ("models", None), ("models/x", "x0"),
                                       ("models/sub", None), ("models/sub/y", "y0"), ("bin", None), ("bin/sh", "->busybox")])
    top = _layer(tmp_path / "1.tar", [("etc/.wh.a", ""), ("models/new", "n1"), ("models/.wh..wh..opq", ""),
                                      ("bin/sh", "real sh"), ("./etc/b", "b1")])
    root = images.unpack([base, top], str(tmp_path / "root"))
    # .wh.a removes a; the opaque marker empties models/ of the lower layer, not of its own layer's new entry;
    # a file replaces a symlink (never written through it); a later file wins
    assert _tree(root) == {"etc": None, "etc/b": "b1", "models": None, "models/new": "n1", "bin": None, "bin/sh": "real sh"}


def test_an_entry_leaving_the_root_is_refused(tmp_path):
    bad = _layer(tmp_path / "bad.tar", [("../escape", "x")])
    with pytest.raises(images.ImagePullError, match="leaves the root"):
        images.unpack([bad], str(tmp_path / "root"))
    assert not (tmp_path / "escape").exists()


def test_paths_resolve_inside_the_image_root(tmp_path):
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    os.symlink("/run", root / "var" / "run")          # absolute: the image's /run, not the host's
    os.symlink("../../../..", root / "run" / "up")     # .. stops at the root
    assert pod_sandbox.resolve_in_root(str(root), "/var/run/secrets/token") == "/run/secrets/token"
    assert pod_sandbox.resolve_in_root(str(root), "/run/up/etc/hosts") == "/etc/hosts"
    assert pod_sandbox.resolve_in_root(str(root), "/mnt/models") == "/mnt/models"


def test_command_args_and_env_over_the_image_config_as_the_kubelet():
    config = {"Entrypoint": ["/entry"], "Cmd": ["--default"], "Env": ["PATH=/bin", "HOME=/home/app"], "WorkingDir": "/w"}
    argv = pod_sandbox.container_argv
    assert argv({"name": "c"}, {}, config) == ["/entry", "--default"]
    assert argv({"name": "c", "args": ["x"]}, {}, config) == ["/entry", "x"]
    assert argv({"name": "c", "command": ["sh"]}, {}, config) == ["sh"]                   # command drops the Cmd
    assert argv({"name": "c", "command": ["sh"], "args": ["-c", "$(A)"]}, {"A": "1"}, config) == ["sh", "-c", "1"]
    # KServe's Modelcar sidecar: args only, no Entrypoint; the kubelet's expansion gives sh its `$$`
    assert argv({"name": "c", "args": ["sh", "-c", "ln -sf /proc/$$$$/root/models /mnt/models"]}, {}, {}) == \
        ["sh", "-c", "ln -sf /proc/$$/root/models /mnt/models"]
    with pytest.raises(pod_sandbox.PodConfigError):
        argv({"name": "c"}, {}, {})
    pod = {"metadata": {"name": "p"}}
    assert pod_sandbox.process_env(pod, {"A": "1"}, config) == {"PATH": "/bin", "HOME": "/home/app", "HOSTNAME": "p", "A": "1"}
    assert pod_sandbox.process_env(pod, {}, {"Env": []})["HOME"] == "/root"


def test_pull_credentials_in_the_kubelets_order_and_pull_policy_defaults(tmp_path):
    host = "127.0.0.1:5000"

    def secret(auths, key=".dockerconfigjson"):
        data = {"auths": auths} if key == ".dockerconfigjson" else auths
        return {"data": {key: base64.b64encode(json.dumps(data).encode()).decode()}}
    store = images.ImageStore(str(tmp_path))
    store.registries[host] = images.RegistryAccess(tls_verify=False, username="node", password="node-pw")
    secrets = [secret({"other:1": {"auth": "eA=="}, "https://%s/v1/" % host: {"auth": "cG9kOnB3"}}),
               secret({host: {"username": "old", "password": "cfg"}}, key=".dockercfg")]
    tried = [c["auths"][host]["auth"] for c in store._candidates(host, secrets)]  # pylint: disable=protected-access
    assert [base64.b64decode(a).decode() for a in tried] == ["pod:pw", "old:cfg", "node:node-pw"]
    store.registries[host] = images.RegistryAccess()
    assert store._candidates(host, []) == [None]  # pylint: disable=protected-access
    assert images.registry_host(host + "/models/x@sha256:0") == host and images.registry_host("testbed/python") is None
    assert store.knows(host + "/m:v1") and not store.knows("docker.io/library/busybox")
    policy = pod_process._pull_policy  # pylint: disable=protected-access
    assert [policy({"image": i}) for i in ("r:1/m", "r:1/m:latest", "r:1/m:v1", "r:1/m@sha256:0")] == \
        ["Always", "Always", "IfNotPresent", "IfNotPresent"]
    assert policy({"image": "r:1/m", "imagePullPolicy": "Never"}) == "Never"
