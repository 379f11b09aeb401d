"""Faults and races (issue 10): SIGKILL a Modelcar push, a PVC sync and a deploy at random points, restart the
API server during a deploy, and race deploy against rollback on one InferenceService.

Every kill point comes from one seeded random generator: the seed is printed with the table of runs and
`ALAUDA_FAULT_SEED=<seed>` replays the same kill points (`ALAUDA_FAULT_RUNS=<n>` sets the number of kills per
target; a run that finishes before its kill point is repeated, up to twice as many runs). After each kill the
state on disk / in the registry / on the API server is checked *at the kill moment* (never a partial thing that
claims to be complete), then a rerun must converge to the complete, verified state.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests import stager
from tests.ansible_run import REPO, run_playbook
from tests.digests import sha256_file
from tests.testbed.registry import Registry, ensure_tools

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
MODELCAR_MODULE = os.path.join(REPO, "plugins", "modules", "modelcar_image.py")
COLLECTIONS = os.path.join(REPO, ".build", "collections")
MANIFEST = ".spec-decoding-manifest.json"
SYNC_INTERNAL = (".spec-decoding-manifest.json", ".spec-decoding-journal.json", ".spec-decoding-tmp")
MIB = 1 << 20
RUNS = int(os.environ.get("ALAUDA_FAULT_RUNS", "0") or 0)
SEED = int(os.environ.get("ALAUDA_FAULT_SEED") or random.SystemRandom().randrange(1, 2 ** 31))
# Words that name a connection problem in the messages of kubernetes.core, the kubernetes client and urllib3.
CONNECTION_WORDS = ("connection refused", "max retries exceeded", "failed to establish a new connection", "connection reset",
                    "remote end closed", "connection aborted", "unreachable", "timed out", "eof occurred", "service unavailable")


# ------------------------------------------------------------------------------------------------------
# seeded randomness and the table of runs
# ------------------------------------------------------------------------------------------------------
class RunTable:
    """Rows of (target, kill point, state at the kill, rerun result); printed at the end of the module."""

    def __init__(self):
        self.rows = []
        self.started = time.monotonic()

    def add(self, target, kill_point, at_kill, rerun):
        self.rows.append((target, kill_point, at_kill, rerun))

    def kills(self, prefix=""):
        return sum(1 for row in self.rows if row[0].startswith(prefix) and row[1].startswith(("SIGKILL", "restart")))

    def render(self):
        widths = [max(len(str(r[i])) for r in self.rows + [("target", "kill point", "state at kill", "rerun")]) for i in range(4)]
        line = "  ".join("%%-%ds" % w for w in widths)
        out = ["fault runs (seed %d; replay with ALAUDA_FAULT_SEED=%d): %d runs, %d kills/restarts, %.0f s" % (
            SEED, SEED, len(self.rows), self.kills(), time.monotonic() - self.started),
            line % ("target", "kill point", "state at kill", "rerun")]
        out += [line % tuple(str(c) for c in row) for row in self.rows]
        return "\n".join(out)


_TABLE = RunTable()


@pytest.fixture
def table(capsys):
    """The module's table of runs; printed (past pytest's capture) after each test, with everything so far."""
    before = len(_TABLE.rows)
    print("fault seed %d (replay: ALAUDA_FAULT_SEED=%d)" % (SEED, SEED))  # shown with the failure report
    yield _TABLE
    if len(_TABLE.rows) > before:
        with capsys.disabled():
            print("\n" + _TABLE.render())


def rng_for(name):
    """An independent, reproducible generator per test (same seed + test name = same kill points)."""
    return random.Random("%d:%s" % (SEED, name))


def runs(default):
    return RUNS or default


def kill_steps(table, target, want):
    """Steps of a fault loop until `want` runs of `target` ended in a kill (a run that finished before its kill
    point does not count), at most twice as many steps: a fixed number of runs let the kill floor below fail when
    a seed put several kill points past the end of their run."""
    want = runs(want)
    step = 0
    while table.kills(target + " #") < want and step < 2 * want:
        yield step
        step += 1


# ------------------------------------------------------------------------------------------------------
# killing exactly the processes a run started
# ------------------------------------------------------------------------------------------------------
def _children(pid):
    found = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task), encoding="ascii") as fh:
                found += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return found


def sigkill_tree(pid):
    """SIGSTOP `pid` and everything below it (so nothing forks or exits meanwhile), then SIGKILL them all."""
    stopped, todo = [], [pid]
    while todo:
        cur = todo.pop()
        if cur in stopped:
            continue
        try:
            os.kill(cur, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        stopped.append(cur)
        todo += _children(cur)
    for cur in stopped:
        try:
            os.kill(cur, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(stopped)


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def find_child(marker, timeout=60.0):
    """The pid of this test process's child whose command line contains `marker` (a per-run path)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _children(os.getpid()):
            if marker in _cmdline(pid):
                return pid
        time.sleep(0.01)
    raise AssertionError("no child process with %r in its command line appeared within %d s" % (marker, timeout))


