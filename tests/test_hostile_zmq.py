"""Hostile ZMQ peers against the real library (issue 29 rows 1, 2, 11).

A KV-event publisher and a replay endpoint that complete the ZMTP handshake
and then lie: a frame header claiming 2^50 bytes (go-zeromq's reader died in
makeslice and took the process with it), a 400 MiB frame against a 1 MiB
``max_payload_bytes`` (read in full before: RSS to 840 MiB), MORE-flagged
frames without end, and a slow-loris greeting. The balancer must keep
routing, count every dropped connection, and return to its baseline memory.
``make chaos`` runs it with more rounds (KVR_CHAOS_ZMQ_ROUNDS)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Callable, List

import pytest
from kvc_harness.balancer import kvc_config, publisher_status
from kvc_harness.procs import rss_bytes
from kvc_router import KVCAwareBalancer

ROUNDS = int(os.environ.get("KVR_CHAOS_ZMQ_ROUNDS", "3"))
LIMIT = 1 << 20


def greeting() -> bytes:
    """A ZMTP 3.0 NULL greeting (rfc.zeromq.org 23/ZMTP), as a server."""
    return b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x01" + b"\x00" * 31


def ready(sock_type: bytes) -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(sock_type)) + sock_type
    return bytes([0x04, len(body)]) + body


def recv_exact(c: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = c.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def long_header(more: bool, size: int) -> bytes:
    return bytes([0x02 | (0x01 if more else 0)]) + struct.pack(">Q", size)


def huge_header(c: socket.socket) -> None:
    c.sendall(long_header(False, 1 << 50))
    c.recv(1)  # until the client drops us


def big_frame(c: socket.socket) -> None:
    c.sendall(long_header(False, 400 << 20))
    chunk = b"\x00" * (1 << 20)
    for _ in range(400):
        c.sendall(chunk)


def endless_more(c: socket.socket) -> None:
    frame = long_header(True, 64 << 10) + b"\x00" * (64 << 10)
    for _ in range(6400):  # 400 MiB
        c.sendall(frame)


def slow_loris(c: socket.socket) -> None:
    for b in greeting():
        c.sendall(bytes([b]))
        time.sleep(0.2)


class HostilePeer:
    """Accepts connections on loopback; each completes the handshake as
    `sock_type` (unless `handshake` is False) and then runs `script`."""

    def __init__(self, sock_type: bytes, script: Callable[[socket.socket], None], handshake: bool = True) -> None:
        self.sock_type, self.script, self.handshake = sock_type, script, handshake
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.endpoint = f"tcp://127.0.0.1:{self.lsock.getsockname()[1]}"
        self.accepted = 0
        self.conns: List[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            if self.handshake:
                c.sendall(greeting())
                recv_exact(c, 64)
                c.sendall(ready(self.sock_type))
                n = recv_exact(c, 2)[1]  # the client's READY
                recv_exact(c, n)
            self.script(c)
        except OSError:
            pass
        finally:
            c.close()

    def close(self) -> None:
        self.closed = True
        self.lsock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


SCRIPTS = {
    "2^50 header": (huge_header, True),
    "400 MiB frame": (big_frame, True),
    "endless MORE frames": (endless_more, True),
    "slow-loris greeting": (slow_loris, False),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_hostile_zmq_peer_is_dropped_and_counted(name: str) -> None:
    script, handshake = SCRIPTS[name]
    pub = HostilePeer(b"PUB", script, handshake)
    replay = HostilePeer(b"ROUTER", script, handshake)
    cfg = kvc_config(
        endpoints={"s0": [{"endpoint": pub.endpoint, "replay": replay.endpoint}]},
        collectors=("vllm_zmq",),
        log_level="error",
        collector={"max_payload_bytes": LIMIT, "retry_ms": 50, "replay_timeout_ms": 3000},
    )
    lb = KVCAwareBalancer({"s0": None, "s1": None}, router_config=cfg)
    try:
        rss0 = rss_bytes()

        def dropped() -> int:
            p = publisher_status(lb.get_status(), "s0")
            return p.get("oversized_frames", 0) + p.get("protocol_errors", 0)

        peak = rss0
        t0 = time.monotonic()
        want = ROUNDS if handshake else 2
        while dropped() < want:
            assert time.monotonic() - t0 < 60 + 10 * ROUNDS, f"{name}: {publisher_status(lb.get_status(), 's0')}"
            sid, _ = lb.acquire_server(f"r{time.monotonic()}", list(range(64)))  # routing goes on
            lb.release_server(sid)
            peak = max(peak, rss_bytes())
            time.sleep(0.02)
        pub.close()
        replay.close()
        time.sleep(0.5)
        rss1 = rss_bytes()
        st = publisher_status(lb.get_status(), "s0")
        print(
            f"\nhostile zmq peer ({name}): {dropped()} connections dropped "
            f"(oversized {st.get('oversized_frames')}, protocol {st.get('protocol_errors')}, dials {st.get('dials')}); "
            f"RSS {rss0 / 2**20:.0f} -> peak {peak / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB"
        )
        assert st["panics"] == 0
        assert st["oversized_frames" if handshake else "protocol_errors"] >= 1
        # Bounded by the 1 MiB limit plus framing, never by what the peer claims.
        assert peak - rss0 < 64 << 20, (rss0, peak)
        assert rss1 - rss0 < 64 << 20, (rss0, rss1)
        assert lb.get_total_inflight() == 0
    finally:
        pub.close()
        replay.close()
        lb.close()
