"""The modelcar_image module against Debian's docker-registry on loopback (integration tier: a real registry and skopeo, no
vLLM).

What is asserted comes from outside the module: `skopeo inspect --raw`, a `skopeo copy` pull-back whose files
are hashed and compared with the sources, the registry's own access log (uploads counted), the token server's
request log, and KServe's two Modelcar commands run with busybox in a chroot of the pulled-back rootfs.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

from tests.digests import sha256_file
from tests.testbed import images
from tests.testbed.registry import Registry, ensure_tools

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, ".build", "collections")
PYTHON = sys.executable
PASSWORD = "s3cret-Pa55"


# ------------------------------------------------------------------------------------------------------
# fixtures and helpers
# ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tools():
    ensure_tools()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("modelcar")


def _start(workdir, name, **kw):
    path = os.path.join(str(workdir), name)
    os.makedirs(path, exist_ok=True)
    return Registry(path, users={"alice": PASSWORD}, **kw).start()


@pytest.fixture(scope="module")
def registry(tools, workdir):
    reg = _start(workdir, "reg-plain")
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def model(workdir):
    """A small target + draft with nested dirs; big enough to need several read chunks per file."""
    base = os.path.join(str(workdir), "model")
    files = {
        "target/config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 256}',
        "target/tokenizer.json": b'{"model": {"type": "BPE"}}' * 100,
        "target/model-00001-of-00002.safetensors": os.urandom(3 * 1024 * 1024 + 17),
        "target/model-00002-of-00002.safetensors": os.urandom(1024 * 1024),
        "target/nested/deeper/generation_config.json": b"{}",
        "draft/config.json": b'{"architectures": ["LlamaForCausalLMEagle3"]}',
        "draft/model.safetensors": os.urandom(512 * 1024),
    }
    for rel, data in files.items():
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    return {"target": os.path.join(base, "target"), "draft": os.path.join(base, "draft"), "base": base}


def source_hashes(model):
    out = {}
    for kind in ("target", "draft"):
        for root, _dirs, files in os.walk(model[kind]):
            for f in files:
                full = os.path.join(root, f)
                out["models/%s/%s" % (kind, os.path.relpath(full, model[kind]))] = sha256_file(full)
    return out


def run_modules(tmp_path, calls, name="play"):
    """Run the module once per ``(args, check_mode)`` in one ansible-playbook; returns (results, combined output)."""
    tasks = []
    outs = []
    for i, (args, check) in enumerate(calls):
        out = tmp_path / ("%s-%d-result.json" % (name, i))
        outs.append(out)
        tasks.append({"name": "Build and push %d" % i, "alauda.spec_decoding.modelcar_image": args, "register": "r%d" % i,
                      "ignore_errors": True, "check_mode": bool(check)})
        tasks.append({"name": "Save result %d" % i, "ansible.builtin.copy": {"content": "{{ r%d | to_json }}" % i, "dest": str(out), "mode": "0600"},
                      "check_mode": False})
    play = [{"name": "modelcar", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    pb = tmp_path / (name + ".yml")
    pb.write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false")
    cmd = [os.path.join(os.path.dirname(PYTHON), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=" + PYTHON, str(pb)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    output = proc.stdout + proc.stderr
    for out in outs:
        assert out.exists(), output
    return [json.loads(out.read_text()) for out in outs], output


def run_module(tmp_path, args, check=False, name="play"):
    """Run the module once through ansible-playbook; returns (registered result, combined output)."""
    results, output = run_modules(tmp_path, [(args, check)], name)
    return results[0], output


def skopeo(*args, check=True):
    proc = subprocess.run(["skopeo", "--insecure-policy"] + list(args), capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def pull_back(reg, image, dest):
    """(manifest, layer blob paths) of `image` pulled from `reg` into an OCI layout at `dest` (the test bed's pull, which
    process-mode pods use too: tests/testbed/images.py)."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    pulled = images.pull("%s/%s" % (reg.host, image), dest,
                         reg.skopeo_tls("src") + (["--src-creds", "alice:" + PASSWORD] if reg.auth else []))
    return pulled.manifest, pulled.layers


