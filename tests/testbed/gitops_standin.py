"""What the Argo CD and Flux stand-ins share: real `git` to resolve a branch and read a commit's tree, the render of a
path (`kubectl kustomize`, or the plain manifests of a folder), the API path of any kind (discovery), server-side apply
with a field manager, a comparison of rendered against live fields, and the controller thread (watch-woken, with
per-object due times, `sync_now()` and `wait_idle()` for tests).

Free of the product's code, like the KServe stand-in. `kubectl` here is the test bed's tool (v1.32, kustomize v5.5 at
/usr/bin/kubectl; `ALAUDA_TESTBED_KUBECTL` overrides), never the product's.
"""
from __future__ import annotations

import base64
import copy
import datetime
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time

import yaml

from .rest import ApiError
from .wake import WatchWaker

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class GitopsError(RuntimeError):
    """A reconcile step failed; the message is what the controller writes into the object's status."""


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_duration(text, default: float) -> float:
    """A Go duration as Flux writes intervals ("1m30s", "500ms", "1h"); `default` when empty or unparsable."""
    if not text:
        return default
    parts = DURATION_RE.findall(str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        return default
    return sum(float(n) * DURATION_UNITS[u] for n, u in parts)


def kubectl_path() -> str:
    path = os.environ.get("ALAUDA_TESTBED_KUBECTL") or shutil.which("kubectl") or "/usr/bin/kubectl"
    if not os.access(path, os.X_OK):
        raise GitopsError(f"kubectl not found at {path}: the GitOps stand-ins render kustomize overlays with "
                          "`kubectl kustomize` (kubectl v1.32 / kustomize v5.5 at /usr/bin/kubectl on the test bed; "
                          "ALAUDA_TESTBED_KUBECTL=PATH overrides)")
    return path


# --------------------------------------------------------------------------------------------------------- git
class GitCache:
    """One bare cache repository per source URL and one extracted tree per commit (commits never change). Thread-safe."""

    def __init__(self, root: str | None = None):
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="testbed-gitops-cache-")
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def auth_env(username: str | None, password: str | None) -> dict:
        """Basic auth as an http.extraHeader through git's GIT_CONFIG_COUNT variables (not in argv or the URL)."""
        if username is None and password is None:
            return {}
        raw = base64.b64encode(f"{username or ''}:{password or ''}".encode()).decode()
        return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
                "GIT_CONFIG_VALUE_0": f"Authorization: Basic {raw}"}

    @staticmethod
    def _git(*args, env=None, stdout_bytes=False):
        full = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_TERMINAL_PROMPT="0")
        full.update(env or {})
        proc = subprocess.run(["git", *args], env=full, capture_output=True, timeout=60, check=False)
        if proc.returncode:
            raise GitopsError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout if stdout_bytes else proc.stdout.decode(errors="replace")

    def _bare(self, url: str) -> str:
        path = os.path.join(self.root, "repos", hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
        if not os.path.isdir(path):
            self._git("init", "--bare", "-q", path)
        return path

    def ls_remote(self, url: str, env=None) -> dict:
        """{ref: sha} the remote advertises (HEAD, refs/heads/*, refs/tags/*; peeled tags as `<tag>^{}`)."""
        refs = {}
        for line in self._git("ls-remote", url, env=env).splitlines():
            sha, _tab, ref = line.partition("\t")
            refs[ref] = sha
        return refs

    def resolve(self, url: str, kind: str, ref: str, env=None) -> str:
        """The commit sha of `ref`: kind branch | tag | commit | name (a full ref) | head (the default branch)."""
        if kind == "commit":
            return ref
        refs = self.ls_remote(url, env)
        wanted = {"branch": [f"refs/heads/{ref}"], "tag": [f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"],
                  "name": [ref], "head": ["HEAD"]}[kind]
        for candidate in wanted:
            if candidate in refs:
                return refs[candidate]
        raise GitopsError(f"unable to resolve {kind} '{ref}' in {url}: not found")

    def tree(self, url: str, sha: str, env=None) -> str:
        """A folder with the files of commit `sha` of `url` (fetched into the cache when it is not there yet)."""
        with self._lock:
            out = os.path.join(self.root, "trees", sha)
            if os.path.isdir(out):
                return out
            bare = self._bare(url)
            try:
                self._git("--git-dir", bare, "cat-file", "-e", f"{sha}^{{commit}}")
            except GitopsError:
                self._git("--git-dir", bare, "fetch", "-q", "--no-tags", url, "+refs/heads/*:refs/heads/*",
                          "+refs/tags/*:refs/tags/*", env=env)
                try:
                    self._git("--git-dir", bare, "cat-file", "-e", f"{sha}^{{commit}}")
                except GitopsError as exc:
                    raise GitopsError(f"commit {sha} not found in {url} after fetching its branches and tags") from exc
            archive = self._git("--git-dir", bare, "archive", "--format=tar", sha, stdout_bytes=True)
            tmp = tempfile.mkdtemp(prefix=".tree-", dir=os.path.dirname(bare))
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(tmp, filter="data")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            os.replace(tmp, out)
            return out


# ------------------------------------------------------------------------------------------------------ render
def _load_documents(text: str, origin: str) -> list:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise GitopsError(f"{origin}: not YAML: {exc}") from exc
    out = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind", "").endswith("List") and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        elif isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"):
            out.append(doc)
    return out


def has_kustomization(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, name)) for name in KUSTOMIZATION_FILES)


