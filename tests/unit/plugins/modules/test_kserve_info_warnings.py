"""kserve_info's warnings: a CRD the identity may not read (403) is named, with the release the render assumes instead
and the two fixes, for an InferenceService only; a readable CRD gives none. The reads are stubbed (an error path of a
module whose reads the integration tier runs against the real API server: tests/integration/test_rbac.py)."""
from __future__ import annotations

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.kserve import facts as kserve_facts
from ansible_collections.alauda.spec_decoding.plugins.modules import kserve_info


class _Module:
    api_client = None

    def __init__(self, **params):
        self.params = dict(namespace="models", name="llama", kserve_namespace="kserve", runtime=None, model_format="transformers",
                           resource_kind="InferenceService", assumed_kserve_version=None)
        self.params.update(params)
        self.warnings = []

    def warn(self, text):
        self.warnings.append(text)


def _facts(readable):
    return {"installed": None if not readable else True, "crd_readable": readable, "kserve_version": "0.20.0" if readable else None,
            "evidence": "", "kserve_warning": None, "existing": None, "runtimes": []}


@pytest.mark.parametrize("kind, readable, assumed, expected", [
    ("InferenceService", False, None, "the render assumes KServe 0.20 (the default)"),
    ("InferenceService", False, "0.15", "the render assumes KServe 0.15 (as given)"),
    ("InferenceService", True, None, None),
    ("LLMInferenceService", False, None, None),  # its render does not depend on the InferenceService CRD's release
])
def test_the_crd_it_may_not_read_is_a_warning_naming_the_assumed_release(monkeypatch, kind, readable, assumed, expected):
    monkeypatch.setattr(kserve_facts, "gather", lambda *_a, **_k: _facts(readable))
    module = _Module(resource_kind=kind, assumed_kserve_version=assumed)
    result = kserve_info.execute(module)
    assert result["crd_readable"] is readable and result["changed"] is False
    if expected is None:
        assert module.warnings == []
        return
    (warning,) = module.warnings
    assert warning.startswith("cannot read CustomResourceDefinition inferenceservices.serving.kserve.io (403 Forbidden")
    assert expected in warning
    assert "Fix: bind the ClusterRole spec-decoding-kserve-crd-reader (docs/rbac.md) or set spec_decoding_kserve_version" in warning
