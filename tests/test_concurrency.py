"""Concurrency: 8 client actors x 1,000 acquire/release pairs against one
balancer actor (verl's shape: one LB shared by 8 AgentLoopWorkers), and 8
threads against one in-process balancer (the library is thread-safe and
ctypes releases the GIL)."""

from __future__ import annotations

import os
import threading
import time

import pytest
from kvc_harness.balancer import KVC_NO_COLLECTORS

N_CLIENTS = 8
PAIRS = 1000


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "kvc_aware"])
def test_eight_client_actors(ray_cluster, make_actor, mode):
    ray = ray_cluster
    kwargs = dict(servers={f"10.0.0.{i}:8000": None for i in range(4)}, max_cache_size=10000)
    if mode == "kvc_aware":
        kwargs["router_config"] = KVC_NO_COLLECTORS
    lb = make_actor(**kwargs)

    @ray.remote(num_cpus=0)
    class Client:
        def __init__(self, lb):
            self.lb = lb

        def run(self, tag, n):
            import ray as r

            seen = {}
            for i in range(n):
                rid = f"{tag}-{i % 50}"  # multi-turn: 50 sticky conversations per client
                sid, _ = r.get(self.lb.acquire_server.remote(request_id=rid, prompt_ids=list(range(i % 7, 64))))
                seen[sid] = seen.get(sid, 0) + 1
                self.lb.release_server.remote(server_id=sid)  # fire-and-forget, as verl does
            # Calls from one caller run in order: this sees all our releases.
            r.get(self.lb.get_inflight_count.remote(server_id="none"))
            return seen

    clients = [Client.remote(lb) for _ in range(N_CLIENTS)]
    results = ray.get([c.run.remote(f"c{k}", PAIRS) for k, c in enumerate(clients)], timeout=240)
    assert sum(sum(s.values()) for s in results) == N_CLIENTS * PAIRS
    deadline = time.time() + 30
    while ray.get(lb.get_total_inflight.remote()) != 0 and time.time() < deadline:
        time.sleep(0.1)
    assert ray.get(lb.get_total_inflight.remote()) == 0
    counters = ray.get(lb.get_status.remote())["router"]["counters"]
    assert counters["acquires"] == counters["releases"] == N_CLIENTS * PAIRS
    for c in clients:
        ray.kill(c)


@pytest.mark.parametrize("mode", [None, KVC_NO_COLLECTORS])
def test_threads_in_process(mode):
    from kvc_router import KVCAwareBalancer

    lb = KVCAwareBalancer({f"s{i}": i for i in range(4)}, router_config=mode)
    errors = []

    def worker(k):
        try:
            for i in range(PAIRS):
                sid, handle = lb.acquire_server(f"t{k}-{i % 20}", list(range(i % 5, 128)))
                assert handle == (99 if sid == "extra" else int(sid[1:])) or sid == "extra"
                lb.release_server(sid)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(N_CLIENTS)]
    for t in threads:
        t.start()
    # Membership churn while routing: add and remove a fifth server.
    for _ in range(50):
        lb.add_servers({"extra": 99})
        lb.remove_servers(["extra"])
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert lb.get_total_inflight() == 0
    lb.close()


class Handle:
    """A server handle that knows which id it was registered under."""

    __slots__ = ("sid",)

    def __init__(self, sid: str) -> None:
        self.sid = sid


# Acquires of the churn test (make chaos: KVR_CHURN_ACQUIRES=10000000).
CHURN_ACQUIRES = int(os.environ.get("KVR_CHURN_ACQUIRES", "120000"))


@pytest.mark.parametrize("mode", [None, KVC_NO_COLLECTORS])
def test_pool_churn_never_returns_a_missing_handle(mode):
    """Issue 20 D1: acquires racing add_servers/remove_servers must return the
    handle registered for the id they return, never None (verl then calls a
    method on None). 4 routing threads, 1 thread churning 4 of 6 servers."""
    from kvc_router import KVCAwareBalancer

    stable = {f"s{i}": Handle(f"s{i}") for i in range(2)}
    churned = [f"c{i}" for i in range(4)]
    lb = KVCAwareBalancer(dict(stable), router_config=mode)
    stop = threading.Event()
    per_thread = CHURN_ACQUIRES // 4
    results = []
    lock = threading.Lock()
    prompt = list(range(64))

    def router(k):
        done = bad = 0
        first_bad = None
        deadline = time.monotonic() + 600
        try:
            while done < per_thread and time.monotonic() < deadline:
                sid, handle = lb.acquire_server(f"t{k}-{done % 64}", prompt)
                done += 1
                if handle is None or handle.sid != sid:
                    bad += 1
                    first_bad = first_bad or (sid, handle)
                lb.release_server(sid)
        except Exception as e:  # noqa: BLE001
            first_bad = e
        with lock:
            results.append((done, bad, first_bad))

    def churn():
        i = 0
        while not stop.is_set():
            sid = churned[i % len(churned)]
            lb.add_servers({sid: Handle(sid)})
            if i % 3 == 0:
                lb.remove_servers(churned[(i + 1) % len(churned)])
            i += 1
        with lock:
            results.append(("churn", i))

    threads = [threading.Thread(target=router, args=(k,)) for k in range(4)]
    churner = threading.Thread(target=churn)
    t0 = time.monotonic()
    churner.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    churner.join()
    elapsed = time.monotonic() - t0
    routed = [r for r in results if r[0] != "churn"]
    changes = next(r[1] for r in results if r[0] == "churn")
    total = sum(r[0] for r in routed)
    bad = sum(r[1] for r in routed)
    retries = lb.get_status()["router"]["pool_change_retries"]
    print(
        f"pool churn: {total:,} acquires in {elapsed:.1f}s, {changes:,} pool changes, "
        f"{bad} missing/wrong handles, {retries} re-routed"
    )
    assert bad == 0 and total == 4 * per_thread, [r[2] for r in routed if r[2]][:3]
    assert changes > 10
    assert lb.get_total_inflight() == 0
    lb.close()


def test_acquire_routes_again_when_its_server_is_removed_meanwhile():
    """The rare half of D1, made deterministic: the library picks a server,
    and before the balancer looks its handle up the server is removed (another
    thread's remove_servers). The acquire is routed again, never (id, None)."""
    from kvc_router import KVCAwareBalancer

    lb = KVCAwareBalancer({"a": Handle("a"), "b": Handle("b")})
    real = lb._router.acquire
    removed = []

    def acquire_then_remove(*args):
        idx, gen, sid = real(*args[:3], args[3], -1)  # a stale generation: the id comes back
        if not removed:
            removed.append(sid)
            lb.remove_servers([sid])
        return idx, gen, sid

    lb._router.acquire = acquire_then_remove
    sid, handle = lb.acquire_server("r1")
    assert removed and sid != removed[0] and handle is not None and handle.sid == sid
    assert lb.get_status()["router"]["pool_change_retries"] == 1
    lb.close()