def kustomize(folder: str) -> list:
    """`kubectl kustomize <folder>`: the objects it renders."""
    proc = subprocess.run([kubectl_path(), "kustomize", folder], capture_output=True, timeout=60, check=False)
    if proc.returncode:
        raise GitopsError(f"kustomize build failed: {proc.stderr.decode(errors='replace').strip()}")
    return _load_documents(proc.stdout.decode(), f"kustomize build {folder}")


def manifest_files(folder: str, recurse: bool) -> list:
    """The *.yaml / *.yml / *.json files of `folder` (sub-folders too with `recurse`), in path order."""
    found = []
    for base, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recurse else []
        found += [os.path.join(base, f) for f in files if f.endswith((".yaml", ".yml", ".json"))]
    return sorted(found)


def plain_manifests(folder: str, recurse: bool) -> list:
    objs = []
    for path in manifest_files(folder, recurse):
        with open(path, encoding="utf-8") as fh:
            objs += _load_documents(fh.read(), os.path.relpath(path, folder))
    return objs


def source_folder(tree: str, path: str | None) -> str:
    """`path` inside the commit's tree; a path that leaves the tree or does not exist is an error."""
    rel = os.path.normpath((path or ".").lstrip("/"))
    folder = os.path.realpath(os.path.join(tree, rel))
    if not (folder == os.path.realpath(tree) or folder.startswith(os.path.realpath(tree) + os.sep)):
        raise GitopsError(f"path '{path}' is outside the repository")
    if not os.path.isdir(folder):
        raise GitopsError(f"path '{path}' not found in the repository")
    return folder


# ---------------------------------------------------------------------------------------------------- objects
class ApiResources:
    """Discovery: (plural, namespaced) of every apiVersion/kind the API server serves; looked up again on a miss (a
    CRD installed after the first look)."""

    def __init__(self):
        self._kinds = {}

    def _discover(self, api, api_version: str) -> None:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            resources = api.get(path).get("resources") or []
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        for res in resources:
            if "/" not in res["name"]:
                self._kinds[(api_version, res["kind"])] = (res["name"], bool(res.get("namespaced")))

    def lookup(self, api, api_version: str, kind: str):
        key = (api_version, kind)
        if key not in self._kinds:
            self._discover(api, api_version)
        if key not in self._kinds:
            raise GitopsError(f"the server could not find the requested resource: no kind {kind} in {api_version}")
        return self._kinds[key]

    def path(self, api, obj: dict) -> str:
        """The object's own API path (its metadata.namespace must be set when the kind is namespaced)."""
        plural, namespaced = self.lookup(api, obj["apiVersion"], obj["kind"])
        prefix = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        meta = obj["metadata"]
        if namespaced:
            return f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
        return f"{prefix}/{plural}/{meta['name']}"

    def default_namespace(self, api, obj: dict, namespace: str | None, force: bool = False) -> dict:
        """Set metadata.namespace on a namespaced kind that has none (or on every namespaced object with `force`,
        as kustomize's `namespace:` does); cluster-scoped objects are left alone."""
        _plural, namespaced = self.lookup(api, obj["apiVersion"], obj["kind"])
        meta = obj.setdefault("metadata", {})
        if namespaced and namespace and (force or not meta.get("namespace")):
            meta["namespace"] = namespace
        if namespaced and not meta.get("namespace"):
            raise GitopsError(f"{obj['kind']}/{meta.get('name')} has no namespace and no default namespace is set")
        return obj