def extract(layer_paths, dest):
    """The layers unpacked in order onto `dest` (OCI whiteouts honoured), as a process-mode pod's image is."""
    return images.unpack(layer_paths, dest)


def upload_count(reg, since):
    """Blob uploads committed, from the registry's own access log (PUT .../blobs/uploads/...digest=...)."""
    with open(reg.log_path, "r", encoding="utf-8", errors="replace") as fh:
        fh.seek(since)
        text = fh.read()
    return sum(1 for line in text.splitlines() if '"PUT /v2/' in line and "/blobs/uploads/" in line and "digest=sha256" in line)


def log_size(reg):
    return os.path.getsize(reg.log_path)


# ------------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------------
def test_push_pull_back_and_kserve_commands_in_chroot(registry, model, tmp_path):
    cache = str(tmp_path / "cache")
    args = {"target_dir": model["target"], "draft_dir": model["draft"], "image": registry.host + "/models/tiny:v1", "tls_verify": False,
            "cache_dir": cache, "model_name": "tiny-llama", "draft_name": "tiny-eagle3", "progress_log": str(tmp_path / "progress.log")}
    mark = log_size(registry)
    res, output = run_module(tmp_path, args, name="first")
    assert not res.get("failed"), output
    assert res["changed"] is True
    assert res["layers_pushed"] == 8 and res["layers_skipped"] == 0  # busybox base + 7 files
    assert upload_count(registry, mark) == 9  # 8 layers + the config blob
    assert res["storage_uri"] == "oci://%s/models/tiny@%s" % (registry.host, res["digest"])
    assert any("pushed" in line for line in open(str(tmp_path / "progress.log")).read().splitlines())

    raw = skopeo("inspect", "--raw", "--tls-verify=false", "docker://%s/models/tiny:v1" % registry.host).stdout
    assert "sha256:" + hashlib.sha256(raw.encode()).hexdigest() == res["digest"]
    manifest = json.loads(raw)
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert all(d["mediaType"] == "application/vnd.oci.image.layer.v1.tar" for d in manifest["layers"])
    titles = [d["annotations"]["org.opencontainers.image.title"] for d in manifest["layers"][1:]]
    assert sorted(titles) == sorted(source_hashes(model))
    assert manifest["annotations"]["io.alauda.spec-decoding.model-name"] == "tiny-llama"
    config = json.loads(skopeo("inspect", "--config", "--raw", "--tls-verify=false", "docker://%s/models/tiny:v1" % registry.host).stdout)
    assert not config["config"].get("Entrypoint") and not config["config"].get("Cmd")
    assert any(e.startswith("PATH=") for e in config["config"]["Env"])

    # Pull back and compare every file's sha256; check the tar entries are normalised.
    manifest2, layers = pull_back(registry, "models/tiny:v1", str(tmp_path / "pulled"))
    assert [d["digest"] for d in manifest2["layers"]] == [d["digest"] for d in manifest["layers"]]
    for lp in layers[1:]:
        with tarfile.open(lp) as tf:
            members = tf.getmembers()
            assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members)
            names = [m.name for m in members]
            parents = ["/".join(names[-1].split("/")[:i]) for i in range(1, names[-1].count("/") + 1)]
            assert names[0] == "models" and names[-1].startswith("models/") and all(n in names for n in parents)
    rootfs = extract(layers, str(tmp_path / "rootfs"))
    expected = source_hashes(model)
    got = {}
    for root, _dirs, files in os.walk(os.path.join(rootfs, "models")):
        for f in files:
            full = os.path.join(root, f)
            got[os.path.relpath(full, rootfs)] = sha256_file(full)
    assert got == expected

    if os.geteuid() != 0:
        pytest.fail("the KServe commands run in a chroot, which needs root")
    # KServe's Modelcar sidecar command: it links /mnt/models to its own root's /models and sleeps.
    sidecar = subprocess.Popen(["chroot", rootfs, "/bin/sh", "-c", "ln -sf /proc/$$/root/models /mnt/models && sleep infinity"])
    try:
        link = os.path.join(rootfs, "mnt", "models")
        deadline = time.monotonic() + 10
        while not os.path.islink(link) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.readlink(link) == "/proc/%d/root/models" % sidecar.pid
        time.sleep(0.2)
        assert sidecar.poll() is None, "sleep infinity exited"
        assert sorted(os.listdir("/proc/%d/root/models" % sidecar.pid)) == ["draft", "target"]
    finally:
        sidecar.kill()
        sidecar.wait(5)
    # KServe's modelcar-init check, and the same check on the base layer alone (must fail: proves it can).
    check = '[ -d /models ] && [ "$(ls -A /models)" ]'
    assert subprocess.run(["chroot", rootfs, "/bin/sh", "-c", check], check=False).returncode == 0
    bare = extract(layers[:1], str(tmp_path / "bare"))
    assert subprocess.run(["chroot", bare, "/bin/sh", "-c", check], check=False).returncode != 0

    # Unchanged rerun: nothing uploaded, same digest, changed false.
    mark = log_size(registry)
    # A cold stat cache (another machine, cache wiped) hashes locally and still uploads nothing.
    (again, cold), output = run_modules(tmp_path, [(args, False), (dict(args, cache_dir=str(tmp_path / "cold-cache")), False)], name="again")
    assert again["changed"] is False and again["bytes_pushed"] == 0 and again["digest"] == res["digest"], output
    assert again["bytes_hashed"] == 0
    assert cold["changed"] is False and cold["bytes_pushed"] == 0 and cold["digest"] == res["digest"], output
    assert cold["bytes_hashed"] > 4 * 1024 * 1024
    assert upload_count(registry, mark) == 0

    # Check mode after changing one file: reports one layer, uploads nothing.
    path = os.path.join(model["target"], "config.json")
    with open(path, "ab") as fh:
        fh.write(b" ")
    checked, output = run_module(tmp_path, args, check=True, name="check")
    assert checked["changed"] is True and checked["layers_pushed"] == 1, output
    assert upload_count(registry, mark) == 0
    assert skopeo("inspect", "--raw", "--tls-verify=false", "docker://%s/models/tiny:v1" % registry.host).stdout == raw

    # Changing one file uploads exactly one layer blob (plus the small config blob).
    mark = log_size(registry)
    changed, output = run_module(tmp_path, args, name="changed")
    assert changed["changed"] is True and changed["layers_pushed"] == 1 and changed["layers_skipped"] == 7, output
    assert changed["bytes_pushed"] < 4096
    assert upload_count(registry, mark) == 2
    assert changed["digest"] != res["digest"]


