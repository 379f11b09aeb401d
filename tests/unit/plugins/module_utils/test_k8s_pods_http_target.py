"""http_target.pod_http_target: which port and scheme the pod proxy must use to reach vLLM in a predictor pod.

The pod proxy takes only a port number (a name is not resolved for pods), so the spec is read the way
KServe lays it out: the `kserve-container` with the runtime's ports and the predictor's args.
"""

import pytest

from ansible_collections.alauda.spec_decoding.plugins.module_utils.vllm import http_target
from ansible_collections.alauda.spec_decoding.plugins.module_utils.errors import ValidationError


def pod(args=None, ports=None, command=None, name="kserve-container", others=()):
    container = {"name": name}
    if args is not None:
        container["args"] = args
    if command is not None:
        container["command"] = command
    if ports is not None:
        container["ports"] = ports
    return {"metadata": {"name": "p-0"}, "spec": {"containers": [container] + list(others)}}


@pytest.mark.parametrize("spec, port, how", [
    (pod(["--port", "8000"], [{"containerPort": 8080}]), 8000, "port 8000 from --port in the command/args of kserve-container"),
    (pod(["--model", "/mnt/models", "--port=9000"]), 9000, "port 9000 from --port in the command/args of kserve-container"),
    (pod(command=["sh", "-c", "python3 -m vllm.entrypoints.openai.api_server --model /mnt/models --port 8001"]), 8001,
     "port 8001 from --port in the command/args of kserve-container"),
    (pod(["--http_port=8082"]), 8082, "port 8082 from --http_port in the command/args of kserve-container"),
    (pod(["--model_name=x"], [{"name": "grpc", "containerPort": 8081}, {"name": "http1", "containerPort": 8080}]), 8080,
     "port 8080 from containerPort 'http1' of kserve-container"),
    (pod([], [{"containerPort": 5000, "protocol": "UDP"}, {"containerPort": 8000, "protocol": "TCP"}]), 8000,
     "port 8000 from containerPort of kserve-container"),
    (pod([]), 8080, "port 8080 by default (no --port and no containerPort on kserve-container)"),
])
def test_port_discovery(spec, port, how):
    assert http_target.pod_http_target(spec) == {"scheme": "http", "port": port, "container": "kserve-container", "how": how}


def test_given_port_number_or_name():
    spec = pod(["--port", "8000"], [{"name": "metrics", "containerPort": 9090}],
               others=[{"name": "sidecar", "ports": [{"name": "admin", "containerPort": 15000}]}])
    assert http_target.pod_http_target(spec, port="7000")["port"] == 7000
    assert http_target.pod_http_target(spec, port=7001)["port"] == 7001
    named = http_target.pod_http_target(spec, port="admin")
    assert named["port"] == 15000 and named["how"] == "port 15000 from the port named 'admin' of container sidecar"
    with pytest.raises(ValidationError, match=r"^port: pod p-0 has no container port named 'web' \(named ports: admin, metrics\)"):
        http_target.pod_http_target(spec, port="web")


def test_scheme_follows_vllm_tls_flags():
    tls = pod(["--port", "8443", "--ssl-keyfile", "/tls/key", "--ssl-certfile", "/tls/crt"])
    target = http_target.pod_http_target(tls)
    assert (target["scheme"], target["port"]) == ("https", 8443) and "https because kserve-container passes --ssl-certfile" in target["how"]
    assert http_target.pod_http_target(tls, scheme="http")["scheme"] == "http"
    assert http_target.pod_http_target(pod(["--port", "8000"]), scheme="https")["scheme"] == "https"


def test_other_container_name_falls_back_to_the_first():
    target = http_target.pod_http_target(pod(["--port", "8000"], name="vllm"))
    assert target["port"] == 8000 and target["container"] == "vllm"
    assert target["how"].startswith("pod has no container 'kserve-container', used 'vllm'")
    assert http_target.pod_http_target(pod(["--port", "8000"], name="vllm"), container="vllm")["how"] == \
        "port 8000 from --port in the command/args of vllm"


def test_port_from_a_script_with_env_comment_and_substitution():
    # the comment's --port 1 is not an option (the old shlex reader returned 1); $PORT comes from the container's env
    script = pod(command=["bash", "-c", 'exec vllm serve m --port "$PORT" # --port 1'], ports=[{"containerPort": 8080}])
    script["spec"]["containers"][0]["env"] = [{"name": "PORT", "value": "8001"}]
    assert http_target.pod_http_target(script)["how"] == "port 8001 from --port in the command/args of kserve-container"
    # a port known only at run time ($(...)) is not a number: the container port is used
    dynamic = pod(command=["bash", "-c", "exec vllm serve m --port $(cat /etc/port)"], ports=[{"containerPort": 8080}])
    assert http_target.pod_http_target(dynamic)["how"] == "port 8080 from containerPort of kserve-container"
    tls = pod(["--ssl_certfile=/tls/crt", "--port", "8443"])  # vLLM reads --ssl_certfile as --ssl-certfile
    assert http_target.pod_http_target(tls)["scheme"] == "https"


@pytest.mark.parametrize("port, expected", [(8080, 8080), ("443", 443), (" http ", "http"), ("h2c", "h2c"), ("metrics-1", "metrics-1"),
                                            (None, None), ("", None)])
def test_check_port_accepts_numbers_and_port_names(port, expected):
    assert http_target.check_port(port) == expected


@pytest.mark.parametrize("port, words", [(70000, "out of range"), ("0", "out of range"), ("HTTP", "neither"), ("-http", "neither"),
                                         ("http--2", "neither"), ("a" * 16, "neither"), ("8080/tcp", "neither"), ("123-456", "neither")])
def test_check_port_refuses_what_the_pod_proxy_cannot_take(port, words):
    with pytest.raises(ValidationError) as err:
        http_target.check_port(port)
    assert words in str(err.value) and err.value.field == "port"
    with pytest.raises(ValidationError):
        http_target.pod_http_target(pod(["--port", "8000"]), port=port)
