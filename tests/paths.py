"""Where the tests find the read-only shared material: `../shared` next to the checkout (as CI lays it out)."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("ALAUDA_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
CAPTURES = os.environ.get("VLLM_CAPTURES", os.path.join(SHARED, "vllm-captures"))


def read_capture(folder, name):
    """The text of one captured vLLM file (``vllm-captures/<folder>/<name>``); skips the test where shared/ is absent."""
    # paths.py is also imported where pytest is not (the test bed's command line): import it only here.
    import pytest  # pylint: disable=import-outside-toplevel
    path = os.path.join(CAPTURES, folder, name)
    if not os.path.exists(path):
        pytest.skip("vLLM captures not found at %s" % path)
    with open(path, encoding="utf-8") as handle:
        return handle.read()