def written_bytes(pid):
    """Bytes the process wrote so far (/proc/<pid>/io wchar), or None once it is gone."""
    try:
        with open("/proc/%d/io" % pid, encoding="ascii") as fh:
            for row in fh:
                if row.startswith("wchar:"):
                    return int(row.split()[1])
    except OSError:
        return None
    return None


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def files_under(root, skip=()):
    """{relpath: sha256} of regular files under `root`; names starting with one of `skip` (at any depth) left out."""
    out = {}
    skip = tuple(skip)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (skip and d.startswith(skip)))
        for fname in filenames:
            if skip and fname.startswith(skip):
                continue
            full = os.path.join(dirpath, fname)
            out[os.path.relpath(full, root).replace(os.sep, "/")] = sha256_file(full)
    return out


def write_random_tree(root, rng, spec):
    """Write `spec` ({relpath: size}) with seeded random bytes; returns {relpath: sha256}."""
    hashes = {}
    for rel, size in spec.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = rng.randbytes(size)
        with open(path, "wb") as fh:
            fh.write(data)
        hashes[rel] = sha256_bytes(data)
    return hashes


# ------------------------------------------------------------------------------------------------------
# PVC sync (artifact_sync CLI)
# ------------------------------------------------------------------------------------------------------
def _sync_manifest_claims(dest):
    """None when `dest` has no manifest; else the problems of the tree it claims complete ([] = it tells the truth)."""
    path = os.path.join(dest, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)  # written atomically: a torn manifest would fail to parse here
    claimed = {rel: entry["sha256"] for rel, entry in doc["files"].items()}
    actual = files_under(dest, skip=SYNC_INTERNAL)
    problems = ["%s: on disk %s, manifest %s" % (rel, actual.get(rel), sha) for rel, sha in sorted(claimed.items()) if actual.get(rel) != sha]
    problems += ["%s on disk but not in the manifest" % rel for rel in sorted(set(actual) - set(claimed))]
    return problems


def _mutate_source(src, rng, step):
    """Change the source between runs like a new model revision: rewrite, resize, add and remove files."""
    files = sorted(files_under(src))
    for rel in rng.sample(files, k=min(len(files), rng.randint(1, 3))):
        size = os.path.getsize(os.path.join(src, rel))
        write_random_tree(src, rng, {rel: max(1, size + rng.choice((0, 0, 4096, -4096)))})
    if step % 3 == 1:
        write_random_tree(src, rng, {"extra/added-%d.bin" % step: rng.randint(1, 2 * MIB)})
    elif step % 3 == 2:
        added = [rel for rel in files if rel.startswith("extra/")]
        if added:
            os.unlink(os.path.join(src, added[0]))
    return files_under(src)


