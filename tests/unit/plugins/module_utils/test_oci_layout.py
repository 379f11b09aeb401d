"""Unit tests of the Modelcar image writer (no registry, no network)."""

import hashlib
import io
import json
import os
import shutil
import tarfile

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_image as L
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import oci_blobs
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import oci_layout
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_push
from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as R
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


@pytest.fixture()
def model(tmp_path):
    target = tmp_path / "target"
    draft = tmp_path / "draft"
    _write(str(target / "config.json"), b'{"architectures": ["LlamaForCausalLM"]}')
    _write(str(target / "model.safetensors"), os.urandom(70000))
    _write(str(target / "tok" / "tokenizer.json"), b"{}")
    _write(str(draft / "config.json"), b'{"architectures": ["LlamaForCausalLMEagle3"]}')
    busybox = tmp_path / "busybox"
    _write(str(busybox), b"\x7fELF fake busybox")
    os.chmod(str(busybox), 0o755)
    return {"target": str(target), "draft": str(draft), "busybox": str(busybox), "tmp": tmp_path}


def _plan(m, **kw):
    return L.build_plan(m["target"], m["draft"], busybox_path=m["busybox"], **kw)


def _layer_bytes(layer):
    return b"".join(bytes(c) for c in layer.chunks())


def test_one_layer_per_file_with_reproducible_tar_entries(model):
    plan = _plan(model)
    titles = [layer.annotations[oci_blobs.ANN_TITLE] for layer in plan.model_layers]
    assert titles == ["models/draft/config.json", "models/target/config.json", "models/target/model.safetensors",
                      "models/target/tok/tokenizer.json"]
    layer = plan.model_layers[3]
    data = _layer_bytes(layer)
    assert len(data) == layer.size
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        members = tf.getmembers()
        assert [m.name for m in members] == ["models", "models/target", "models/target/tok", "models/target/tok/tokenizer.json"]
        assert [m.isdir() for m in members] == [True, True, True, False]
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        assert members[-1].mode == 0o644 and members[0].mode == 0o755
        assert tf.extractfile(members[-1]).read() == b"{}"
    big = _layer_bytes(plan.model_layers[2])
    with tarfile.open(fileobj=io.BytesIO(big)) as tf:
        with open(os.path.join(model["target"], "model.safetensors"), "rb") as fh:
            assert tf.extractfile("models/target/model.safetensors").read() == fh.read()


def test_digests_do_not_depend_on_mtime_owner_or_inode(model, tmp_path):
    a = _plan(model)
    oci_blobs.resolve_digests(a, oci_blobs.DigestCache(enabled=False))
    copy = tmp_path / "copy"
    shutil.copytree(model["target"], str(copy / "target"))
    shutil.copytree(model["draft"], str(copy / "draft"))
    for root, _dirs, files in os.walk(str(copy)):
        for f in files:
            os.utime(os.path.join(root, f), (123456, 123456))
    b = L.build_plan(str(copy / "target"), str(copy / "draft"), busybox_path=model["busybox"])
    oci_blobs.resolve_digests(b, oci_blobs.DigestCache(enabled=False))
    assert [x.digest for x in a.layers] == [x.digest for x in b.layers]
    assert a.manifest_digest() == b.manifest_digest()
    # The digest is the sha256 of the exact tar stream.
    assert a.model_layers[0].digest == "sha256:" + hashlib.sha256(_layer_bytes(a.model_layers[0])).hexdigest()


def test_stat_cache_skips_reading_and_notices_changes(model, tmp_path):
    cache_dir = str(tmp_path / "cache")
    first = _plan(model)
    cache = oci_blobs.DigestCache(cache_dir)
    hashed = oci_blobs.resolve_digests(first, cache)
    cache.save()
    assert len(hashed) == len(first.layers)
    assert os.path.isfile(os.path.join(cache_dir, "layer-digests.json"))
    again = _plan(model)
    assert oci_blobs.resolve_digests(again, oci_blobs.DigestCache(cache_dir)) == []
    assert again.manifest_digest() == first.manifest_digest()
    # Same size, new content and mtime: the changed file alone is hashed again.
    path = os.path.join(model["target"], "config.json")
    with open(path, "rb") as fh:
        old = fh.read()
    _write(path, old.replace(b"Llama", b"LLaMa"))
    os.utime(path, ns=(os.stat(path).st_mtime_ns + 10 ** 9,) * 2)
    changed = _plan(model)
    rehashed = oci_blobs.resolve_digests(changed, oci_blobs.DigestCache(cache_dir))
    assert [x.annotations[oci_blobs.ANN_TITLE] for x in rehashed] == ["models/target/config.json"]
    assert changed.manifest_digest() != first.manifest_digest()


