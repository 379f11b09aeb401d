"""tests/testbed/ports.py: ports for servers started in another process are taken below the ephemeral range."""
import socket

from tests.testbed import ports


def test_free_ports_are_below_the_ephemeral_range_consecutive_and_bindable():
    start = ports._ephemeral_start()  # pylint: disable=protected-access
    seen = set()
    for _attempt in range(20):
        base = ports.free_port(count=3)
        assert ports._LOWEST <= base and base + 3 <= start  # pylint: disable=protected-access
        held = []
        try:
            for port in range(base, base + 3):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        finally:
            for sock in held:
                sock.close()
        seen.add(base)
    assert len(seen) > 1  # not one fixed port: parallel workers must not collide


def test_a_port_in_use_is_never_returned(monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    busy = taken.getsockname()[1]
    calls = iter([busy - ports._LOWEST, 1])  # pylint: disable=protected-access

    class FixedRandom:  # the first draw hits the busy port, the second a free one
        def randrange(self, low, _high):
            return low + next(calls)
    monkeypatch.setattr(ports.random, "SystemRandom", FixedRandom)
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: 65000)
    try:
        assert ports.free_port() == ports._LOWEST + 1  # pylint: disable=protected-access
    finally:
        taken.close()
