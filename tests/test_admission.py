"""Router-side admission through the Python balancer (kvc_router.admission)
and the client batcher, against real Ray actors.

With ``admission: {enabled: true}`` the router holds an acquire while every
server has its cap in flight; the actor must keep serving the releases that
free those slots, a held caller must get ``(server_id, handle)`` exactly as
an unheld one, and nothing may leak when callers give up."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from typing import Any, Dict, List

import pytest
from kvc_harness.wire import metrics_text
from kvc_router import (
    AdmissionQueueFullError,
    ConfigError,
    KVCAwareAdmissionBalancer,
    KVCAwareBalancer,
    RouterConfig,
    batching,
)
from kvc_router.admission import Held
from kvc_router.verl import actor as verl_actor


def config(max_inflight: int = 2, max_queue: int = 1024, enabled: bool = True) -> Dict[str, Any]:
    return {
        "type": "kvc_aware",
        "config": {
            "strategies": [{"name": "kvc_aware", "collector_names": []}],
            "admission": {"enabled": enabled, "max_inflight": max_inflight, "max_queue": max_queue},
        },
    }


def servers(n: int) -> Dict[str, Any]:
    return {f"10.0.1.{i}:8000": f"handle-{i}" for i in range(n)}


def prompt(i: int, n: int = 64) -> List[int]:
    return [1000 * (i + 1) + t for t in range(n)]


@pytest.fixture
def admission_actor(ray_cluster):
    """Balancer actors made the way the verl integration makes them
    (kvc_router.verl.actor.create_actor picks the class and options)."""
    made = []

    def make(srv: Dict[str, Any], block: Dict[str, Any]) -> Any:
        lb = verl_actor.create_actor(srv, block, False)
        made.append(lb)
        return lb

    yield make
    for lb in made:
        ray_cluster.kill(lb)


def status(ray: Any, lb: Any) -> Dict[str, Any]:
    return ray.get(lb.get_status.remote())


def wait_until(pred: Any, timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(0.02)


# -- configuration and class choice -------------------------------------------


def test_sync_balancer_refuses_admission_and_names_the_class():
    with pytest.raises(ConfigError) as e:
        KVCAwareBalancer(servers(1), router_config=config())
    assert e.value.key == "config.admission.enabled"
    assert "kvc_router.KVCAwareAdmissionBalancer" in str(e.value)
    # Off (or default mode) is fine for the sync class.
    KVCAwareBalancer(servers(1), router_config=config(enabled=False)).close()


def test_the_integration_picks_the_admission_class_and_options():
    assert verl_actor.balancer_class(config()) is KVCAwareAdmissionBalancer
    assert verl_actor.actor_options(config()) == {"max_concurrency": verl_actor.ADMISSION_MAX_CONCURRENCY}
    assert verl_actor.balancer_class(config(enabled=False)) is KVCAwareBalancer
    assert verl_actor.actor_options(config(enabled=False)) == {}
    bound = verl_actor.bound_balancer_class(config(), False)
    assert issubclass(bound, KVCAwareAdmissionBalancer) and bound.__name__ == "KVCAwareAdmissionBalancer"


@pytest.mark.parametrize(
    "block, hook_admits",
    [
        ({"type": "kvc_aware"}, True),  # the packaged defaults: auto
        ("kvc_aware", True),
        ({"type": "kvc_aware", "config": {"admission": {"enabled": "auto", "max_inflight": 3}}}, True),
        ({"type": "kvc_aware", "config": {"admission": {"max_inflight": 3}}}, True),
        ({"type": "kvc_aware", "config": {"admission": {"enabled": False}}}, False),
        ({"type": "kvc_aware", "config": {"turns": "single"}}, True),
        ({"type": "kvc_aware", "config": {"turns": "multi"}}, False),  # agent loops: auto is off
        ({"type": "kvc_aware", "config": {"turns": "multi", "admission": {"enabled": True}}}, True),
        ({"type": "default"}, False),
        (None, False),
    ],
)
def test_admission_auto_is_on_where_the_balancer_can_hold(block, hook_admits):
    """admission.enabled defaults to auto: verl's hook creates the async
    admission class for kvc_aware and admission runs there, unless the
    rollout is multi-turn; the synchronous class takes the same block with
    admission off instead of refusing it (an explicit true it refuses)."""
    want = KVCAwareAdmissionBalancer if hook_admits else KVCAwareBalancer
    assert verl_actor.balancer_class(block) is want
    assert ("max_concurrency" in verl_actor.actor_options(block)) is hook_admits
    explicit = isinstance(block, dict) and (block.get("config") or {}).get("admission", {}).get("enabled") is True
    if explicit:
        with pytest.raises(ConfigError):
            KVCAwareBalancer(servers(1), router_config=block)
        return
    sync = KVCAwareBalancer(servers(1), router_config=block)
    try:
        assert sync.get_status()["router"]["admission"]["enabled"] is False
        assert sync._config.effective["router"]["admission"]["enabled"] is False
    finally:
        sync.close()
    if block is not None:
        adm = KVCAwareAdmissionBalancer(servers(1), router_config=block)
        try:
            assert adm.get_status()["router"]["admission"]["enabled"] is hook_admits
        finally:
            adm.close()


def test_admission_enabled_takes_only_true_false_or_auto():
    for bad in ("on", 1, "yes"):
        with pytest.raises(ConfigError) as e:
            block = {"type": "kvc_aware", "config": {"admission": {"enabled": bad}}}
            KVCAwareAdmissionBalancer(servers(1), router_config=block)
        assert e.value.key == "config.admission.enabled"
        assert 'true, false or "auto"' in str(e.value)


def test_the_verl_integration_tells_the_router_the_rollouts_turns():
    """turns from verl's rollout config: multi_turn.enable or an agent loop
    other than single_turn_agent -> multi, else single; a value the user
    set, or a router not in kvc_aware mode, is left alone."""
    turns = verl_actor.session_turns
    block = {"type": "kvc_aware", "config": {"admission": {"enabled": True}}}
    grpo = {"multi_turn": {"enable": False}, "agent": {"default_agent_loop": "single_turn_agent"}}
    assert turns(block, grpo) == {"type": "kvc_aware", "config": {"admission": {"enabled": True}, "turns": "single"}}
    assert block == {"type": "kvc_aware", "config": {"admission": {"enabled": True}}}  # not mutated
    assert turns(block, {"multi_turn": {"enable": True}})["config"]["turns"] == "multi"
    assert turns(block, {"agent": {"default_agent_loop": "tool_agent"}})["config"]["turns"] == "multi"
    assert turns(block, {})["config"]["turns"] == "single"
    assert turns(block, None)["config"]["turns"] == "single"
    mine = {"type": "kvc_aware", "config": {"turns": "auto"}}
    assert turns(mine, {"multi_turn": {"enable": True}}) is mine
    plain = {"type": "default", "config": {}}
    assert turns(plain, {"multi_turn": {"enable": True}}) == {"type": "default", "config": {}}

    @dataclasses.dataclass
    class MultiTurn:
        enable: bool = True

    @dataclasses.dataclass
    class Rollout:
        multi_turn: MultiTurn = dataclasses.field(default_factory=MultiTurn)

    assert turns(block, Rollout())["config"]["turns"] == "multi"
    assert turns(block, Rollout(MultiTurn(False)))["config"]["turns"] == "single"


def test_the_verl_integration_tells_the_router_the_response_length():
    """response_tokens (group_spread's gate) from rollout.response_length; a
    value the user set, a missing or nonsensical length: left alone."""
    told = verl_actor.session_turns
    block = {"type": "kvc_aware", "config": {}}
    assert told(block, {"response_length": 8192})["config"] == {"turns": "single", "response_tokens": 8192}
    for bad in (None, 0, -1, True, "8192", 1 << 25):
        assert "response_tokens" not in told(block, {"response_length": bad})["config"], bad
    mine = {"type": "kvc_aware", "config": {"turns": "single", "response_tokens": 512}}
    assert told(mine, {"response_length": 8192}) is mine
    # The library takes what the hook sets (and the gate's key).
    cfg = RouterConfig(type="kvc_aware", **told(block, {"response_length": 8192})["config"])
    assert cfg.effective["router"]["response_tokens"] == 8192
    assert cfg.strategies[0]["params"]["group_spread_min_ratio"] == 4.0
    with pytest.raises(ConfigError, match="response_tokens"):
        RouterConfig(type="kvc_aware", response_tokens=-3)


def test_the_verl_integration_caps_admission_at_the_rollout_slots():
    """No cap set: max_num_seqs x data_parallel_size x headroom from the
    rollout config; a cap the user set (either key) or admission off: unchanged."""
    cap = verl_actor.admission_cap
    assert cap(config(max_inflight=0), 96, 2)["config"]["admission"]["max_inflight"] == 192
    halved = config(max_inflight=0)
    halved["config"]["admission"]["headroom"] = 0.5
    assert cap(halved, 96, 1)["config"]["admission"]["max_inflight"] == 48
    assert cap(config(max_inflight=7), 96, 2) == config(max_inflight=7)
    with_load = config(max_inflight=0)
    with_load["config"]["load"] = {"max_num_seqs": 32}
    assert cap(with_load, 96, 2) == with_load
    assert cap(config(max_inflight=0, enabled=False), 96, 2) == config(max_inflight=0, enabled=False)
    assert cap(config(max_inflight=0), None, 1) == config(max_inflight=0)
    assert cap(config(max_inflight=0), True, 1) == config(max_inflight=0)
    block = config(max_inflight=0)
    cap(block, 96, 1)
    assert block == config(max_inflight=0), "the caller's block was modified"


def test_submit_routes_again_when_its_server_is_removed_meanwhile():
    """The admission path shares acquire_server's race handling: the library
    admits to a server that is removed before its handle is looked up; the
    request is routed again (counted), never answered with (id, None)."""
    lb = KVCAwareAdmissionBalancer(servers(2), router_config=config(max_inflight=8))
    real = lb._router.submit
    removed: List[str] = []

    def submit_then_remove(rid, addr, n, pin, known, ticket, **kw):
        got = real(rid, addr, n, pin, -1, ticket, **kw)  # a stale generation: the id comes back
        if got is not None and not removed:
            removed.append(got[2])
            lb.remove_servers([got[2]])
        return got

    lb._router.submit = submit_then_remove
    try:
        sid, handle = asyncio.run(lb.acquire_server("r1", prompt(0)))
        assert removed and sid != removed[0] and handle == servers(2)[sid]
        assert lb.get_status()["router"]["pool_change_retries"] == 1
    finally:
        lb.close()


# -- the actor -------------------------------------------------------------------


def test_held_acquires_are_admitted_as_slots_free(ray_cluster, admission_actor):
    ray = ray_cluster
    srv = servers(2)
    lb = admission_actor(srv, config(max_inflight=2))
    first = ray.get([lb.acquire_server.remote(f"r{i}", prompt(i)) for i in range(4)])
    assert sorted(s for s, _ in first) == sorted(list(srv) * 2)
    assert all(h == srv[s] for s, h in first)
    held = [lb.acquire_server.remote(f"h{i}", prompt(10 + i)) for i in range(3)]
    ready, _ = ray.wait(held, num_returns=1, timeout=0.5)
    assert not ready, "an acquire returned while every server had its cap in flight"
    assert wait_until(lambda: status(ray, lb)["router"]["admission"]["held"] == 3)
    # Releases keep flowing while acquires are held; each frees one slot.
    for i, (sid, _) in enumerate(first[:3]):
        ray.get(lb.release_server.remote(sid))
        ready, held = ray.wait(held, num_returns=1, timeout=20)
        got = ray.get(ready[0])
        assert got == (sid, srv[sid]), f"release {i} on {sid} admitted {got}"
        assert ray.get(lb.get_inflight_count.remote(sid)) <= 2
    assert held == []
    st = status(ray, lb)["router"]["admission"]
    assert st["held"] == 0 and st["admitted_total"] == 3 and st["queued_total"] == 3 and st["enabled"] is True
    assert st["waiting_callers"] == 0 and st["unclaimed"] == 0
    assert ray.get(lb.get_total_inflight.remote()) == 4


def test_a_queuing_engine_takes_no_held_request(ray_cluster, admission_actor):
    """admission.engine_queue 1: a server whose last scrape counted waiting
    requests takes no held acquire, even far below its slot cap; once a scrape
    shows one engine's queue gone, the actor's pump admits the held acquires
    there, and not on the server still queuing."""
    ray = ray_cluster
    srv = servers(2)
    cfg = config(max_inflight=8)
    cfg["config"]["admission"]["engine_queue"] = 1
    lb = admission_actor(srv, cfg)
    a, b = list(srv)
    first = ray.get([lb.acquire_server.remote(f"r{i}", prompt(i)) for i in range(2)])
    assert sorted(s for s, _ in first) == sorted([a, b])
    for sid in srv:
        assert ray.get(lb.update_metrics.remote(sid, metrics_text(running=1, waiting=2)))
    held = [lb.acquire_server.remote(f"h{i}", prompt(10 + i)) for i in range(2)]
    ready, _ = ray.wait(held, num_returns=1, timeout=0.5)
    assert not ready, "an acquire was placed on an engine that is queuing"
    assert wait_until(lambda: status(ray, lb)["router"]["admission"]["held"] == 2)
    assert ray.get(lb.update_metrics.remote(b, metrics_text(running=1, waiting=0)))
    got = ray.get(held, timeout=20)
    assert [s for s, _ in got] == [b, b], got
    assert ray.get(lb.get_inflight_count.remote(a)) == 1


def test_a_new_server_admits_held_requests_through_the_pump(ray_cluster, admission_actor):
    ray = ray_cluster
    lb = admission_actor(servers(1), config(max_inflight=1))
    ray.get(lb.acquire_server.remote("r0", prompt(0)))
    held = lb.acquire_server.remote("r1", prompt(1))
    assert not ray.wait([held], timeout=0.3)[0]
    ray.get(lb.add_servers.remote({"10.0.2.1:8000": "new"}))
    assert ray.get(held, timeout=20) == ("10.0.2.1:8000", "new")
    assert status(ray, lb)["router"]["admission"]["pumps"] >= 1


def test_no_acquire_is_held_while_a_server_has_room(ray_cluster, admission_actor):
    """Random acquires and releases through the actor: a request is held
    only when every server was at its cap, a routed one only goes where there
    was room, and in flight never exceeds the caps."""
    ray = ray_cluster
    cap, n_srv = 3, 3
    srv = servers(n_srv)
    lb = admission_actor(srv, config(max_inflight=cap))
    for seed in (1, 2, 3):
        rng = random.Random(seed)
        running: List[str] = []
        tickets: List[int] = []
        holds = 0
        for step in range(120):
            before = status(ray, lb)["servers"]
            if running and rng.random() < 0.45:
                sid = running.pop(rng.randrange(len(running)))
                (out,) = [ray.get(lb.route_batch.remote([sid], []))]
                assert out == []
            else:
                (res,) = ray.get(lb.route_batch.remote([], [(f"s{seed}-{step}", prompt(rng.randrange(6)))]))
                if isinstance(res, Held):
                    assert all(v >= cap for v in before.values()), f"held with room: {before}"
                    tickets.append(res.ticket)
                    holds += 1
                else:
                    assert before[res[0]] < cap, f"routed to a full server: {res[0]} {before}"
                    running.append(res[0])
            if tickets:
                for t, got in ray.get(lb.await_admission.remote(tickets, 0.0)):
                    tickets.remove(t)
                    assert not isinstance(got, BaseException)
                    running.append(got[0])
            after = status(ray, lb)["servers"]
            assert all(v <= cap for v in after.values()), after
            assert sum(after.values()) == len(running)
        assert holds > 10, f"seed {seed}: only {holds} holds: the sequence does not test admission"
        # Drain: every release admits a held request until none is left.
        while running or tickets:
            if running:
                ray.get(lb.release_server.remote(running.pop()))
            for t, got in ray.get(lb.await_admission.remote(tickets, 0.0)) if tickets else []:
                tickets.remove(t)
                running.append(got[0])
            assert len(tickets) == 0 or running, "requests held while nothing runs"
        assert ray.get(lb.get_total_inflight.remote()) == 0


def test_queue_full_is_a_precise_error(ray_cluster, admission_actor):
    ray = ray_cluster
    lb = admission_actor(servers(1), config(max_inflight=1, max_queue=2))
    ray.get(lb.acquire_server.remote("r0", prompt(0)))
    held = [lb.acquire_server.remote(f"h{i}", prompt(i + 1)) for i in range(2)]
    assert wait_until(lambda: status(ray, lb)["router"]["admission"]["held"] == 2)
    with pytest.raises(AdmissionQueueFullError, match=r"admission queue full: 2 requests held \(admission.max_queue\)"):
        ray.get(lb.acquire_server.remote("over", prompt(9)))
    (err,) = ray.get(lb.route_batch.remote([], [("over2", prompt(9))]))
    assert isinstance(err, AdmissionQueueFullError) and err.code == 9
    assert status(ray, lb)["router"]["admission"]["rejected_total"] == 2
    ray.get(lb.release_server.remote("10.0.1.0:8000"))
    ray.get(lb.release_server.remote("10.0.1.0:8000"))
    assert [s for s, _ in ray.get(held, timeout=20)] == ["10.0.1.0:8000"] * 2


def test_cancelled_held_calls_free_nothing_wrongly_and_leak_nothing(ray_cluster, admission_actor):
    ray = ray_cluster
    sid = "10.0.1.0:8000"
    lb = admission_actor(servers(1), config(max_inflight=1))
    ray.get(lb.acquire_server.remote("r0", prompt(0)))
    # A held actor call cancelled by Ray: it leaves the queue.
    gone = lb.acquire_server.remote("gone", prompt(1))
    assert wait_until(lambda: status(ray, lb)["router"]["admission"]["held"] == 1)
    ray.cancel(gone)
    assert wait_until(lambda: status(ray, lb)["router"]["admission"]["cancelled_total"] == 1)
    assert status(ray, lb)["router"]["admission"]["held"] == 0
    # A batched ticket given up while held: cancelled, nothing released.
    (t1,) = ray.get(lb.route_batch.remote([], [("b1", prompt(2))]))
    assert isinstance(t1, Held)
    assert ray.get(lb.cancel_admission.remote([t1.ticket])) == 1
    assert ray.get(lb.get_inflight_count.remote(sid)) == 1
    # A ticket admitted before its owner gave up: its slot is released.
    (t2,) = ray.get(lb.route_batch.remote([], [("b2", prompt(3))]))
    ray.get(lb.release_server.remote(sid))  # admits b2
    assert ray.get(lb.get_inflight_count.remote(sid)) == 1
    assert ray.get(lb.cancel_admission.remote([t2.ticket])) == 1
    assert ray.get(lb.get_inflight_count.remote(sid)) == 0
    assert ray.get(lb.cancel_admission.remote([t2.ticket, 999])) == 0
    (unknown,) = ray.get(lb.await_admission.remote([t2.ticket], 0.0))
    assert isinstance(unknown[1], KeyError)
    st = status(ray, lb)["router"]["admission"]
    assert st["held"] == 0 and st["waiting_callers"] == 0 and st["unclaimed"] == 0 and st["cancelled_total"] == 2


# -- the client batcher ------------------------------------------------------------


def test_many_batched_callers_complete_under_the_cap(ray_cluster, admission_actor):
    """200 concurrent callers through one event loop's batcher, 2 servers x
    4 slots: all complete (no deadlock: releases flow while acquires are
    held), in flight per server never above 4, nothing left afterwards."""
    ray = ray_cluster
    cap = 4
    srv = servers(2)
    lb = admission_actor(srv, config(max_inflight=cap))
    counts = {s: 0 for s in srv}
    peak = {s: 0 for s in srv}

    async def caller(b: batching.Batcher, i: int, rng: random.Random) -> None:
        sid, handle = await b.acquire(f"c{i}", prompt(i % 7))
        assert handle == srv[sid]
        counts[sid] += 1
        peak[sid] = max(peak[sid], counts[sid])
        await asyncio.sleep(rng.random() * 0.02)
        counts[sid] -= 1
        b.release(sid)

    async def main() -> batching.Batcher:
        b = batching.batcher_for(lb)
        assert b is not None
        rng = random.Random(7)
        await asyncio.wait_for(asyncio.gather(*(caller(b, i, rng) for i in range(200))), timeout=120)
        return b

    b = asyncio.run(main())
    assert max(peak.values()) <= cap and min(peak.values()) == cap
    assert b.held > 0 and b.polls > 0
    assert wait_until(lambda: ray.get(lb.get_total_inflight.remote()) == 0)
    st = status(ray, lb)["router"]["admission"]
    assert st["held"] == 0 and st["admitted_total"] == b.held and st["max_held"] > 0
    assert st["waiting_callers"] == 0 and st["unclaimed"] == 0


def test_batched_caller_cancelled_while_held(ray_cluster, admission_actor):
    ray = ray_cluster
    sid = "10.0.1.0:8000"
    lb = admission_actor(servers(1), config(max_inflight=1))

    async def main() -> None:
        b = batching.batcher_for(lb)
        first, _ = await b.acquire("r0", prompt(0))
        waiting = [asyncio.ensure_future(b.acquire(f"w{i}", prompt(i + 1))) for i in range(3)]
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(b._held) == 3:
                break
        assert len(b._held) == 3 and not any(w.done() for w in waiting)
        waiting[1].cancel()
        for _ in range(200):
            await asyncio.sleep(0.01)
            if status(ray, lb)["router"]["admission"]["cancelled_total"] == 1:
                break
        b.release(first)
        got0 = await asyncio.wait_for(waiting[0], 20)
        assert got0[0] == sid
        b.release(sid)
        got2 = await asyncio.wait_for(waiting[2], 20)
        assert got2[0] == sid
        b.release(sid)

    asyncio.run(main())
    assert wait_until(lambda: ray.get(lb.get_total_inflight.remote()) == 0)
    st = status(ray, lb)["router"]["admission"]
    assert st["cancelled_total"] == 1 and st["admitted_total"] == 2 and st["held"] == 0


def test_batched_queue_full_raises_in_its_caller(ray_cluster, admission_actor):
    lb = admission_actor(servers(1), config(max_inflight=1, max_queue=1))

    async def main() -> None:
        b = batching.batcher_for(lb)
        first, _ = await b.acquire("r0", prompt(0))
        held = asyncio.ensure_future(b.acquire("h", prompt(1)))
        await asyncio.sleep(0.2)
        with pytest.raises(AdmissionQueueFullError, match="admission queue full: 1 requests held"):
            await b.acquire("over", prompt(2))
        b.release(first)
        assert (await asyncio.wait_for(held, 20))[0] == first
        b.release(first)

    asyncio.run(main())


# -- an oversubscribed GRPO step through the Ray path, real vllm-sim servers ------


def test_oversubscribed_step_through_the_ray_path(ray_cluster, tmp_path):
    """The demo's oversubscribed step at the test size (16 x 8 samples at once
    on 4 servers x 8 slots, vllm-sim), policy kvc_aware+admit: async agent-loop
    worker actors acquire through client batching, held acquires are admitted
    as servers finish, every sample completes, nothing stays held or counted."""
    from kvc_harness import client, fleet, satstep
    from kvc_harness.arena import sim_binary
    from kvc_harness.procs import Cleanup
    from kvc_harness.workloads import grpo_step

    o = satstep.quick_options(seed=3)
    spec = satstep.scale_for_quick(satstep.workload(o))
    reqs = grpo_step(spec, 0)
    cleanup = Cleanup()
    try:
        _, srv, _ = fleet.start_sim_fleet(sim_binary(), o.servers, cleanup, satstep.sim_flags(o),
                                          str(tmp_path / "sim.log"))  # fmt: skip
        client.wait_healthy(fleet.urls(srv))
        run = satstep.run_policy(ray_cluster, "kvc_aware+admit", srv, reqs, client.served_model(srv[0].url),
                                 workers=o.workers, max_num_seqs=o.max_num_seqs, log=lambda *_: None)  # fmt: skip
    finally:
        cleanup.run()
    recs = run["records"]
    assert len(recs) == len(reqs) == o.sequences and not [r["error"] for r in recs if r["error"]]
    adm = run["router"]["admission"]
    assert adm["enabled"] and adm["queued_total"] > 0 and adm["admitted_total"] == adm["queued_total"]
    assert adm["held"] == 0 and adm["waiting_callers"] == 0 and adm["unclaimed"] == 0
    assert run["router"]["counters"]["acquires"] == len(reqs)


def test_a_step_measured_alike_spreads_held_groups(ray_cluster, admission_actor):
    """kvc_aware's group_spread under admission, through the actor verl runs:
    once a step's releases (their output counts, as the verl hook sends them)
    show a prompt's samples alike, a slot freed on the server holding a
    group's first sample goes to a fresh prompt before the group's next one;
    status and the Prometheus export count the group passed over."""
    from kvc_router import metrics as km

    ray = ray_cluster
    srv = servers(2)
    block = config(max_inflight=1)
    block["config"]["response_tokens"] = 8192  # 128 x the prompt: group_spread's gate is open
    lb = admission_actor(srv, block)
    for k in range(12):  # one at a time: never held
        for j in range(4):
            rid = f"s{k}-{j}"
            sid, _ = ray.get(lb.acquire_server.remote(rid, prompt(100 + k)))
            ray.get(lb.release_server.remote(sid, request_id=rid, output_tokens=100 * (k + 1) + j))
    ray.get(lb.reset_prefix_index.remote())  # a weight sync ends the step
    lens = status(ray, lb)["router"]["lengths"]
    assert lens["length_corr_known"] and lens["length_corr"] > 0.9, lens
    sa, _ = ray.get(lb.acquire_server.remote("a1", prompt(0)))
    sb, _ = ray.get(lb.acquire_server.remote("b1", prompt(1)))
    assert sa != sb
    sibling = lb.acquire_server.remote("a2", prompt(0))
    assert wait_until(lambda: status(ray, lb)["router"]["admission"]["held"] == 1)
    fresh = lb.acquire_server.remote("c1", prompt(2))
    assert wait_until(lambda: status(ray, lb)["router"]["admission"]["held"] == 2)
    ray.get(lb.release_server.remote(sa))
    assert ray.get(fresh, timeout=20)[0] == sa, "the freed slot took a's sibling onto a's server"
    assert not ray.wait([sibling], timeout=0.3)[0]
    ray.get(lb.release_server.remote(sb))
    assert ray.get(sibling, timeout=20)[0] == sb
    st = status(ray, lb)
    n = st["router"]["admission"]["group_spread_total"]
    assert n >= 1
    assert [v for name, _, v in km.samples(st) if name == "admission_group_spread_total"] == [n]