def test_archive_then_push_later_gives_the_same_digest(registry, model, tmp_path):
    cache = str(tmp_path / "cache")
    archive = str(tmp_path / "carry.tar")
    layout = str(tmp_path / "layout")
    (built, pushed, direct, _layout), output = run_modules(tmp_path, [
        ({"target_dir": model["target"], "draft_dir": model["draft"], "archive": archive, "cache_dir": cache}, False),
        ({"from_archive": archive, "image": registry.host + "/models/carried:v1", "tls_verify": False, "cache_dir": cache}, False),
        ({"target_dir": model["target"], "draft_dir": model["draft"], "image": registry.host + "/models/direct:v1", "tls_verify": False,
          "cache_dir": cache}, False),
        ({"target_dir": model["target"], "archive": layout, "cache_dir": cache}, False),
    ], name="archive")
    assert built["changed"] is True and built["archive_bytes_written"] > 0, output
    raw = skopeo("inspect", "--raw", "oci-archive:%s:latest" % archive).stdout
    assert "sha256:" + hashlib.sha256(raw.encode()).hexdigest() == built["digest"]
    assert pushed["changed"] is True and pushed["digest"] == built["digest"], output
    assert direct["digest"] == built["digest"], output
    raw = skopeo("inspect", "--raw", "--tls-verify=false", "docker://%s/models/carried:v1" % registry.host).stdout
    assert "sha256:" + hashlib.sha256(raw.encode()).hexdigest() == built["digest"]
    # An OCI layout directory written by the module is pushable by skopeo as is.
    skopeo("copy", "--preserve-digests", "--dest-tls-verify=false", "oci:%s:latest" % layout, "docker://%s/models/layout:v1" % registry.host)
    _manifest, layers = pull_back(registry, "models/layout:v1", str(tmp_path / "pulled-layout"))
    rootfs = extract(layers, str(tmp_path / "rootfs-layout"))
    assert sha256_file(os.path.join(rootfs, "models/target/model-00001-of-00002.safetensors")) == \
        sha256_file(os.path.join(model["target"], "model-00001-of-00002.safetensors"))


