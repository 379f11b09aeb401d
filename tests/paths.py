"""Where the tests find their read-only material.

vLLM output: the project's own recordings in tests/fixtures/vllm (``make captures``; ``VLLM_CAPTURES`` overrides).
A missing capture file fails the test that reads it (never a skip). KServe CRDs: tests/testbed/crds.py.
``SHARED`` (``../shared`` next to the checkout, as CI lays it out) is only the second of the CRD sources there.
"""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("ALAUDA_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
CAPTURES = os.environ.get("VLLM_CAPTURES", os.path.join(REPO, "tests", "fixtures", "vllm"))
KSERVE_VECTORS = os.path.join(REPO, "tests", "fixtures", "kserve")


def capture_path(folder, name):
    """The path of one recorded vLLM file (``tests/fixtures/vllm/<folder>/<name>``); fails the test when it is missing."""
    path = os.path.join(CAPTURES, folder, name)
    if not os.path.exists(path):
        # paths.py is also imported where pytest is not (the test bed's command line): import it only here.
        import pytest  # pylint: disable=import-outside-toplevel
        pytest.fail("vLLM capture missing: %s (the recordings are committed in tests/fixtures/vllm; "
                    "re-record with `make captures`)" % path, pytrace=False)
    return path


def read_capture(folder, name):
    """The text of one recorded vLLM file; fails the test when it is missing (see ``capture_path``)."""
    with open(capture_path(folder, name), encoding="utf-8") as handle:
        return handle.read()


def kserve_vectors(name):
    """KServe's own test vectors ported as data (``tests/fixtures/kserve/<name>``, YAML or JSON)."""
    import yaml  # pylint: disable=import-outside-toplevel
    with open(os.path.join(KSERVE_VECTORS, name), encoding="utf-8") as handle:
        return yaml.safe_load(handle)