def test_pvc_sync_killed_at_random_byte_counts_converges(tmp_path, table):
    rng = rng_for("pvc_sync")
    src, dest = str(tmp_path / "src"), str(tmp_path / "pvc" / "Meta-Llama-3.1-8B-Instruct")
    write_random_tree(src, rng, {
        "config.json": 700, "tokenizer.json": 300 * 1024, "generation_config.json": 120,
        "model-00001-of-00003.safetensors": 5 * MIB, "model-00002-of-00003.safetensors": 4 * MIB + 123,
        "model-00003-of-00003.safetensors": 3 * MIB, "original/params.json": 200, "original/consolidated.00.pth": 2 * MIB + 7,
    })
    base = stager.command("--quiet", "--source", src, "--dest", dest, "--name", "meta-llama/Llama-3.1-8B-Instruct")
    for step in kill_steps(table, "pvc_sync", 12):
        want = _mutate_source(src, rng, step) if step else files_under(src)
        # Bytes this run has to write: files that are new or differ from what the destination holds now.
        have = files_under(dest, skip=SYNC_INTERNAL) if os.path.isdir(dest) else {}
        todo = sum(os.path.getsize(os.path.join(src, rel)) for rel, sha in want.items() if have.get(rel) != sha)
        # Up to a little past the data, so some kills land in the final fsync / manifest / cleanup phase.
        kill_at = rng.randint(0, todo + todo // 16 + 32768)
        workers = rng.choice((1, 2, 4))
        proc = subprocess.Popen(base + ["--workers", str(workers), "--max-rate", "24", "--buffer-size", str(256 * 1024)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        wrote = 0
        while proc.poll() is None:
            got = written_bytes(proc.pid)
            if got is not None:
                wrote = got
            if wrote >= kill_at:
                break
            time.sleep(0.002)
        finished = proc.poll() is not None
        if not finished:
            sigkill_tree(proc.pid)
        proc.communicate(timeout=30)
        # At the kill moment: a manifest, if any, describes exactly the files on disk.
        claims = _sync_manifest_claims(dest)
        assert not claims, "killed sync at %d bytes left a manifest that lies: %s" % (wrote, claims)
        at_kill = "no manifest" if claims is None else "manifest true"
        rerun = subprocess.run(base, capture_output=True, text=True, timeout=300, check=False)
        assert rerun.returncode == 0, "rerun after the kill at %d bytes failed:\n%s\n%s" % (wrote, rerun.stdout, rerun.stderr[-3000:])
        summary = json.loads(rerun.stdout.strip().splitlines()[-1])["spec_decoding_sync"]
        assert summary["ok"], rerun.stdout
        item = summary["items"][0]
        # Converged: the manifest exists, tells the truth, and every file is the source's, byte for byte.
        assert _sync_manifest_claims(dest) == []
        assert files_under(dest, skip=SYNC_INTERNAL) == want
        # ...and nothing of the killed runs is left behind (partial copies, journal, half-written temp files).
        assert [n for n in os.listdir(dest) if n.startswith(".spec-decoding")] == [MANIFEST], os.listdir(dest)
        point = "finished before kill (%d B)" % wrote if finished else "SIGKILL at %d/%d B written (%d workers)" % (wrote, todo, workers)
        table.add("pvc_sync #%d" % step, point, at_kill, "ok: copied %d, resumed %d B, skipped %d" % (
            item.get("copied_files", 0), item.get("resumed_bytes", 0), item.get("skipped_files", 0)))


# ------------------------------------------------------------------------------------------------------
# Modelcar build + push (the module run as a subprocess)
# ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    ensure_tools()
    reg = Registry(str(tmp_path_factory.mktemp("fault-registry"))).start()
    yield reg
    reg.stop()


def _registry_get(reg, path, accept=None):
    req = urllib.request.Request(reg.url + path, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=60) as resp:  # nosec - loopback test registry
        return resp.status, resp.read(), dict(resp.headers)


def _tag_state(reg, repo, tag):
    """(digest, manifest) the tag resolves to (skopeo inspect --raw), or (None, None) when there is no tag; asserts that
    every blob the manifest names exists in the registry with the size the manifest says."""
    proc = subprocess.run(["skopeo", "--insecure-policy", "inspect", "--raw", "--tls-verify=false", "docker://%s/%s:%s" % (reg.host, repo, tag)],
                          capture_output=True, timeout=120, check=False)
    if proc.returncode != 0:
        assert b"manifest unknown" in proc.stderr or b"not found" in proc.stderr.lower(), proc.stderr
        return None, None
    manifest = json.loads(proc.stdout)
    for desc in [manifest["config"]] + manifest["layers"]:
        req = urllib.request.Request("%s/v2/%s/blobs/%s" % (reg.url, repo, desc["digest"]), method="HEAD")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:  # nosec - loopback test registry
                size = int(resp.headers["Content-Length"])
        except urllib.error.HTTPError as exc:
            raise AssertionError("tag %s:%s names blob %s which the registry does not have (HTTP %d)" % (repo, tag, desc["digest"], exc.code)) from exc
        assert size == desc["size"], "blob %s is %d bytes, manifest says %d" % (desc["digest"], size, desc["size"])
    return "sha256:" + sha256_bytes(proc.stdout), manifest


def _image_files(reg, repo, manifest):
    """{path under /models: sha256} read back from the registry's layer blobs (digest checked on the way)."""
    out = {}
    for desc in manifest["layers"]:
        _status, blob, _headers = _registry_get(reg, "/v2/%s/blobs/%s" % (repo, desc["digest"]))
        assert "sha256:" + sha256_bytes(blob) == desc["digest"]
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.lstrip("./").startswith("models/"):
                    out[member.name.lstrip("./")[len("models/"):]] = sha256_bytes(tar.extractfile(member).read())
    return out


def _run_modelcar(args_path, env):
    return subprocess.Popen([sys.executable, MODELCAR_MODULE, args_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=REPO, start_new_session=True)


def test_modelcar_push_killed_at_random_times_converges(tmp_path, registry, table):
    rng = rng_for("modelcar")
    model = tmp_path / "model"
    spec = {"target/config.json": 900, "target/tokenizer.json": 200 * 1024, "target/model-00001-of-00002.safetensors": 6 * MIB,
            "target/model-00002-of-00002.safetensors": 5 * MIB + 99, "target/nested/generation_config.json": 64,
            "draft/config.json": 400, "draft/model.safetensors": 3 * MIB + 5}
    repo, tag = "models/fault-llama-eagle3", "v1"
    env = dict(os.environ, PYTHONPATH=COLLECTIONS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cache = str(tmp_path / "digest-cache")

    def args_file(name, progress):
        path = tmp_path / ("%s.json" % name)
        path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
            "target_dir": str(model / "target"), "draft_dir": str(model / "draft"), "image": "%s/%s:%s" % (registry.host, repo, tag),
            "tls_verify": False, "cache_dir": cache, "jobs": 2, "progress_log": str(progress), "model_name": "meta-llama/Llama-3.1-8B-Instruct"}}))
        return str(path)

    def complete_run(name):
        t0 = time.monotonic()
        proc = _run_modelcar(args_file(name, tmp_path / (name + ".progress")), env)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out.decode() + err.decode()
        return json.loads(out), time.monotonic() - t0

    hashes = write_random_tree(str(model), rng, spec)
    first, full_seconds = complete_run("initial")
    digest, manifest = _tag_state(registry, repo, tag)
    assert digest == first["digest"]
    assert _image_files(registry, repo, manifest) == hashes
    previous = digest
    window = {}  # cache state -> the kill window's length, once a run in that state finished before its kill point
    for step in kill_steps(table, "modelcar", 6):
        # A new revision of every weight file, so each run has a full upload to interrupt.
        hashes = dict(hashes, **write_random_tree(str(model), rng, {rel: size for rel, size in spec.items() if rel.endswith(".safetensors")}))
        if step % 2:
            cache_note = "warm cache"
        else:
            cache_note = "no cache"
            for name in os.listdir(cache) if os.path.isdir(cache) else ():
                os.unlink(os.path.join(cache, name))
        kill_after = rng.uniform(0.05, window.get(cache_note, full_seconds))
        progress = tmp_path / ("run-%d.progress" % step)
        started = time.monotonic()
        proc = _run_modelcar(args_file("run-%d" % step, progress), env)
        finished = False
        try:
            proc.wait(timeout=kill_after)
            finished = True
            # A run in this cache state ended before its kill point (a warm cache makes it shorter than the first, cold
            # run): the next kill points of this state fall inside such a run.
            window[cache_note] = max(0.1, time.monotonic() - started)
        except subprocess.TimeoutExpired:
            sigkill_tree(proc.pid)
        proc.communicate(timeout=30)
        # At the kill moment the tag names a complete image: the previous one, or the new one if the manifest was written.
        at_digest, at_manifest = _tag_state(registry, repo, tag)
        at_files = _image_files(registry, repo, at_manifest)
        assert at_digest == previous or at_files == hashes, "tag %s:%s names neither the previous image nor the new one" % (repo, tag)
        at_kill = "old tag intact" if at_digest == previous else "new tag complete"
        result, seconds = complete_run("rerun-%d" % step)
        digest, manifest = _tag_state(registry, repo, tag)
        assert digest == result["digest"] and result["storage_uri"].endswith("@" + digest)
        assert _image_files(registry, repo, manifest) == hashes, "the image's files differ from the source after the rerun"
        previous = digest
        point = "finished in < %.2f s" % kill_after if finished else "SIGKILL at %.2f s (%s)" % (kill_after, cache_note)
        table.add("modelcar #%d" % step, point, at_kill, "ok %.1f s: pushed %d, skipped %d layers" % (
            seconds, result["layers_pushed"], result["layers_skipped"]))


# ------------------------------------------------------------------------------------------------------
# deploy (ansible-playbook playbooks/deploy-eagle3.yml against the test bed)
# ------------------------------------------------------------------------------------------------------
DEPLOY_VARS = {
    "spec_decoding_verify": False, "spec_decoding_hosts": "localhost", "spec_decoding_target": "cluster",
    "spec_decoding_runtime": "aml-vllm-0.32.0", "spec_decoding_vllm_version": "0.32.0", "spec_decoding_dtype": "bfloat16",
    "spec_decoding_gpu_count": 0, "spec_decoding_wait_timeout": 120, "spec_decoding_artifact_mode": "pvc",
    "spec_decoding_artifacts": {"pvc_name": "model-store", "target_subdir": "Meta-Llama-3.1-8B-Instruct",
                                "draft_subdir": "EAGLE3-LLaMA3.1-Instruct-8B"},
}


def deploy_vars(namespace, name, tokens, max_len):
    return dict(DEPLOY_VARS, spec_decoding_namespace=namespace, spec_decoding_isvc_name=name,
                spec_decoding_speculative={"num_speculative_tokens": tokens}, spec_decoding_max_model_len=max_len)


def deploy(run_dir, extra_vars, kubeconfig, playbook="playbooks/deploy-eagle3.yml"):
    """run_playbook in its own directory (its extra-vars file and command line are unique to the run)."""
    os.makedirs(str(run_dir), exist_ok=True)
    return run_playbook(run_dir, playbook, extra_vars=extra_vars, kubeconfig=kubeconfig)


def get_isvc(controlplane, namespace, name):
    from tests.testbed.rest import ApiError  # pylint: disable=import-outside-toplevel
    api = controlplane.rest()
    try:
        return api.get("/apis/%s/%s/namespaces/%s/%s/%s" % (GROUP, VERSION, namespace, PLURAL, name))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    finally:
        api.close()


def predictor(isvc):
    return None if isvc is None else isvc["spec"]["predictor"]


def script_of(isvc_or_manifest):
    return isvc_or_manifest["spec"]["predictor"]["model"]["command"][2]


def ready_at_generation(isvc):
    status = isvc.get("status") or {}
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return bool(ready) and ready[0].get("status") == "True" and status.get("observedGeneration") == isvc["metadata"]["generation"]


def assert_deployed(controlplane, namespace, name, run, tokens, max_len):
    """The rerun succeeded and the object on the server is exactly the rendered one, Ready at its generation."""
    assert run.rc == 0, run.output
    rendered = run.result("Render the InferenceService")["manifest"]
    isvc = get_isvc(controlplane, namespace, name)
    assert predictor(isvc) == rendered["spec"]["predictor"], "the stored predictor differs from the rendered one"
    script = script_of(isvc)
    assert '"num_speculative_tokens":%d' % tokens in script and "--max-model-len %d" % max_len in script, script
    assert ready_at_generation(isvc), isvc.get("status")
    # The run's own record of Ready at the generation: its wait's result, which (when the killed run had already applied and
    # the apply changed nothing) is the unchanged object's status; either way the generation on the server.
    recorded = run.result("Wait for Ready at the new generation")
    assert recorded["ready"] is True and recorded["generation"] == isvc["metadata"]["generation"], recorded
    return rendered["spec"]["predictor"]


class Background:
    """run_playbook in a thread, so the test can find its ansible-playbook process (by the run's own directory) and kill it."""

    def __init__(self, run_dir, playbook, extra_vars, kubeconfig):
        os.makedirs(str(run_dir), exist_ok=True)
        self.marker = str(run_dir) + os.sep  # the extra-vars path inside it is on ansible-playbook's command line
        self.run = None
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._main, args=(run_dir, playbook, extra_vars, kubeconfig), daemon=True)
        self.thread.start()

    def _main(self, run_dir, playbook, extra_vars, kubeconfig):
        self.run = deploy(run_dir, extra_vars, kubeconfig, playbook=playbook)

    def pid(self):
        return find_child(self.marker)

    def join(self, timeout=600):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "ansible-playbook did not finish within %d s" % timeout
        return self.run