def test_image_config_meets_modelcar_contract(model):
    plan = _plan(model, labels={"a": "b"}, annotations={"io.x": "y"})
    oci_blobs.resolve_digests(plan, oci_blobs.DigestCache(enabled=False))
    config = json.loads(plan.config_source().data)
    assert "Entrypoint" not in config["config"] and "Cmd" not in config["config"]
    assert config["config"]["Env"][0].startswith("PATH=") and "/bin" in config["config"]["Env"][0]
    assert config["config"]["Labels"] == {"a": "b"}
    assert config["rootfs"]["diff_ids"] == [x.digest for x in plan.layers]
    manifest = json.loads(plan.manifest_bytes())
    assert manifest["mediaType"] == oci_blobs.MT_MANIFEST and manifest["annotations"] == {"io.x": "y"}
    assert all(d["mediaType"] == oci_blobs.MT_LAYER_TAR for d in manifest["layers"])
    base = tarfile.open(fileobj=io.BytesIO(_layer_bytes(plan.layers[0])))
    names = {m.name: m for m in base.getmembers()}
    for cmd in ("sh", "ln", "sleep", "mkdir", "ls", "[", "echo", "cat"):
        assert names["bin/" + cmd].issym() and names["bin/" + cmd].linkname == "busybox"
    assert names["bin/busybox"].mode == 0o755 and names["models"].isdir() and names["mnt"].isdir()


@pytest.mark.parametrize("case", ["missing", "empty", "file", "escape", "dangling"])
def test_bad_model_dirs_are_refused(model, tmp_path, case):
    target = model["target"]
    if case == "missing":
        target = str(tmp_path / "nope")
    elif case == "empty":
        target = str(tmp_path / "empty")
        os.makedirs(target)
    elif case == "file":
        target = os.path.join(model["target"], "config.json")
    elif case == "escape":
        _write(str(tmp_path / "outside" / "secret.txt"), b"secret")
        os.symlink(str(tmp_path / "outside" / "secret.txt"), os.path.join(target, "link.txt"))
    elif case == "dangling":
        os.symlink(str(tmp_path / "gone"), os.path.join(target, "link.txt"))
    with pytest.raises(ValidationError) as err:
        L.build_plan(target, busybox_path=model["busybox"])
    assert str(err.value).startswith("target_dir:")
    assert "Fix:" in str(err.value)


def test_symlinks_inside_are_followed_and_outside_only_on_request(model, tmp_path):
    os.symlink("config.json", os.path.join(model["target"], "alias.json"))
    plan = L.build_plan(model["target"], busybox_path=model["busybox"])
    assert "models/target/alias.json" in [x.annotations[oci_blobs.ANN_TITLE] for x in plan.model_layers]
    _write(str(tmp_path / "blobs" / "abc"), b"weights")
    os.symlink(str(tmp_path / "blobs" / "abc"), os.path.join(model["target"], "ext.bin"))
    plan = L.build_plan(model["target"], busybox_path=model["busybox"], follow_external_symlinks=True)
    layer = [x for x in plan.model_layers if x.annotations[oci_blobs.ANN_TITLE] == "models/target/ext.bin"][0]
    with tarfile.open(fileobj=io.BytesIO(_layer_bytes(layer))) as tf:
        assert tf.extractfile("models/target/ext.bin").read() == b"weights"


def test_max_layers_groups_the_smallest_files(model):
    for i in range(10):
        _write(os.path.join(model["target"], "extra%02d.txt" % i), b"x" * i)
    plan = _plan(model, max_layers=6)
    assert len(plan.layers) == 6
    grouped = [x for x in plan.model_layers if oci_blobs.ANN_FILES in x.annotations]
    assert len(grouped) == 1
    assert "models/target/model.safetensors" in [x.annotations[oci_blobs.ANN_TITLE] for x in plan.model_layers]
    with tarfile.open(fileobj=io.BytesIO(_layer_bytes(grouped[0]))) as tf:
        files = [m.name for m in tf.getmembers() if m.isfile()]
    assert files == grouped[0].annotations[oci_blobs.ANN_FILES].split(",")