@pytest.mark.parametrize("auth", ["htpasswd", "token"])
def test_auth_push_and_wrong_password(tools, workdir, model, tmp_path, auth):
    reg = _start(workdir, "reg-" + auth, auth=auth)
    try:
        args = {"target_dir": model["draft"], "image": reg.host + "/models/secured:v1", "tls_verify": False, "username": "alice",
                "password": PASSWORD, "cache_dir": str(tmp_path / "cache")}
        res, output = run_module(tmp_path, args, name="ok")
        assert not res.get("failed") and res["changed"] is True, output
        raw = skopeo("inspect", "--raw", "--tls-verify=false", "--creds", "alice:" + PASSWORD, "docker://%s/models/secured:v1" % reg.host).stdout
        assert "sha256:" + hashlib.sha256(raw.encode()).hexdigest() == res["digest"]
        if auth == "token":
            granted = [r for r in reg.token_server.requests if r["user"] == "alice"]
            assert granted and "repository:models/secured:pull,push" in granted[0]["query"]["scope"]
        manifest, layers = pull_back(reg, "models/secured:v1", str(tmp_path / "pulled"))
        assert len(manifest["layers"]) == 3

        wrong = "WrongPass-%d" % os.getpid()
        anon = {k: v for k, v in args.items() if k not in ("username", "password")}
        (bad, anon_res), output = run_modules(tmp_path, [(dict(args, password=wrong), False), (anon, False)], name="bad")
        assert bad.get("failed") is True
        assert "401" in bad["msg"] and "rejected" in bad["msg"] and "alice" in bad["msg"], bad["msg"]
        assert wrong not in output and wrong not in json.dumps(bad)
        assert PASSWORD not in output

        assert anon_res.get("failed") is True and ("requires credentials" in anon_res["msg"] or "401" in anon_res["msg"]), anon_res["msg"]
    finally:
        reg.stop()


def test_tls_needs_the_ca(tools, workdir, model, tmp_path):
    reg = _start(workdir, "reg-tls", tls=True)
    try:
        args = {"target_dir": model["draft"], "image": reg.host + "/models/tls:v1", "cache_dir": str(tmp_path / "cache")}
        (bad, res), output = run_modules(tmp_path, [(args, False), (dict(args, ca_file=reg.ca_file), False)], name="tls")
        assert bad.get("failed") is True and "ca_file" in bad["msg"], bad["msg"]
        assert res["changed"] is True and not res.get("failed"), output
        raw = skopeo("inspect", "--raw", *reg.skopeo_tls(""), "docker://%s/models/tls:v1" % reg.host).stdout
        assert "sha256:" + hashlib.sha256(raw.encode()).hexdigest() == res["digest"]
    finally:
        reg.stop()