@pytest.mark.timeout(3600)  # many ansible-playbook runs: minutes on an idle machine, far more under load
def test_deploy_killed_at_random_times_converges(tmp_path, controlplane, kubeconfig, kserve, namespace, table):
    rng = rng_for("deploy")
    name = "fault-deploy"
    kserve.set_behaviour(namespace, name, ready_after=2.0)
    t0 = time.monotonic()
    first = deploy(tmp_path / "initial", deploy_vars(namespace, name, 3, 4096), kubeconfig)
    full_seconds = time.monotonic() - t0
    previous = assert_deployed(controlplane, namespace, name, first, 3, 4096)
    variants = [(4, 2048), (2, 8192), (5, 3072), (3, 4096), (4, 6144)]
    for step in kill_steps(table, "deploy", 2):
        tokens, max_len = variants[step % len(variants)]
        kill_after = rng.uniform(0.3, full_seconds)
        job = Background(tmp_path / ("run-%d" % step), "playbooks/deploy-eagle3.yml", deploy_vars(namespace, name, tokens, max_len), kubeconfig)
        pid = job.pid()
        job.thread.join(max(0.0, kill_after - (time.monotonic() - job.started)))
        finished = not job.thread.is_alive()
        if finished:
            # A run faster than the first one (warm caches): later kill points fall inside it.
            full_seconds = max(0.4, time.monotonic() - job.started)
        else:
            sigkill_tree(pid)
        killed = job.join()
        at_kill = predictor(get_isvc(controlplane, namespace, name))
        rerun = deploy(tmp_path / ("rerun-%d" % step), deploy_vars(namespace, name, tokens, max_len), kubeconfig)
        wanted = assert_deployed(controlplane, namespace, name, rerun, tokens, max_len)
        # At the kill moment the object was the old spec or the new one entire, never a mix.
        assert at_kill in (previous, wanted), "a killed deploy left a half-applied predictor: %s" % json.dumps(at_kill)[:2000]
        state = "old spec" if at_kill == previous else "new spec entire"
        point = "finished (rc %s) before %.1f s" % (killed.rc, kill_after) if finished else "SIGKILL at %.1f s of ~%.0f s" % (kill_after, full_seconds)
        table.add("deploy #%d" % step, point, state, "ok: tokens=%d max_len=%d Ready@gen %d (changed %d)" % (
            tokens, max_len, get_isvc(controlplane, namespace, name)["metadata"]["generation"], rerun.changed))
        previous = wanted


