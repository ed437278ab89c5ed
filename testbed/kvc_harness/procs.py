"""Child processes and loopback ports: one reaper for everything a test or a
script starts, one free-port finder, one poll loop, and the Ray start-up every
run shares. Only 127.0.0.1 is ever bound."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from kvc_harness import HARNESS_ROOT, HOST


def free_ports(n: int) -> List[int]:
    """n distinct free TCP ports on loopback, chosen by the kernel (bound
    together so they differ, then released)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


class EnginePorts:
    """An engine process's three loopback ports (HTTP, KV-event PUB, replay
    ROUTER), fixed for its life so a restart comes back at the same
    addresses, and the addresses built from them (vllm-sim and real vLLM
    alike)."""

    def __init__(self) -> None:
        self.port, self.pub_port, self.replay_port = free_ports(3)

    @property
    def id(self) -> str:
        """The server id the router knows it by (host:port)."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.id}"

    @property
    def endpoint(self) -> str:
        return f"tcp://{HOST}:{self.pub_port}"

    @property
    def replay(self) -> str:
        return f"tcp://{HOST}:{self.replay_port}"


def ports_free(ports: Sequence[int]) -> bool:
    """Whether every given loopback port can be bound now (for programs such
    as ``vllm-sim --fleet`` that take a base port rather than a list)."""
    for p in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((HOST, p))
        except OSError:
            return False
        finally:
            s.close()
    return True


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """Polls pred until it returns a truthy value, which is returned; raises
    AssertionError naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when this process dies, even by
    SIGKILL (Linux PR_SET_PDEATHSIG). Only safe before any thread is started,
    as every preexec_fn."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort: the reaper still stops it
        pass


def stop_process(p: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM to the child's process group (children started with
    ``start_new_session=True`` lead their own), SIGKILL after `grace`."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            p.terminate()
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
            p.wait(5)
    for f in (p.stdout, p.stderr, p.stdin):
        if f is not None:
            f.close()


class Reaper:
    """Stops everything registered with it, newest first, once per
    registration: processes (whole process groups) and stop functions.

    Tests use it as a fixture (``close()`` in the finalizer); scripts create it
    with ``at_exit=True`` and call :meth:`install_signal_handlers`, so Ctrl-C,
    SIGTERM, SIGHUP and interpreter exit all run the same cleanup. A failing
    stop is reported on stderr and the rest still run."""

    def __init__(self, at_exit: bool = False) -> None:
        self._stops: List[Callable[[], None]] = []
        self._procs: List[subprocess.Popen] = []
        self._lock = threading.Lock()
        if at_exit:
            atexit.register(self.close)

    def add(self, stop: Callable[[], None]) -> None:
        with self._lock:
            self._stops.append(stop)

    def add_process(self, p: subprocess.Popen) -> None:
        """Registers a child; :meth:`close` stops it with :func:`stop_process`."""
        with self._lock:
            self._procs.append(p)
            self._stops.append(lambda: self.stop_process(p))

    def stop_process(self, p: subprocess.Popen, grace: float = 5.0) -> None:
        """Stops a registered child now (its later registration is a no-op)."""
        stop_process(p, grace)
        with self._lock:
            if p in self._procs:
                self._procs.remove(p)

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGHUP exit through ``finally`` blocks (SystemExit); SIGINT
        raises KeyboardInterrupt. Call again after ``ray.init``, which may
        install its own."""

        def handler(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGHUP, handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def close(self) -> None:
        main = threading.current_thread() is threading.main_thread()
        old: Dict[int, Any] = {}
        if main:
            # A second Ctrl-C must not cut the cleanup short.
            for s in (signal.SIGINT, signal.SIGTERM):
                old[s] = signal.getsignal(s)
                signal.signal(s, signal.SIG_IGN)
        try:
            while True:
                with self._lock:
                    if not self._stops:
                        break
                    stop = self._stops.pop()
                try:
                    stop()
                except Exception as e:  # noqa: BLE001 - cleanup must go on
                    print(f"cleanup: {type(e).__name__}: {e}", file=sys.stderr)
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    # What the demo and arena runners call at the end.
    run = close


class Cleanup(Reaper):
    """The reaper the long runs (demo, arena) use: it also runs at
    interpreter exit, so an exception anywhere still stops the fleet."""

    def __init__(self) -> None:
        super().__init__(at_exit=True)


def rss_bytes(pid: Optional[int] = None) -> int:
    """Resident set size of a process (default: this one) from /proc."""
    with open(f"/proc/{pid or 'self'}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def descendants(pid: int) -> List[int]:
    """Every live descendant of pid, from /proc."""
    children: Dict[int, List[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    """Whether pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: Sequence[int], timeout: float = 20.0) -> List[int]:
    """Waits for the pids to exit; returns those still alive after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def harness_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """A copy of `env` (default os.environ) whose PYTHONPATH starts with the
    directory holding kvc_harness, so child interpreters import it too."""
    out = dict(os.environ if env is None else env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != HARNESS_ROOT]
    out["PYTHONPATH"] = os.pathsep.join([HARNESS_ROOT, *parts])
    return out


#: The port of the node's Prometheus metrics export (Ray's metrics agent)
#: of the cluster start_ray started last.
RAY_METRICS_PORT: Optional[int] = None


def start_ray(num_cpus: int, namespace: Optional[str] = None) -> Any:
    """``ray.init`` for every run here: a private local cluster (never one
    RAY_ADDRESS points at), no dashboard, no usage stats, workers that can
    import kvc_harness (module-level actor classes such as RolloutWorker are
    pickled by reference), the metrics agent's Prometheus export on a free
    port (:data:`RAY_METRICS_PORT`). Returns the ray module; the caller shuts
    it down."""
    global RAY_METRICS_PORT
    # Ray's raylet and workers inherit this process's environment.
    os.environ["PYTHONPATH"] = harness_env()["PYTHONPATH"]
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray (2.60 here) enables token authentication for a new local cluster and
    # prints a notice saying so on every start; naming the mode keeps the
    # same (secure) behaviour without the notice. A user's own setting wins.
    # Only before Ray is imported: ray reads the mode once, at import, while
    # the GCS it starts reads the environment, so setting it afterwards (the
    # test session imports ray first) makes the driver's client send no token
    # to a GCS that wants one ("Failed to start GCS ... InvalidAuthToken").
    if "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    (port,) = free_ports(1)
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        namespace=namespace,
        _metrics_export_port=port,
    )
    RAY_METRICS_PORT = port
    return ray
