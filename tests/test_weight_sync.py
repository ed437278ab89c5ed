"""verl's weight sync against engines that report their prefix-cache reset
late, as vLLM does: /reset_prefix_cache queues AllBlocksCleared and the
engine publishes it with its next step, which is the next rollout's first.
Real Ray, a real vllm-sim fleet (``--kv-events-lazy-clear``), the balancer's
own ZMQ subscriptions and /metrics poller."""

from __future__ import annotations

import time
from typing import Any, Dict, List

from kvc_harness import client, fleet
from kvc_harness.arena import sim_binary
from kvc_harness.balancer import index_server, router_config, wait_collectors
from kvc_harness.procs import Cleanup, wait_for


def prompt(seed: int, n: int) -> List[int]:
    return [(seed * 7919 + 31 * t) % 30000 + 1 for t in range(n)]


def index_of(ray: Any, lb: Any, sid: str) -> Dict[str, Any]:
    return index_server(ray.get(lb.get_status.remote()), sid)


def test_late_engine_reset_keeps_the_next_rollouts_placements(ray_cluster, tmp_path):
    """After the sync, the router places a group's first samples on one
    server before that engine has run a step; the engine's first step (here
    another request) then publishes the reset. The group's next sample must
    still follow its siblings: the late clear drops what the engine held
    under the old weights and keeps the router's new placements."""
    from kvc_router import KVCAwareBalancer

    ray = ray_cluster
    cleanup = Cleanup()
    try:
        flags = ["--kv-events-lazy-clear", "--speed", "0", "--num-gpu-blocks", "16384"]
        _, srv, _ = fleet.start_sim_fleet(sim_binary(), 3, cleanup, flags, str(tmp_path / "sim.log"))
        urls = fleet.urls(srv)
        client.wait_healthy(urls)
        cfg = router_config("kvc_aware", srv)
        assert cfg is not None
        # Siblings follow their prefix holder: the group and task spreads, and a
        # fresh router's presumption that siblings are multi-turn sessions
        # (session_weight), would split them on purpose.
        cfg["config"]["strategies"][0].update(group_spread=0, task_spread=0, session_weight=0)
        lb = ray.remote(KVCAwareBalancer).remote(
            servers={s.sid: None for s in srv}, max_cache_size=10000, router_config=cfg
        )
        try:
            assert wait_collectors(ray, lb)
            # The step before the sync: every engine holds a prompt.
            for i, s in enumerate(srv):
                client.complete(s.url, prompt(i + 1, 64), max_tokens=2)
            wait_for(lambda: all(index_of(ray, lb, s.sid).get("entries", 0) > 0 for s in srv), 10, "step 1's events")

            client.reset_prefix_caches(urls)
            ray.get(lb.reset_prefix_index.remote())
            time.sleep(0.3)  # an idle engine publishes nothing, however long it waits
            assert [index_of(ray, lb, s.sid)["reset_clears"] for s in srv] == [0, 0, 0]

            p = prompt(99, 16 * 128 + 1)
            got = [ray.get(lb.acquire_server.remote(request_id=f"g-{i}", prompt_ids=p))[0] for i in range(3)]
            holder = got[0]
            assert got == [holder] * 3, got

            # The holder's first step of the new rollout publishes its reset.
            client.complete(urls[holder], prompt(7, 64), max_tokens=2)
            wait_for(lambda: index_of(ray, lb, holder)["reset_clears"] == 1, 10, "the holder's late reset")
            ix = index_of(ray, lb, holder)
            assert ix["kept_speculative"] >= 128, ix  # the group's 128 prompt blocks

            d = ray.get(lb.acquire_server_detail.remote(request_id="g-3", prompt_ids=p))
            assert d["server"] == holder and d["hit_blocks"][0] == 128, d
            # The other engines have not stepped: their resets are still to come.
            assert [index_of(ray, lb, s.sid)["reset_clears"] for s in srv if s.sid != holder] == [0, 0]
        finally:
            ray.kill(lb)
    finally:
        cleanup.run()