# ------------------------------------------------------------------------------------------------------
# API server restart during a deploy
# ------------------------------------------------------------------------------------------------------
class Watcher:
    """Reads the InferenceService every 50 ms while the API answers; records every distinct predictor seen."""

    def __init__(self, controlplane, namespace, name):
        self.cp, self.namespace, self.name = controlplane, namespace, name
        self.seen, self.first_seen, self.reads, self.failures = [], [], 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.stop.is_set():
            try:
                pred = predictor(get_isvc(self.cp, self.namespace, self.name))
                self.reads += 1
                if pred not in self.seen:
                    self.seen.append(pred)
                    self.first_seen.append(time.monotonic())
            except Exception:  # pylint: disable=broad-except  # the API server is down: keep trying
                self.failures += 1
            self.stop.wait(0.05)

    def finish(self):
        self.stop.set()
        self.thread.join(10)
        return self.seen


def failure_message(run):
    """The failing task's message (and the module's stderr/exception text, if any)."""
    failed = run.failed
    if not failed:
        return run.output[-2000:]
    res = failed[-1]
    return " ".join(str(res.get(k) or "") for k in ("msg", "exception", "module_stderr", "stderr"))


@pytest.mark.timeout(3600)  # many ansible-playbook runs: minutes on an idle machine, far more under load
def test_api_server_restart_during_deploy_fails_clearly_or_retries(tmp_path, controlplane, kubeconfig, kserve, namespace, table):
    rng = rng_for("apiserver")
    name = "fault-restart"
    kserve.set_behaviour(namespace, name, ready_after=4.0)
    t0 = time.monotonic()
    previous = assert_deployed(controlplane, namespace, name, deploy(tmp_path / "initial", deploy_vars(namespace, name, 3, 4096), kubeconfig),
                               3, 4096)
    full_seconds = time.monotonic() - t0
    for step, (tokens, max_len) in enumerate([(4, 2048), (2, 8192), (5, 3072)][:runs(2)]):
        restart_at = rng.uniform(0.2 * full_seconds, full_seconds)
        down = rng.uniform(0.5, 3.0)
        watcher = Watcher(controlplane, namespace, name)
        job = Background(tmp_path / ("run-%d" % step), "playbooks/deploy-eagle3.yml", deploy_vars(namespace, name, tokens, max_len), kubeconfig)
        job.thread.join(max(0.0, restart_at - (time.monotonic() - job.started)))
        finished_first = not job.thread.is_alive()
        restart_t0 = time.monotonic()
        unavailable = controlplane.restart(down_seconds=down)
        restart_t1 = time.monotonic()
        run = job.join()
        seen = watcher.finish()
        after = predictor(get_isvc(controlplane, namespace, name))
        applied = [t for t, pred in zip(watcher.first_seen, seen) if pred != previous]
        phase = ("apply before the restart, wait across it" if applied and applied[0] < restart_t0 else
                 "apply after the restart" if applied and applied[0] > restart_t1 else "apply not seen")
        if run.rc == 0:
            outcome = "deploy succeeded (%s)" % phase
            wanted = assert_deployed(controlplane, namespace, name, run, tokens, max_len)
        else:
            msg = failure_message(run)
            # A clear failure names the connection problem; a Python traceback is not a message.
            assert any(word in msg.lower() for word in CONNECTION_WORDS), "unclear failure during the API restart: %s" % msg[:3000]
            assert "Traceback (most recent call last)" not in msg, msg[:3000]
            outcome = "failed clearly (%s): %s; rerun ok" % (phase, next(w for w in CONNECTION_WORDS if w in msg.lower()))
            rerun = deploy(tmp_path / ("rerun-%d" % step), deploy_vars(namespace, name, tokens, max_len), kubeconfig)
            wanted = assert_deployed(controlplane, namespace, name, rerun, tokens, max_len)
        # Never half-applied: every predictor the watcher saw, and the one right after the run, is the old or the new one entire.
        for pred in seen + [after]:
            assert pred in (previous, wanted), "half-applied predictor seen during the restart: %s" % json.dumps(pred)[:2000]
        table.add("apiserver #%d" % step, "restart at %.1f s, down %.1f s (API out %.1f s)%s" % (
            restart_at, down, unavailable, " after the run ended" if finished_first else ""),
            "%d distinct predictor(s) seen, %d reads" % (len(seen), watcher.reads), outcome)
        previous = wanted


