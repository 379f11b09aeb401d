"""Free TCP ports for servers a test starts in another process (kube-apiserver, etcd, a registry, vLLM, the stager's
controller, the pods' HTTP servers), picked BELOW the kernel's ephemeral range.

`bind(("127.0.0.1", 0))` hands out a port from the ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by
default), the same range every outgoing connection takes its source port from. Between the test reading the port
and the other process binding it, seconds may pass; with three integration workers, their control planes and
playbook runs opening connections all the time, another socket can take the port in between and the server then fails
to start ("address already in use"): a flaky failure that has nothing to do with the code under test. Ports below the
ephemeral range are never given to outgoing connections, so a port found free stays free unless a test binds it.
"""
from __future__ import annotations

import random
import socket

_LOWEST = 20000


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """The first of `count` consecutive TCP ports free on `host` now, below the ephemeral range."""
    high = max(_LOWEST + 1000, _ephemeral_start()) - count
    rng = random.SystemRandom()  # not the tests' seeded `random`: workers must not pick the same sequence
    for _attempt in range(200):
        base = rng.randrange(_LOWEST, high)
        held = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no %d consecutive free TCP ports on %s between %d and %d" % (count, host, _LOWEST, high))
