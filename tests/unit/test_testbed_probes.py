"""The test bed's probe cadence (tests/testbed/pod_process.py `probe_cadence`): a long period runs at the kubelet
stand-in's `probe_period_max` with the failure threshold scaled, so the time a probe is given before it fails is the
probe's own; a short period, or no cap, is the probe's own cadence."""
import pytest

from tests.testbed.pod_process import probe_cadence

# The predictor's startupProbe as isvc_manifest renders it (kserve/isvc/render.py): period 10 s, threshold = 1800 // 10.
RENDERED_STARTUP = {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10, "failureThreshold": 180, "timeoutSeconds": 5}


@pytest.mark.parametrize("probe, period_max, expected", [
    (RENDERED_STARTUP, 1.0, (1.0, 1800)),
    (RENDERED_STARTUP, None, (10.0, 180)),
    ({"periodSeconds": 1, "failureThreshold": 3}, 1.0, (1.0, 3)),
    ({}, 1.0, (1.0, 30)),            # the kubelet's defaults: 10 s x 3
    ({}, None, (10.0, 3)),
    ({"periodSeconds": 5, "failureThreshold": 1}, 2.0, (2.0, 3)),  # rounded up: never less time than the probe's own
])
def test_probe_cadence(probe, period_max, expected):
    period, failures = probe_cadence(probe, period_max)
    assert (period, failures) == expected
    own = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
    assert period * failures >= own  # the time to fail is never shorter than the probe's own