def server_side_apply(api, resources: ApiResources, obj: dict, manager: str) -> dict:
    """PATCH application/apply-patch+yaml with `manager` and force (take over fields another manager set, as both
    controllers do)."""
    return api.request("PATCH", resources.path(api, obj), obj, query={"fieldManager": manager, "force": "true"},
                       content_type="application/apply-patch+yaml")


def get_live(api, resources: ApiResources, obj: dict):
    try:
        return api.get(resources.path(api, obj))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def differences(desired, live, path: str = "") -> list:
    """Field paths where `live` does not hold what `desired` sets (fields only the server or others set are ignored;
    lists must match item by item)."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [path or "."]
        out = []
        for key, value in desired.items():
            if path == "" and key == "status":
                continue
            out += differences(value, live.get(key), f"{path}.{key}")
        return out
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [path]
        out = []
        for i, (want, have) in enumerate(zip(desired, live)):
            out += differences(want, have, f"{path}[{i}]")
        return out
    return [] if desired == live else [path]


def object_ref(obj: dict) -> dict:
    """Argo CD's ResourceStatus / ResourceResult keys; group and namespace left out when empty: the test bed's API
    server reads an empty string in a custom resource as null and refuses it ("must be of type string")."""
    group, _sep, version = obj["apiVersion"].rpartition("/")
    meta = obj.get("metadata") or {}
    ref = {"group": group, "version": version, "kind": obj["kind"], "namespace": meta.get("namespace"), "name": meta.get("name")}
    return {k: v for k, v in ref.items() if v}


def apply_order(objs: list) -> list:
    """Namespaces and CRDs first (what the rest may need), then the others in render order."""
    first = ("Namespace", "CustomResourceDefinition")
    return [o for o in objs if o["kind"] in first] + [o for o in objs if o["kind"] not in first]


def condition(old_conditions, ctype: str, status: str, reason: str, message: str, generation=None) -> dict:
    """A metav1.Condition; lastTransitionTime kept while the status does not change."""
    old = next((c for c in old_conditions or [] if c.get("type") == ctype), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") else now_rfc3339()
    cond = {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


# ------------------------------------------------------------------------------------------------- controller
class PollingController:
    """A controller thread: woken by a watch on its own kinds (and by `sync_now()`), it lists them and reconciles each
    object that is due (`due(obj)`), then sleeps until the earliest next due time. Errors are kept in `errors`."""

    NAME = "gitops"

    def __init__(self, controlplane, watch_paths, git_cache: GitCache | None = None):
        self.cp = controlplane
        self.watch_paths = list(watch_paths)
        self.git = git_cache or GitCache()
        self._own_git = git_cache is None
        self.resources = ApiResources()
        self.errors = []
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._woken = False
        self._force = False
        self._passes_started = 0
        self._passes_done = 0
        self._last_done = None
        self._next_due = {}  # (kind, namespace, name) -> monotonic time
        self._renders = {}
        self._thread = None
        self._waker = None

    # ---- lifecycle
    # Running stand-ins by (name, control plane): a second one of a kind on one API server would reconcile the same
    # objects from its own, staler reads (a session fixture imported into two test modules made one per module).
    _running: dict = {}
    _running_lock = threading.Lock()

    def start(self):
        key = (self.NAME, id(self.cp))
        with PollingController._running_lock:
            if key in PollingController._running:
                raise RuntimeError(f"a {self.NAME} stand-in already runs on this control plane: import its fixture in a conftest.py, "
                                   "not in a test module (each module that imports a session fixture gets its own)")
            PollingController._running[key] = self
        self._waker = WatchWaker(self.cp, self.watch_paths, lambda _event: self._wake(), self._wake, self._stop,
                                 name=self.NAME).start()
        self._waker.wait_started(10)
        self._thread = threading.Thread(target=self._loop, name=self.NAME, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with PollingController._running_lock:
            if PollingController._running.get((self.NAME, id(self.cp))) is self:
                del PollingController._running[(self.NAME, id(self.cp))]
        self._stop.set()
        self._wake()
        if self._waker is not None:
            self._waker.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._own_git:
            self.git.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def cached_render(self, key, build) -> list:
        """`build()` once per key (a commit's tree and the render's inputs: the output cannot change), a deep copy each
        call (callers add labels and namespaces). Saves a `kubectl kustomize` per object and interval."""
        if key not in self._renders:
            if len(self._renders) > 64:
                self._renders.clear()
            self._renders[key] = build()
        return copy.deepcopy(self._renders[key])

    # ---- test hooks
    def _wake(self) -> None:
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def sync_now(self) -> None:
        """Reconcile every object at the next pass, whatever its interval (a test's "refresh now")."""
        with self._cond:
            self._force = True
            self._woken = True
            self._cond.notify_all()

    def wait_idle(self, timeout: float = 30.0, force: bool = True) -> None:
        """Return after a full pass that started after this call has finished (with `force`, every object was
        reconciled in it). Raises TimeoutError."""
        with self._cond:
            if force:
                self._force = True
            self._woken = True
            target = self._passes_started + 1
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._passes_done >= target or self._stop.is_set(), timeout):
                raise TimeoutError(f"{self.NAME}: no full pass within {timeout} s (errors: {self.errors[-3:]})")

    def passes(self) -> dict:
        """How many full passes started and finished, and the seconds since the last one finished (a test's diagnosis
        when the stand-in did not react in time)."""
        with self._cond:
            return {"started": self._passes_started, "done": self._passes_done,
                    "seconds_since_done": round(time.monotonic() - self._last_done, 1) if self._last_done else None}

    # ---- loop
    def list_objects(self, api) -> list:
        """[(kind, object)] this controller reconciles."""
        raise NotImplementedError

    def due(self, kind: str, obj: dict, now: float) -> bool:
        """Reconcile now even if its interval has not elapsed (a spec change, a requested refresh...)."""
        return False

    def reconcile(self, api, kind: str, obj: dict) -> float:
        """Reconcile one object; returns the seconds until it is due again."""
        raise NotImplementedError

    def _loop(self) -> None:
        api = self.cp.rest()
        try:
            while not self._stop.is_set():
                with self._cond:
                    wait = min(self._next_due.values(), default=time.monotonic() + 10.0) - time.monotonic()
                    if not self._woken and wait > 0:
                        self._cond.wait(wait)
                    if self._stop.is_set():
                        break
                    self._woken = False
                    force, self._force = self._force, False
                    self._passes_started += 1
                try:
                    self._pass(api, force)
                except Exception as exc:  # pylint: disable=broad-except  # a pass that failed is retried; tests read errors
                    if not self._stop.is_set():
                        self.errors.append(f"{self.NAME} pass: {exc!r}")
                        api.close()
                        self._stop.wait(0.2)
                with self._cond:
                    self._passes_done += 1
                    self._last_done = time.monotonic()
                    self._cond.notify_all()
        finally:
            api.close()

    def _pass(self, api, force: bool) -> None:
        now = time.monotonic()
        seen = set()
        for kind, obj in self.list_objects(api):
            meta = obj["metadata"]
            key = (kind, meta.get("namespace"), meta["name"])
            seen.add(key)
            if meta.get("deletionTimestamp"):
                continue
            if not force and key in self._next_due and self._next_due[key] > now and not self.due(kind, obj, now):
                continue
            try:
                delay = self.reconcile(api, kind, obj)
            except ApiError as exc:
                delay = 0.5 if exc.status == 409 else 1.0
                if exc.status not in (404, 409):
                    self.errors.append(f"reconcile {kind} {key[1]}/{key[2]}: {exc}")
            self._next_due[key] = time.monotonic() + delay
        for key in set(self._next_due) - seen:
            del self._next_due[key]


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05, what="condition"):
    """Poll `predicate` (a short poll, for tests and e2e waits) until it returns a truthy value, which is returned;
    TimeoutError naming `what` after `timeout` s (a callable `what` is asked then, e.g. for a stand-in's errors)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what() if callable(what) else what} not met within {timeout} s")
        time.sleep(interval)
