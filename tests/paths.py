"""Where the tests find the read-only shared material: `../shared` next to the checkout (as CI lays it out)."""
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("ALAUDA_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
CAPTURES = os.environ.get("VLLM_CAPTURES", os.path.join(SHARED, "vllm-captures"))