def test_layout_dir_and_oci_archive_round_trip(model, tmp_path):
    plan = _plan(model)
    cache = oci_blobs.DigestCache(str(tmp_path / "cache"))
    out = str(tmp_path / "layout")
    assert oci_layout.write_archive(plan, out, "v1", cache) > 0
    assert oci_layout.write_archive(_plan(model), out, "v1", cache) == 0
    back = L.plan_from_layout(out + ":v1")
    assert back.manifest_digest() == plan.manifest_digest()
    for layer in back.layers:
        assert "sha256:" + hashlib.sha256(_layer_bytes(layer)).hexdigest() == layer.digest
    tar_path = str(tmp_path / "image.tar")
    assert oci_layout.write_archive(_plan(model), tar_path, "v1", cache) > 0
    assert oci_layout.write_archive(_plan(model), tar_path, "v1", cache) == 0
    from_tar = L.plan_from_layout(tar_path)
    assert from_tar.manifest_digest() == plan.manifest_digest()
    with tarfile.open(tar_path) as tf:
        assert json.loads(tf.extractfile("oci-layout").read()) == {"imageLayoutVersion": "1.0.0"}
    with pytest.raises(ValidationError):
        L.plan_from_layout(out + ":nope")


def test_base_from_layout_drops_entrypoint(model, tmp_path):
    base_plan = _plan(model)
    oci_blobs.resolve_digests(base_plan, oci_blobs.DigestCache(enabled=False))
    cfg = json.loads(base_plan.config_source().data)
    cfg["config"]["Entrypoint"] = ["/bin/sh"]
    base_plan._config = oci_blobs.BytesSource(oci_blobs.canonical_json(cfg), oci_blobs.MT_CONFIG)  # pylint: disable=protected-access
    base_dir = str(tmp_path / "base")
    oci_layout.write_archive(base_plan, base_dir, "b1")
    plan = L.build_plan(model["draft"], base=base_dir + ":b1")
    oci_blobs.resolve_digests(plan, oci_blobs.DigestCache(enabled=False))
    config = json.loads(plan.config_source().data)
    assert "Entrypoint" not in config["config"] and plan.warnings
    assert len(config["rootfs"]["diff_ids"]) == len(base_plan.layers) + 1


@pytest.mark.parametrize("value,expect", [
    ("127.0.0.1:5000/models/x:v1", ("127.0.0.1:5000", "models/x", "v1", None)),
    ("oci://registry.local/a/b/c", ("registry.local", "a/b/c", "latest", None)),
    ("localhost/m@sha256:" + "a" * 64, ("localhost", "m", None, "sha256:" + "a" * 64)),
])
def test_image_ref_parse(value, expect):
    ref = R.ImageRef.parse(value)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == expect


@pytest.mark.parametrize("value", ["models/x:v1", "", "127.0.0.1:5000/Models:v1", "127.0.0.1:5000/m:bad tag"])
def test_image_ref_rejects(value):
    with pytest.raises(ValidationError) as err:
        R.ImageRef.parse(value)
    assert str(err.value).startswith("image:")


def test_auth_file_and_challenge(tmp_path):
    import base64
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"auths": {"reg.local:5000": {"auth": base64.b64encode(b"bob:pa:ss").decode()}}}))
    assert R.read_auth_file(str(path), "reg.local:5000") == ("bob", "pa:ss")
    with pytest.raises(ValidationError) as err:
        R.read_auth_file(str(path), "other:1")
    assert "reg.local:5000" in str(err.value) and "pa:ss" not in str(err.value)
    scheme, params = R._parse_challenge('Bearer realm="https://h/token",service="reg",scope="repository:a/b:pull,push"')  # pylint: disable=protected-access
    assert scheme == "bearer" and params == {"realm": "https://h/token", "service": "reg", "scope": "repository:a/b:pull,push"}


def test_unreachable_registry_is_a_clear_error(model):
    plan = _plan(model)
    ref = R.ImageRef.parse("127.0.0.1:9/models/x:v1")  # discard port: nothing listens there
    client = R.RegistryClient(ref, tls_verify=False, retries=1, backoff=0.01)
    with pytest.raises(R.RegistryError) as err:
        modelcar_push.push_plan(plan, client, oci_blobs.DigestCache(enabled=False))
    assert "127.0.0.1:9" in str(err.value) and "reachable" in str(err.value)
