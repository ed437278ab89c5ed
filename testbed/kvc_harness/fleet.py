"""vllm-sim processes on loopback: one server with fixed ports that a test
kills and restarts (:class:`Sim`), or a ``--fleet`` of them for a run
(:func:`start_sim_fleet`), and the JSON server descriptions both print and
``testbed/scripts/gpu-validate.sh`` writes for real vLLM servers (:class:`Server`).

Everything started is registered with a :class:`~kvc_harness.procs.Reaper`."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from kvc_harness import HOST, REPO, client
from kvc_harness.procs import EnginePorts, Reaper, die_with_parent, ports_free, stop_process, wait_for


def sim_binary() -> str:
    """The vllm-sim binary: $KVR_VLLM_SIM, bin/vllm-sim, else built into bin/."""
    env = os.environ.get("KVR_VLLM_SIM")
    if env:
        return env
    path = os.path.join(REPO, "bin", "vllm-sim")
    if not os.path.isfile(path):
        go = shutil.which("go")
        if go is None:
            raise RuntimeError("bin/vllm-sim is missing and no Go toolchain to build it")
        subprocess.run([go, "build", "-o", path, "./cmd/vllm-sim"], cwd=REPO, check=True, timeout=600)
    return path


class Sim(EnginePorts):
    """One vllm-sim process with fixed HTTP, KV-event and replay ports, so a
    restart comes back at the same addresses."""

    def __init__(self, reaper: Reaper, extra: Optional[List[str]] = None, speed: float = 0.0) -> None:
        super().__init__()
        self.extra = list(extra or [])
        self.speed = speed
        self.proc: Optional[subprocess.Popen] = None
        self.info: Dict[str, Any] = {}
        self.restarts = 0
        reaper.add(self.stop)

    def start(self, timeout: float = 30.0) -> Sim:
        cmd = [
            sim_binary(),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--kv-events-endpoint",
            self.endpoint,
            "--kv-events-replay-endpoint",
            self.replay,
            "--speed",
            str(self.speed),
            "--log-level",
            "warn",
            *self.extra,
        ]
        # No die_with_parent here: tests start and restart sims while threads
        # run, where a preexec_fn is unsafe; the reaper stops them instead.
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # one JSON line once listening
        if not line:
            self.stop()
            raise RuntimeError(f"vllm-sim exited at start: {cmd}")
        self.info = json.loads(line)
        wait_for(self.healthy, timeout, f"{self.id} /health")
        return self

    def healthy(self) -> bool:
        return client.healthy(self.url)

    def kill(self) -> None:
        """SIGKILL: no goodbye, as a crashed engine."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def restart(self, timeout: float = 30.0) -> Sim:
        self.kill()
        self.restarts += 1
        deadline = time.monotonic() + timeout
        while True:  # the ports may linger for a moment after the kill
            try:
                return self.start(timeout)
            except (RuntimeError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)

    def complete(self, prompt: List[int], max_tokens: int = 1, timeout: float = 10.0) -> Dict[str, Any]:
        return client.complete(self.url, prompt, max_tokens, timeout)

    def drop_events(self, n: int) -> None:
        """Withholds the next n KV-event batches (the simulator's fault hook)."""
        client.request_json(f"{self.url}/sim/drop_kv_events?next={n}", "POST", timeout=5)

    def cached_blocks(self) -> Any:
        return client.request_json(self.url + "/sim/cached_blocks", timeout=5)

    def endpoints_config(self, replay: bool = True) -> List[Dict[str, str]]:
        ep = {"endpoint": self.endpoint}
        if replay:
            ep["replay"] = self.replay
        return [ep]


@dataclass
class Server:
    """One server to route to, as vllm-sim prints it and gpu-validate.sh
    writes it for vLLM: url, KV-event (and replay) endpoints, topic."""

    sid: str  # host:port, as verl names servers
    url: str
    events: List[str] = field(default_factory=list)
    replay: List[str] = field(default_factory=list)
    topic: str = ""

    @staticmethod
    def from_json(d: dict) -> Server:
        host, port = client.split_url(d["url"])
        return Server(
            sid=f"{host}:{port}",
            url=d["url"].rstrip("/"),
            events=list(d.get("kv_events_endpoints") or []),
            replay=list(d.get("kv_events_replay_endpoints") or []),
            topic=d.get("topic") or "",
        )


def read_servers_file(path: str) -> List[Server]:
    """Servers from a JSON-lines file; SystemExit when it lists none."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(Server.from_json(json.loads(line)))
    if not out:
        raise SystemExit(f"{path}: no servers")
    return out


def urls(servers: Sequence[Server]) -> Dict[str, str]:
    """{server id: base URL}."""
    return {s.sid: s.url for s in servers}


def start_sim_fleet(
    binary: str,
    n: int,
    cleanup: Reaper,
    extra: Sequence[str],
    log_path: str,
    tries: int = 20,
    timeout: float = 30.0,
) -> Tuple[subprocess.Popen, List[Server], List[str]]:
    """Starts ``vllm-sim --fleet n`` on free loopback ports, tied to this
    process's life (start it before any thread); returns (Popen, servers, cmd)."""
    rng = random.Random(os.getpid() ^ int(time.time() * 1000))
    last = ""
    for _ in range(tries):
        # The fleet takes base ports, not a list: pick a range and check it.
        base = rng.randrange(20000, 40000)
        ev = base + 100
        if not ports_free(list(range(base, base + n)) + list(range(ev, ev + 2 * n))):
            continue
        cmd = [
            binary,
            "--fleet",
            str(n),
            "--base-port",
            str(base),
            "--base-event-port",
            str(ev),
            "--log-level",
            "warn",
            *extra,
        ]
        log = open(log_path, "ab")
        try:
            p = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        finally:
            log.close()
        cleanup.add_process(p)
        servers, err = _read_fleet_lines(p, n, timeout)
        if servers is not None:
            return p, servers, cmd
        cleanup.stop_process(p)
        last = err
    raise RuntimeError(f"could not start the vllm-sim fleet: {last}")


def _read_fleet_lines(p: subprocess.Popen, n: int, timeout: float) -> Tuple[Optional[List[Server]], str]:
    lines: List[dict] = []
    box: Dict[str, Any] = {}

    def reader() -> None:
        try:
            assert p.stdout is not None
            for raw in p.stdout:
                lines.append(json.loads(raw))
                if len(lines) == n:
                    return
        except Exception as e:  # noqa: BLE001 - reported by the caller
            box["err"] = str(e)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if len(lines) == n:
        return [Server.from_json(d) for d in lines], ""
    return None, box.get("err") or f"fleet exited with {p.poll()} after {len(lines)} of {n} servers"