# ------------------------------------------------------------------------------------------------------
# concurrency: deploy (server-side apply) racing rollback (JSON patch with `test` ops) on one InferenceService
# ------------------------------------------------------------------------------------------------------
def argv_without_flag(script):
    """The vLLM command line of a bash -c script as tokens, with --speculative-config and its value removed, and with
    them --per-request-spec-decode-metrics and its value (vLLM 0.32 refuses it without a speculative config, so the
    rollback's strip takes it too)."""
    tokens = shlex.split(script.replace("\\\n", " "))
    out, skip = [], False
    for tok in tokens:
        if skip:
            skip = False
            continue
        if tok in ("--speculative-config", "--per-request-spec-decode-metrics"):
            skip = True
            continue
        if tok.startswith(("--speculative-config=", "--per-request-spec-decode-metrics=")):
            continue
        out.append(tok)
    return out


def ssa(controlplane, manifest):
    """Create/update the object with server-side apply under the deploy's own field manager (what the deploy does)."""
    api = controlplane.rest()
    try:
        meta = manifest["metadata"]
        return api.request("PATCH", "/apis/%s/%s/namespaces/%s/%s/%s" % (GROUP, VERSION, meta["namespace"], PLURAL, meta["name"]), manifest,
                           query={"fieldManager": "alauda-spec-decoding"}, content_type="application/apply-patch+yaml")
    finally:
        api.close()


