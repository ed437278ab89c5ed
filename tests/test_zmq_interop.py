"""Interop with the real libzmq: pyzmq publishes vLLM-format KV-event batches
(both event encodings), a Python ROUTER answers replay requests in both reply
layouts, and the Go subscriber (`kvctl watch`) decodes them."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

ROOT = Path(__file__).resolve().parents[1]
END_SEQ = b"\xff" * 8


@pytest.fixture(scope="module")
def kvctl(tmp_path_factory: pytest.TempPathFactory) -> str:
    go = shutil.which("go")
    if go is None:
        pytest.fail("the Go toolchain is required to build kvctl")
    out = tmp_path_factory.mktemp("bin") / "kvctl"
    subprocess.run([go, "build", "-o", str(out), "./cmd/kvctl"], cwd=ROOT, check=True)
    return str(out)


def stored(hashes: list[int], tokens: list[int], layout: str, parent: int | None = None) -> object:
    """One BlockStored as vLLM encodes it: positional (<= ~0.23) or tagged map."""
    if layout == "array":
        return ["BlockStored", hashes, parent, tokens, 16, None, "GPU", None]
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": 16,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def removed(hashes: list[int], layout: str) -> object:
    if layout == "array":
        return ["BlockRemoved", hashes, "GPU"]
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


class Publisher:
    """vLLM's ZmqEventPublisher protocol on real libzmq sockets."""

    def __init__(self, reply_layout: int) -> None:
        self.ctx = zmq.Context()
        # XPUB: a PUB that also hands us its subscribers' subscriptions, so
        # a test can wait for one instead of sleeping.
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub_port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.topic = b"kv@127.0.0.1@model"
        self.reply_layout = reply_layout
        self.buffer: dict[int, bytes] = {}
        self.seq = 0
        self.replay_requests: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            ident, start = frames[0], struct.unpack(">Q", frames[2])[0]
            self.replay_requests.append(start)
            for seq in sorted(s for s in self.buffer if s >= start):
                seq_b = struct.pack(">Q", seq)
                if self.reply_layout == 3:
                    self.router.send_multipart([ident, b"", self.topic, seq_b, self.buffer[seq]])
                else:
                    self.router.send_multipart([ident, b"", seq_b, self.buffer[seq]])
            if self.reply_layout == 3:
                self.router.send_multipart([ident, b"", b"", END_SEQ, b""])
            else:
                self.router.send_multipart([ident, b"", END_SEQ, b""])

    def wait_subscribed(self, timeout_s: float) -> bool:
        """Wait until a subscriber's subscription has reached the socket."""
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            if self.pub.poll(int(left * 1000), zmq.POLLIN) and self.pub.recv()[:1] == b"\x01":
                return True
        return False

    def publish(self, events: list[object], drop: bool = False) -> int:
        payload = msgpack.packb([time.time(), events, 0], use_bin_type=True)
        seq = self.seq
        self.seq += 1
        self.buffer[seq] = payload
        if not drop:
            self.pub.send_multipart([self.topic, struct.pack(">Q", seq), payload])
        return seq

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.pub.close(linger=0)
        self.router.close(linger=0)
        self.ctx.term()


@pytest.mark.parametrize("layout", ["array", "map"])
@pytest.mark.parametrize("reply_layout", [2, 3])
def test_kvctl_watch_decodes_libzmq_publisher_and_replays_gap(kvctl: str, layout: str, reply_layout: int) -> None:
    pub = Publisher(reply_layout)
    try:
        proc = subprocess.Popen(
            [
                kvctl,
                "watch",
                f"tcp://127.0.0.1:{pub.pub_port}",
                "--replay",
                f"tcp://127.0.0.1:{pub.replay_port}",
                "--topic",
                "kv@",
                "--count",
                "4",
                "--duration",
                "20s",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        big = 0xDEADBEEFCAFEBABE  # >= 2**63: msgpack uint64
        tokens = list(range(1, 33))
        # Seq 0 and 1 are published before the subscriber joins (lost to the
        # slow joiner) and seq 3 is dropped: all three come back via replay.
        pub.publish([stored([big, 7], tokens, layout)])
        pub.publish([removed([7], layout)])
        assert pub.wait_subscribed(20), "kvctl never subscribed"  # 0 and 1 went before it
        pub.publish([stored([11], list(range(100, 116)), layout, parent=big)])
        pub.publish([["AllBlocksCleared"] if layout == "array" else {"type": "AllBlocksCleared"}], drop=True)
        # Keep publishing no-op batches until kvctl has its 4 batches.
        deadline = time.time() + 15
        while proc.poll() is None and time.time() < deadline:
            pub.publish([])
            time.sleep(0.05)
        out, err = proc.communicate(timeout=10)
    finally:
        pub.close()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    by_seq: dict[int, list[dict]] = {}
    for ev in events:
        by_seq.setdefault(ev["seq"], []).append(ev)
    assert sorted(by_seq)[:4] == [0, 1, 2, 3], (by_seq.keys(), err)
    first = by_seq[0][0]
    assert first["type"] == "BlockStored"
    assert first["block_hashes"] == [big, 7]
    assert first["token_ids"] == tokens
    assert first["block_size"] == 16
    assert first["medium"] == "GPU"
    assert first["parent_block_hash"] is None
    assert first["dp_rank"] == 0
    assert by_seq[1][0] == {**by_seq[1][0], "type": "BlockRemoved", "block_hashes": [7]}
    assert by_seq[2][0]["parent_block_hash"] == big
    assert by_seq[3][0]["type"] == "AllBlocksCleared"
    assert pub.replay_requests, "the gap was not replayed"
