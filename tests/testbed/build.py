"""Build (once per machine) kube-apiserver and kube-controller-manager from Debian's `kubernetes` source.

No registry ships a kube-apiserver binary and there is no container engine here, so the test bed
builds v1.20.2 from the Debian bookworm source package with Debian's Go (see
../shared/reference/facts.md section 3):

1. apt: add a deb-src entry for the configured Debian mirror in a file of our own under
   /etc/apt/sources.list.d/ (existing source files are never edited), `apt-get update` when the source
   index is missing, install the build tools, etcd and the two Go vendor replacements.
2. `apt-get source kubernetes` in a temporary build directory.
3. Swap vendor/github.com/modern-go/reflect2 and vendor/github.com/json-iterator/go for Debian's copies
   (reflect2 1.0.1 crashes with Go >= 1.18 on the first custom-resource write).
4. `make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"`.
5. Copy both binaries to ~/.cache/alauda-spec-decoding/k8s-<debian source version>/ and write a stamp.

When a complete cache directory exists every step is skipped (a run then costs milliseconds). Every
failing step raises BuildError naming the step, the command and the reason.

Usage: python -m tests.testbed.build   (prints the cache directory)
"""
from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

CACHE_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "alauda-spec-decoding")
BINARIES = ("kube-apiserver", "kube-controller-manager")
STAMP = "COMPLETE"
APT_PACKAGES = (
    "golang-go",
    "etcd-server",
    "dpkg-dev",
    "rsync",
    "make",
    "golang-github-modern-go-reflect2-dev",
    "golang-github-json-iterator-go-dev",
    "openssl",
)
# Binaries the control plane needs at run time, with the apt package that ships each.
RUNTIME_COMMANDS = {"etcd": "etcd-server"}
SRC_LIST = "/etc/apt/sources.list.d/alauda-spec-decoding-src.sources"
VENDOR_SWAP = {
    "vendor/github.com/modern-go/reflect2": "/usr/share/gocode/src/github.com/modern-go/reflect2",
    "vendor/github.com/json-iterator/go": "/usr/share/gocode/src/github.com/json-iterator/go",
}


class BuildError(RuntimeError):
    """A build step failed; the message says which step, what ran and why it failed."""


def log(msg: str) -> None:
    print(f"[testbed-build] {msg}", file=sys.stderr, flush=True)


def _run(step: str, cmd, cwd=None, env=None, tail=40, timeout=None):
    log(f"{step}: {' '.join(cmd)}")
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise BuildError(f"{step} failed: command {cmd[0]!r} not found ({exc}); install it or check PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{step} failed: {' '.join(cmd)} did not finish within {timeout} s") from exc
    if proc.returncode != 0:
        lines = proc.stdout.splitlines()[-tail:]
        raise BuildError(
            f"{step} failed: `{' '.join(cmd)}` exited with {proc.returncode}. Last output:\n" + "\n".join(lines))
    return proc.stdout


# --------------------------------------------------------------------------------------------------
# cache lookup


def find_cached(cache_root: str = CACHE_ROOT) -> str | None:
    """Return the newest complete k8s-* cache directory, or None."""
    pinned = os.environ.get("ALAUDA_K8S_VERSION")
    candidates = sorted(glob.glob(os.path.join(cache_root, "k8s-*")), key=os.path.getmtime, reverse=True)
    for path in candidates:
        if pinned and os.path.basename(path) != f"k8s-{pinned}":
            continue
        if os.path.isfile(os.path.join(path, STAMP)) and all(
                os.access(os.path.join(path, b), os.X_OK) for b in BINARIES):
            return path
    return None


# --------------------------------------------------------------------------------------------------
# apt


def _sudo():
    return [] if os.geteuid() == 0 else ["sudo", "-n"]


def _os_codename() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VERSION_CODENAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "bookworm"


def _configured_mirror(codename: str) -> tuple[str, str | None]:
    """Find the (URI, Signed-By) of the Debian mirror that serves `codename` itself (not -security)."""
    files = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")) + sorted(
        glob.glob("/etc/apt/sources.list.d/*.sources"))
    for path in files:
        if path == SRC_LIST or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if path.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
                if "deb" in fields.get("types", "").split() and codename in fields.get("suites", "").split() \
                        and fields.get("enabled", "yes").lower() != "no":
                    return fields.get("uris", "").split()[0], fields.get("signed-by")
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", "", line).split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == codename:
                    return parts[1], None
    raise BuildError(
        f"apt configuration failed: no enabled `deb` entry for suite {codename!r} found in /etc/apt/sources.list "
        "or /etc/apt/sources.list.d/; add the Debian mirror first")


def ensure_apt_source() -> None:
    codename = _os_codename()
    uri, signed_by = _configured_mirror(codename)
    body = f"# Added by alauda.spec_decoding tests/testbed/build.py: source packages for the k8s test bed\n" \
           f"Types: deb-src\nURIs: {uri}\nSuites: {codename}\nComponents: main\n"
    if signed_by:
        body += f"Signed-By: {signed_by}\n"
    current = None
    if os.path.exists(SRC_LIST):
        with open(SRC_LIST, encoding="utf-8") as fh:
            current = fh.read()
    if current != body:
        log(f"apt: writing {SRC_LIST} (deb-src {uri} {codename} main)")
        try:
            with open(SRC_LIST, "w", encoding="utf-8") as fh:
                fh.write(body)
        except OSError as exc:
            raise BuildError(f"apt configuration failed: cannot write {SRC_LIST} ({exc}); run as root") from exc
    have_sources = glob.glob("/var/lib/apt/lists/*_source_Sources*")
    have_packages = glob.glob("/var/lib/apt/lists/*_binary-*_Packages*")
    if current != body or not have_sources or not have_packages:
        _run("apt-get update (package and source indexes)", _sudo() + ["apt-get", "update"], tail=20)


