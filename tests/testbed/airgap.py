"""Run playbooks inside a network namespace that has only loopback, with the whole test bed in it.

    unshare -n -- python -m tests.testbed.airgap SPEC.json      (run_in_netns() does exactly this)

SPEC (JSON): bin_dir, crd_dir (the cached Kubernetes binaries and the KServe CRDs, prepared outside: there is no
network in here), workdir, registry (bool: start a loopback registry, its host replaces @REGISTRY@ in every
step's extra_vars), namespace, behaviours ([{name, ready_after, log_file}] for the KServe stand-in) and steps
([{name, playbook, extra_vars, timeout}]). Each step runs `ansible-playbook` under `strace -f -e trace=connect`;
the result (workdir/result.json) lists per step rc, output, seconds and every connect() with its destination,
plus the namespace's interfaces and the InferenceServices left in the namespace.
Everything started here (etcd, kube-apiserver, controller manager, stand-ins, registry) is stopped here.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# connect(3, {sa_family=AF_INET, sin_port=htons(6443), sin_addr=inet_addr("127.0.0.1")}, 16) = 0
# connect(5, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::1", &sin6_addr), ...
# connect(4, {sa_family=AF_UNIX, sun_path="/run/nscd/socket"}, 110) = -1 ENOENT
_CONNECT = re.compile(r"^(?:(?P<pid>\d+)\s+)?connect\(\d+, \{sa_family=(?P<family>AF_\w+)(?P<rest>.*)$")
_PORT = re.compile(r"sin6?_port=htons\((\d+)\)")
_ADDR4 = re.compile(r'sin_addr=inet_addr\("([^"]+)"\)')
_ADDR6 = re.compile(r'inet_pton\(AF_INET6, "([^"]+)"')
_UNIX = re.compile(r'sun_path=(@?"[^"]*")')
_RESULT = re.compile(r"\)\s+=\s+(-?\d+)(?:\s+(\w+))?")


def parse_connects(text):
    """Every connect() in an `strace -f -e trace=connect` output: {pid, family, address, port, result}."""
    out = []
    for line in text.splitlines():
        match = _CONNECT.match(line.strip())
        if not match:
            continue
        rest = match.group("rest")
        family = match.group("family")
        address = None
        if family == "AF_INET":
            found = _ADDR4.search(rest)
            address = found.group(1) if found else None
        elif family == "AF_INET6":
            found = _ADDR6.search(rest)
            address = found.group(1) if found else None
        elif family == "AF_UNIX":
            found = _UNIX.search(rest)
            address = found.group(1).strip('"') if found else ""
        port = _PORT.search(rest)
        result = _RESULT.search(rest)
        out.append({"pid": int(match.group("pid") or 0), "family": family, "address": address,
                    "port": int(port.group(1)) if port else None,
                    "result": (result.group(2) or result.group(1)) if result else "unfinished"})
    return out


def is_local(connect):
    """Loopback (127.0.0.0/8, ::1, ::ffff:127.x), a unix socket, or AF_UNSPEC (a UDP socket being disconnected)."""
    if connect["family"] in ("AF_UNIX", "AF_UNSPEC", "AF_NETLINK"):
        return True
    if connect["family"] in ("AF_INET", "AF_INET6") and connect["address"]:
        addr = ipaddress.ip_address(connect["address"])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return addr.is_loopback
    return False


def destination(connect):
    if connect["family"] in ("AF_INET", "AF_INET6"):
        return "%s:%s" % (connect["address"], connect["port"])
    if connect["family"] == "AF_UNIX":
        return "unix:%s" % connect["address"]
    return connect["family"]


def run_in_netns(spec, timeout=2400):
    """Write SPEC, run this module in a fresh network namespace (loopback up, nothing else) and return result.json."""
    os.makedirs(spec["workdir"], exist_ok=True)
    path = os.path.join(spec["workdir"], "spec.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(spec, fh)
    cmd = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" -m tests.testbed.airgap "$1"', sys.executable, path]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    result_path = os.path.join(spec["workdir"], "result.json")
    if proc.returncode != 0 or not os.path.isfile(result_path):
        raise RuntimeError("the air-gapped run failed (rc %s):\n%s\n%s" % (proc.returncode, proc.stdout[-4000:], proc.stderr[-6000:]))
    with open(result_path, encoding="utf-8") as fh:
        return json.load(fh)


def _playbook_cmd(step, workdir, index):
    vars_file = os.path.join(workdir, "step-%d-vars.json" % index)
    with open(vars_file, "w", encoding="utf-8") as fh:
        json.dump(dict(step.get("extra_vars") or {}, ansible_python_interpreter=sys.executable), fh)
    playbook = step["playbook"] if os.path.isabs(step["playbook"]) else os.path.join(REPO, step["playbook"])
    binary = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    return [binary, playbook, "-i", "localhost,", "-c", "local", "-e", "@" + vars_file]


def _run_step(step, index, workdir, kubeconfig):
    trace = os.path.join(workdir, "step-%d.strace" % index)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               ANSIBLE_DEPRECATION_WARNINGS="false", K8S_AUTH_KUBECONFIG=kubeconfig)
    cmd = ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=connect", "-o", trace, "--"] + _playbook_cmd(step, workdir, index)
    started = time.monotonic()
    # The playbook's output goes to files, not pipes: a json callback document over 64 KiB came back cut at 65536
    # characters once (stop 48, the verify step), as a write to a full pipe can end short; a file takes it whole.
    out_path, err_path = (os.path.join(workdir, "step-%d.%s" % (index, name)) for name in ("stdout", "stderr"))
    with open(out_path, "w", encoding="utf-8") as out, open(err_path, "w", encoding="utf-8") as err:
        try:
            rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=err, timeout=step.get("timeout", 600), check=False).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    with open(out_path, encoding="utf-8", errors="replace") as out, open(err_path, encoding="utf-8", errors="replace") as err:
        stdout, stderr = out.read(), err.read()
    seconds = time.monotonic() - started
    with open(trace, encoding="utf-8", errors="replace") as fh:
        connects = parse_connects(fh.read())
    return {"name": step["name"], "rc": rc, "stdout": stdout, "stderr": stderr, "seconds": round(seconds, 2), "connects": connects}


def _substitute(value, registry_host):
    text = json.dumps(value)
    return json.loads(text.replace("@REGISTRY@", registry_host or "@REGISTRY@"))


def main(spec_path):  # pylint: disable=too-many-locals
    from .controlplane import ControlPlane  # pylint: disable=import-outside-toplevel
    from .kserve_standin import KServeStandIn  # pylint: disable=import-outside-toplevel
    from .kubelet import KubeletStandIn  # pylint: disable=import-outside-toplevel
    from .registry import Registry  # pylint: disable=import-outside-toplevel
    from .rest import ApiError  # pylint: disable=import-outside-toplevel

    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    workdir = spec["workdir"]
    with open("/proc/self/net/dev", encoding="ascii") as fh:  # this process's namespace (/sys may show the host's)
        interfaces = sorted(line.split(":", 1)[0].strip() for line in fh.readlines()[2:])
    result = {"interfaces": interfaces, "steps": []}
    if shutil.which("strace") is None:
        raise SystemExit("strace is not installed (tests.testbed.registry.ensure_tools(extra={'strace': 'strace'}) installs it)")
    cp = ControlPlane(bin_dir=spec["bin_dir"])
    registry = kubelet = kserve = None
    try:
        cp.start()
        cp.install_crds(spec["crd_dir"])
        cp.wait_for_controller_manager()
        kubelet = KubeletStandIn(cp).start()
        kserve = KServeStandIn(cp, kubelet=kubelet).start()
        if spec.get("registry"):
            registry = Registry(os.path.join(workdir, "registry"))
            registry.start()
            result["registry"] = registry.host
        namespace = spec["namespace"]
        api = cp.rest()
        api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for behaviour in spec.get("behaviours", []):
            with open(behaviour["log_file"], encoding="utf-8") as fh:
                log_text = fh.read()
            kserve.set_behaviour(namespace, behaviour["name"], ready_after=behaviour.get("ready_after", 0.5), log_text=log_text)
        for index, step in enumerate(spec["steps"]):
            step = _substitute(step, result.get("registry"))
            result["steps"].append(_run_step(step, index, workdir, cp.kubeconfig))
        try:
            items = api.get("/apis/serving.kserve.io/v1beta1/namespaces/%s/inferenceservices" % namespace)["items"]
        except ApiError:
            items = []
        result["inferenceservices"] = {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in items}
        if registry is not None:
            result["registry_catalog"] = json.loads(_registry_get(registry.url + "/v2/_catalog"))
        api.close()
    finally:
        for thing in (registry, kserve, kubelet):
            if thing is not None:
                thing.stop()
        cp.stop()
    with open(os.path.join(workdir, "result.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return 0


def _registry_get(url):
    import urllib.request  # pylint: disable=import-outside-toplevel
    with urllib.request.urlopen(url, timeout=10) as resp:  # nosec - loopback registry of this run
        return resp.read().decode()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