def test_bad_input_and_unreachable_registry(registry, model, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not part of the model")
    escaping = tmp_path / "escaping"
    shutil.copytree(model["draft"], str(escaping))
    os.symlink(str(outside), str(escaping / "weights.bin"))
    cases = [
        ({"target_dir": str(tmp_path / "missing")}, "does not exist"),
        ({"target_dir": str(empty)}, "holds no files"),
        ({"target_dir": str(escaping)}, "outside the model directory"),
    ]
    calls = [(dict({"image": registry.host + "/models/bad:v1", "tls_verify": False}, **extra), False) for extra, _needle in cases]
    calls.append(({"target_dir": model["draft"], "image": "127.0.0.1:9/models/x:v1", "tls_verify": False, "retries": 1}, False))
    results, _output = run_modules(tmp_path, calls, name="bad")
    for (_extra, needle), res in zip(cases, results):
        assert res.get("failed") is True and needle in res["msg"] and res["msg"].startswith("target_dir"), res["msg"]
    # Nothing was pushed by the refused runs.
    assert skopeo("inspect", "--raw", "--tls-verify=false", "docker://%s/models/bad:v1" % registry.host, check=False).returncode != 0
    res = results[-1]
    assert res.get("failed") is True and "127.0.0.1:9" in res["msg"] and "reachable" in res["msg"], res["msg"]


PUSH_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, %(collections)r)
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_image as L
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import oci_blobs
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import modelcar_push
    from ansible_collections.alauda.spec_decoding.plugins.module_utils.artifacts import registry as R
    target, image, cache, progress = sys.argv[1:5]
    plan = L.build_plan(target)
    client = R.RegistryClient(R.ImageRef.parse(image), tls_verify=False)
    def report(done, total, rate, final):
        with open(progress, "a") as fh:
            fh.write("%%d %%d\\n" %% (done, total))
    print(modelcar_push.push_plan(plan, client, oci_blobs.DigestCache(cache), jobs=1, progress_cb=report, progress_interval=0.02))
""") % {"collections": COLLECTIONS}


def test_push_killed_midway_keeps_the_old_tag_and_rerun_completes(registry, model, tmp_path):
    image = registry.host + "/models/killed:v1"
    cache = str(tmp_path / "cache")
    old, output = run_module(tmp_path, {"target_dir": model["draft"], "image": image, "tls_verify": False, "cache_dir": cache}, name="old")
    assert old["changed"] is True, output
    big = tmp_path / "big"
    big.mkdir()
    for i in range(8):
        with open(str(big / ("shard-%d.safetensors" % i)), "wb") as fh:
            fh.write(os.urandom(1 << 20) * 16)  # 16 MiB each, 128 MiB in all
    script = tmp_path / "push.py"
    script.write_text(PUSH_SCRIPT)
    progress = tmp_path / "progress.txt"
    proc = subprocess.Popen([PYTHON, str(script), str(big), image, cache, str(progress)], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    killed_at = None
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.exists():
            lines = progress.read_text().split()
            if len(lines) >= 2 and int(lines[-2]) >= int(lines[-1]) * 0.4:
                os.killpg(proc.pid, signal.SIGKILL)
                killed_at = int(lines[-2])
                break
        time.sleep(0.005)
    proc.wait(10)
    assert killed_at is not None, "the push finished before it could be killed: %s" % proc.communicate()[0]
    # The tag still names the old, complete image, which pulls back fine.
    raw = skopeo("inspect", "--raw", "--tls-verify=false", "docker://" + image).stdout
    assert "sha256:" + hashlib.sha256(raw.encode()).hexdigest() == old["digest"]
    pull_back(registry, "models/killed:v1", str(tmp_path / "pulled-old"))
    # The rerun skips the shards that made it and completes.
    res, output = run_module(tmp_path, {"target_dir": str(big), "image": image, "tls_verify": False, "cache_dir": cache}, name="rerun")
    assert res["changed"] is True and res["layers_skipped"] >= 2 and res["layers_pushed"] <= 6, output
    _manifest, layers = pull_back(registry, "models/killed:v1", str(tmp_path / "pulled-new"))
    rootfs = extract(layers, str(tmp_path / "rootfs-new"))
    for i in range(8):
        name = "shard-%d.safetensors" % i
        assert sha256_file(os.path.join(rootfs, "models/target", name)) == sha256_file(str(big / name))