def _installed(pkg: str) -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True, check=False)
    return proc.returncode == 0 and "install ok installed" in proc.stdout


def ensure_packages(packages=APT_PACKAGES) -> None:
    missing = [p for p in packages if not _installed(p)]
    if not missing:
        return
    if not glob.glob("/var/lib/apt/lists/*_binary-*_Packages*"):
        _run("apt-get update (package index is empty)", _sudo() + ["apt-get", "update"], tail=20)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(f"apt-get install {' '.join(missing)}",
         _sudo() + ["apt-get", "install", "-y", "--no-install-recommends"] + missing, env=env, tail=30)


def ensure_runtime_packages() -> None:
    """etcd is needed at run time even when the binaries come from the cache."""
    missing = [pkg for cmd, pkg in RUNTIME_COMMANDS.items() if not shutil.which(cmd)]
    if missing:
        ensure_packages(missing)
    for cmd, pkg in RUNTIME_COMMANDS.items():
        if not shutil.which(cmd):
            raise BuildError(f"runtime check failed: {cmd!r} is not on PATH after installing apt package {pkg!r}")


# --------------------------------------------------------------------------------------------------
# build


def _source_version() -> str:
    out = _run("apt-cache showsrc kubernetes", ["apt-cache", "showsrc", "kubernetes"], tail=10)
    versions = re.findall(r"^Version:\s*(\S+)", out, flags=re.M)
    if not versions:
        raise BuildError("apt-cache showsrc kubernetes failed: no Version field; is the deb-src entry active?")
    return versions[0]


def build(cache_root: str = CACHE_ROOT, keep_tree: bool = False) -> str:
    """Build the binaries into the cache (or reuse it). Returns the cache directory."""
    cached = find_cached(cache_root)
    if cached:
        ensure_runtime_packages()
        return cached
    os.makedirs(cache_root, exist_ok=True)
    # Two test runs may start at once: one builds, the other waits for it.
    with open(os.path.join(cache_root, ".k8s-build.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = find_cached(cache_root)
        if cached:
            ensure_runtime_packages()
            return cached
        return _build_locked(cache_root, keep_tree)


def _build_locked(cache_root: str, keep_tree: bool) -> str:
    start = time.monotonic()
    ensure_apt_source()
    ensure_packages()
    version = _source_version()
    dest = os.path.join(cache_root, f"k8s-{version}")
    workdir = tempfile.mkdtemp(prefix="k8s-build-", dir=os.environ.get("ALAUDA_K8S_BUILD_DIR"))
    try:
        _run("apt-get source kubernetes (download and unpack the Debian source package)",
             ["apt-get", "source", "kubernetes"], cwd=workdir, tail=20)
        trees = [d for d in glob.glob(os.path.join(workdir, "kubernetes-*")) if os.path.isdir(d)]
        if len(trees) != 1:
            raise BuildError(f"apt-get source kubernetes failed: expected one kubernetes-* directory in {workdir}, "
                             f"found {trees}")
        tree = trees[0]
        for vendored, debian_copy in VENDOR_SWAP.items():
            target = os.path.join(tree, vendored)
            if not os.path.isdir(debian_copy):
                raise BuildError(f"vendor swap failed: {debian_copy} is missing; the Debian Go package that ships "
                                 "it was not installed")
            if not os.path.isdir(target):
                raise BuildError(f"vendor swap failed: {target} is not in the source tree; the source package "
                                 "layout changed")
            log(f"vendor swap: {vendored} <- {debian_copy}")
            shutil.rmtree(target)
            shutil.copytree(debian_copy, target, symlinks=False)
        # The tree's own build scripts set up GOPATH/modules; keep Go's build cache in the temp dir and
        # stay offline (everything is vendored).
        env = dict(os.environ, GOPROXY="off", GOCACHE=os.path.join(workdir, "gocache"))
        _run('make WHAT="cmd/kube-apiserver cmd/kube-controller-manager"',
             ["make", "WHAT=cmd/kube-apiserver cmd/kube-controller-manager"], cwd=tree, env=env, tail=60)
        staging = dest + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        for name in BINARIES:
            found = glob.glob(os.path.join(tree, "_output", "local", "bin", "*", "*", name)) + glob.glob(
                os.path.join(tree, "_output", "bin", name))
            if not found:
                raise BuildError(f"make finished but {name} is not under {tree}/_output; the build layout changed")
            shutil.copy2(found[0], os.path.join(staging, name))
            os.chmod(os.path.join(staging, name), 0o755)
        elapsed = time.monotonic() - start
        with open(os.path.join(staging, STAMP), "w", encoding="utf-8") as fh:
            fh.write(f"debian-source-version: {version}\nbuild-seconds: {elapsed:.0f}\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(staging, dest)
        log(f"built {', '.join(BINARIES)} in {elapsed:.0f} s -> {dest}")
        return dest
    finally:
        if keep_tree:
            log(f"build tree kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        path = build(keep_tree="--keep-tree" in argv)
    except BuildError as exc:
        print(f"kubernetes test bed build failed: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