def wait_ready(controlplane, namespace, name, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        isvc = get_isvc(controlplane, namespace, name)
        if isvc and ready_at_generation(isvc):
            return isvc
        time.sleep(0.2)
    raise AssertionError("%s/%s not Ready at its generation within %d s" % (namespace, name, timeout))


ROLLBACK_BACKUP = "spec-decoding.alauda.io/previous-speculative-config"


@pytest.mark.timeout(3600)  # many ansible-playbook runs: minutes on an idle machine, far more under load
def test_deploy_and_rollback_racing_never_lose_an_update(tmp_path, controlplane, kubeconfig, kserve, namespace, table):
    """Serial orders and what each leaves (S0: tokens 3, max-model-len 4096; D: tokens 4, max-model-len 2048):
    deploy -> rollback: D without the flag, the backup annotation holds D's config (the rollback read fresh state);
    rollback -> deploy: the deploy's apply conflicts with the rollback's ownership of .spec.predictor.model.command
    and fails with that message (S0 without the flag stays), or it wins and D stands entire. Anything else, e.g. S0
    without the flag while the deploy reported success, is a lost update."""
    rng = rng_for("race")
    base = deploy(tmp_path / "base", deploy_vars(namespace, "race-base", 3, 4096), kubeconfig)
    assert base.rc == 0, base.output
    s0_manifest = base.result("Render the InferenceService")["manifest"]
    orders = []
    for rnd in range(runs(5)):
        name = "race-%d" % rnd
        kserve.set_behaviour(namespace, name, ready_after=0.3)
        manifest = json.loads(json.dumps(s0_manifest))
        manifest["metadata"]["name"] = name
        ssa(controlplane, manifest)
        s0 = wait_ready(controlplane, namespace, name)
        d_delay, r_delay = rng.uniform(0, 2.5), rng.uniform(0, 2.5)
        jobs, t0 = {}, time.monotonic()
        for kind, delay in sorted((("deploy", d_delay), ("rollback", r_delay)), key=lambda kv: kv[1]):
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            if kind == "deploy":
                jobs[kind] = Background(tmp_path / ("deploy-%d" % rnd), "playbooks/deploy-eagle3.yml",
                                        deploy_vars(namespace, name, 4, 2048), kubeconfig)
            else:
                jobs[kind] = Background(tmp_path / ("rollback-%d" % rnd), "playbooks/rollback.yml", {
                    "rollback_names": ["%s/%s" % (namespace, name)], "rollback_wait_timeout": 90, "rollback_wait_sleep": 1,
                    "rollback_verify": False}, kubeconfig)
        dep, rb = jobs["deploy"].join(), jobs["rollback"].join()
        final = get_isvc(controlplane, namespace, name)
        script = script_of(final)
        d_script = script_of(dep.result("Render the InferenceService")["manifest"])
        s0_script = script_of(s0)
        dep_msg = "" if dep.rc == 0 else failure_message(dep)
        rb_msg = "" if rb.rc == 0 else failure_message(rb)
        backup = json.loads((final["metadata"].get("annotations") or {}).get(ROLLBACK_BACKUP) or "null")
        if "--speculative-config" not in script and argv_without_flag(script) == argv_without_flag(d_script):
            order = "deploy -> rollback"
            assert dep.rc == 0 and rb.rc == 0, (dep_msg, rb_msg)
            # The rollback stripped D, not a stale read of S0: its backup holds D's config.
            assert backup and backup["config"]["num_speculative_tokens"] == 4, backup
            attempts = rb.result("Strip the speculative config")["attempts"]
            detail = "rollback attempts %d%s" % (attempts, " (retried on fresh state)" if attempts > 1 else "")
        elif "--speculative-config" not in script and argv_without_flag(script) == argv_without_flag(s0_script):
            order = "rollback -> deploy refused"
            assert rb.rc == 0, rb_msg
            # The deploy lost: it must say so (a conflict naming the field), never report success over a stripped S0.
            assert dep.rc != 0, "lost update: the deploy reported success but the object is the rolled-back S0:\n%s" % script
            assert "conflict" in dep_msg.lower() and "spec.predictor.model.command" in dep_msg, dep_msg[:3000]
            assert backup and backup["config"]["num_speculative_tokens"] == 3, backup
            detail = "deploy: %s" % dep_msg[dep_msg.lower().index("conflict"):][:90].strip()
        elif script == d_script:
            order = "rollback -> deploy applied" if rb.rc == 0 else "deploy wins, rollback refused"
            assert dep.rc == 0, dep_msg
            assert predictor(final) == dep.result("Render the InferenceService")["manifest"]["spec"]["predictor"]
            if rb.rc != 0:
                assert "changed between read and write" in rb_msg and "nothing was overwritten" in rb_msg, rb_msg[:3000]
            detail = "rollback rc %d" % rb.rc
        else:
            raise AssertionError("the final object matches no serial order of deploy and rollback (lost or mixed update):\n"
                                 "final: %s\nS0: %s\nD: %s\ndeploy rc %d %s\nrollback rc %d %s" % (
                                     script, s0_script, d_script, dep.rc, dep_msg[:1000], rb.rc, rb_msg[:1000]))
        orders.append(order)
        table.add("race #%d" % rnd, "deploy +%.1f s, rollback +%.1f s" % (d_delay, r_delay), order, detail)
    print("race outcomes: %s" % {o: orders.count(o) for o in sorted(set(orders))})


def test_at_least_20_kill_runs_in_all(table):
    """The issue's floor: at least 20 SIGKILL runs across Modelcar push, PVC sync and deploy (when all three ran here)."""
    targets = {"pvc_sync", "modelcar", "deploy"}
    if not targets <= {row[0].split(" #")[0] for row in table.rows}:
        pytest.skip("only part of the fault tests ran in this session")
    kills = sum(table.kills(prefix) for prefix in targets)
    assert kills >= 20, "only %d kill runs (some runs finished before their kill point); raise ALAUDA_FAULT_RUNS" % kills
    print("kill runs in all: %d (%s)" % (kills, ", ".join("%s %d" % (t, table.kills(t)) for t in sorted(targets))))
