"""Concurrency: 8 client actors x 1,000 acquire/release pairs against one
balancer actor (verl's shape: one LB shared by 8 AgentLoopWorkers), and 8
threads against one in-process balancer (the library is thread-safe and
ctypes releases the GIL)."""

from __future__ import annotations

import threading
import time

import pytest
from kvc_harness.balancer import KVC_NO_COLLECTORS

N_CLIENTS = 8
PAIRS = 1000


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
