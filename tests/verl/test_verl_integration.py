"""verl (published wheels 0.8.0, 0.9.0, 0.9.1) + kvc-router's post-import hook, end to end:
verl's LLMServerManager / LLMServerClient / CheckpointEngineManager drive
simulated vLLM servers (vllm-sim: real HTTP, /metrics, ZMQ KV events)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import subprocess
import sys

import pytest
import ray
from verl_sim import (
    AgentLoopWorkerStandIn,
    SimActorWorkers,
    SimLLMServerManager,
    _http,
    free_base_port,
    verl_at_least,
    wait_for,
)

KVC_EVENTS = [
    "+actor_rollout_ref.rollout.router.type=kvc_aware",
    "+actor_rollout_ref.rollout.router.config.kv_events=auto",
    "+actor_rollout_ref.rollout.router.config.enable_server_metrics=true",
    "+actor_rollout_ref.rollout.router.config.kv_events_base_port=0",
    "+actor_rollout_ref.rollout.router.config.strategies=[{_target_:kvc_router.config.KVCAwareStrategyConfig,"
    "collector_names:[vllm_metrics]}]",
    "+actor_rollout_ref.rollout.router.config.collector.interval_ms=50",
]


def prompt(seed, n=256):
    rng = random.Random(seed)
    return [rng.randrange(1, 30000) for _ in range(n)]


def lb_classes(lb):
    return ray.get(
        lb.__ray_call__.remote(lambda self: [f"{c.__module__}.{c.__qualname__}" for c in type(self).__mro__])
    )


@pytest.fixture
def manager(verl_ray, compose):
    made = []

    def make(*overrides):
        overrides = list(overrides)
        if any("kv_events_base_port=0" in o for o in overrides):
            overrides = [
                o.replace("kv_events_base_port=0", f"kv_events_base_port={free_base_port()}") for o in overrides
            ]
        config = compose(*overrides)
        m = SimLLMServerManager.create(config)
        made.append(m)
        return m

    yield make
    for m in made:
        m.shutdown()
        ray.kill(m.global_load_balancer)


def generate(client, rid, ids, max_tokens=8):
    return asyncio.run(client.generate(rid, prompt_ids=ids, sampling_params={"max_tokens": max_tokens}))


def server_logs(m):
    return {sid: ray.get(r._server_handle.get_log.remote()) for sid, r in zip(m.server_addresses, m.rollout_replicas)}


# -- the hook itself ---------------------------------------------------------


def _probe(env):
    code = (
        "import sys, json; import verl.workers.rollout.llm_server as m; from verl.utils import config as c; "
        "print(json.dumps([any(type(f).__name__=='VerlImportWatcher' for f in sys.meta_path), "
        "getattr(c.omega_conf_to_dataclass,'_kvc_router_patched',False), "
        "getattr(m.LLMServerManager._init_global_load_balancer,'_kvc_router_patched',False)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_hook_installed_by_pth_and_switchable():
    env = dict(os.environ)
    env.pop("KVC_ROUTER_VERL_HOOK", None)
    assert _probe(env) == [True, True, True]
    assert _probe(dict(env, KVC_ROUTER_VERL_HOOK="0")) == [False, False, False]


def test_router_block_passes_rollout_config_conversion(compose):
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import RolloutConfig

    cfg = compose("+actor_rollout_ref.rollout.router.type=kvc_aware")
    rc = cfg.actor_rollout_ref.rollout
    obj = omega_conf_to_dataclass(rc)  # what RolloutReplica / AgentLoopWorker do
    assert isinstance(obj, RolloutConfig) and not hasattr(obj, "router")
    assert rc.router.type == "kvc_aware"  # the DictConfig keeps its block
    plain = {"name": "vllm", "router": {"type": "kvc_aware"}}
    assert isinstance(omega_conf_to_dataclass(plain, dataclass_type=RolloutConfig), RolloutConfig)


# -- (a) no router block: verl's own balancer --------------------------------


@pytest.mark.parametrize(
    "overrides", [[], ["+actor_rollout_ref.rollout.router.type=default"]], ids=["absent", "default"]
)
def test_a_without_router_block_verl_balancer(manager, overrides):
    m = manager(*overrides)
    # verl 0.9.1 keeps it in verl.workers.rollout.router, 0.8.0 / 0.9.0 in llm_server.
    cls = lb_classes(m.global_load_balancer)[0]
    assert cls.startswith("verl.workers.rollout.") and cls.endswith(".GlobalRequestLoadBalancer"), cls
    for r in m.rollout_replicas:
        assert "kv_events_config" not in (r.config.engine_kwargs.get("vllm") or {})
    client = m.get_client()
    generate(client, "t0", prompt(1))
    generate(client, "t0", prompt(1) + [5] * 40)
    logs = server_logs(m)
    assert sorted(len(v) for v in logs.values()) == [0, 2]  # sticky on verl's balancer too
    status = ray.get(m.global_load_balancer.get_status.remote())
    assert set(status) == {"servers", "total_inflight", "active_servers", "registered_handles"}


# -- (b) kvc_aware through verl's manager and client -------------------------


def test_b_kvc_aware_with_kv_events(manager):
    from verl.checkpoint_engine.base import CheckpointEngineManager
    from verl.workers.config import CheckpointEngineConfig

    m = manager(*KVC_EVENTS)
    lb = m.global_load_balancer
    assert "kvc_router.balancer.KVCAwareBalancer" in lb_classes(lb)
    assert ray.get(lb.require_acquire_fields.remote()) == ["prompt_ids"]
    s0, s1 = m.server_addresses

    # Each replica got its own kv_events_config (and log stats on) through
    # verl's engine kwargs, and the server launched with it.
    kvs = []
    for r in m.rollout_replicas:
        args = ray.get(r._server_handle.get_launch_args.remote())
        assert args["disable_log_stats"] is False
        kvs.append(args["kv_events_config"])
    assert len({k["endpoint"] for k in kvs} | {k["replay_endpoint"] for k in kvs}) == 4
    assert [k["topic"] for k in kvs] == ["kvc-router.replica-0", "kvc-router.replica-1"]

    # The balancer subscribed to both publishers.
    def subscribed():
        st = ray.get(lb.get_status.remote())["router"]
        subs = st["collectors"]["collectors"].get("vllm_zmq") or []
        return len(subs) == 2 and st

    st = wait_for(subscribed)
    assert st, ray.get(lb.get_status.remote())["router"]["collectors"]
    assert {s["server"] for s in st["collectors"]["collectors"]["vllm_zmq"]} == {s0, s1}

    client = m.get_client()
    # prompt_ids reach acquire_server; a multi-turn request id stays on one server.
    ids = prompt(10)
    sent = 0
    for turn in range(3):
        out = generate(client, "traj-1", ids)
        sent += len(ids)
        ids = ids + list(out.token_ids) + [9, 9, 9, turn]
    logs = server_logs(m)
    holder = next(sid for sid, v in logs.items() if any(e["request_id"] for e in v))
    assert len(logs[holder]) == 3 and all(len(v) == 0 for sid, v in logs.items() if sid != holder)
    assert logs[holder][2]["cached"] > 0  # the server reused the previous turns
    st = ray.get(lb.get_status.remote())["router"]
    assert st["counters"]["prompt_tokens"] == sent
    assert st["counters"]["sticky_hits"] == 2

    # A prefix placed on the *other* server behind the balancer's back
    # (directly over HTTP) is learnt from its KV events; a new request with
    # that prefix goes there, and vLLM reports the hit.
    other = s1 if holder == s0 else s0
    q = prompt(20)
    _http(f"http://{other}/v1/completions", {"model": "sim/llama-8b", "prompt": q, "max_tokens": 1})
    idx = [s["name"] for s in st["index"]["servers"]].index(other)

    def stored():
        return ray.get(lb.get_status.remote())["router"]["index"]["servers"][idx]["stored_blocks"] > 0

    assert wait_for(stored), "no KV events from the prefix holder"
    generate(client, "grpo-0", q + [1, 2, 3])
    generate(client, "grpo-1", q + [4, 5, 6])  # a GRPO sibling
    logs = server_logs(m)
    grpo = [e for e in logs[other] if e["request_id"]]
    assert len(grpo) == 2 and all(e["cached"] >= 240 for e in grpo)
    st = ray.get(lb.get_status.remote())["router"]
    assert not st["index"]["servers"][idx]["approximate"]
    assert st["index_mode"].startswith("exact")

    # Weight update through verl's CheckpointEngineManager ('naive' backend):
    # vLLM's reset_prefix_cache -> AllBlocksCleared, and reset_prefix_index().
    workers = SimActorWorkers(m.rollout_replicas)
    cem = CheckpointEngineManager(CheckpointEngineConfig(backend="naive"), workers, m.get_replicas())
    cem.update_weights(global_steps=1)
    assert workers.calls == 1
    d = ray.get(lb.acquire_server_detail.remote(request_id="after-sync", prompt_ids=q + [1, 2, 3]))
    assert sum(d["hit_blocks"]) == 0
    cleared = lambda: all(s["cleared"] >= 1 for s in ray.get(lb.get_status.remote())["router"]["index"]["servers"])  # noqa: E731
    assert wait_for(cleared), "AllBlocksCleared not seen"


def test_b_approximate_mode_warns_and_resets(manager, caplog):
    from kvc_router.verl import ports
    from verl.checkpoint_engine.base import CheckpointEngineManager
    from verl.workers.config import CheckpointEngineConfig

    ports._warned.discard("log-stats")
    with caplog.at_level(logging.WARNING, logger="kvc_router.verl"):
        m = manager("+actor_rollout_ref.rollout.router.type=kvc_aware")
    assert sum("disable_log_stats is true" in r.getMessage() for r in caplog.records) == 1
    lb = m.global_load_balancer
    assert "kvc_router.balancer.KVCAwareBalancer" in lb_classes(lb)
    for r in m.rollout_replicas:
        assert not (r.config.engine_kwargs.get("vllm") or {})  # servers untouched
    client = m.get_client()
    p = prompt(30)
    generate(client, "x", p)
    st = ray.get(lb.get_status.remote())["router"]
    assert st["approximate"] and st["index_mode"].startswith("approximate")
    assert st["index"]["entries"] > 0
    cem = CheckpointEngineManager(
        CheckpointEngineConfig(backend="naive"), SimActorWorkers(m.rollout_replicas), m.get_replicas()
    )
    cem.update_weights(global_steps=1)
    # No KV events here: only reset_prefix_index() can have emptied the index.
    assert ray.get(lb.get_status.remote())["router"]["index"]["entries"] == 0


# -- (c) agent-loop workers in other processes --------------------------------


def test_c_agent_loop_workers_in_other_processes(manager, compose):
    m = manager(*KVC_EVENTS)
    lb = m.global_load_balancer
    client = m.get_client()
    workers = [AgentLoopWorkerStandIn.remote(m.config, client) for _ in range(2)]
    states = ray.get([w.hook_state.remote() for w in workers])
    assert all(s["boot"] and s["patched"] for s in states)
    assert len({s["pid"] for s in states} | {os.getpid()}) == 3
    specs = [[(f"w{w}-traj{i}", prompt(100 + 10 * w + i)) for i in range(4)] for w in range(2)]
    results = ray.get([w.run_trajectories.remote(s, turns=3) for w, s in zip(workers, specs)])
    logs = server_logs(m)
    where = {}
    for sid, entries in logs.items():
        for e in entries:
            where.setdefault(e["request_id"], set()).add(sid)
    rids = [rid for res in results for rid in res]
    assert len(rids) == 8
    # The client sends a fresh vLLM request id per turn; group by prompt head.
    by_head = {}
    for sid, entries in logs.items():
        for e in entries:
            by_head.setdefault(tuple(e["head"]), set()).add(sid)
    assert len(by_head) == 8 and all(len(s) == 1 for s in by_head.values())  # each trajectory on one server
    total = sum(sum(lens) for res in results for lens in res.values())
    st = ray.get(lb.get_status.remote())["router"]
    assert st["counters"]["prompt_tokens"] == total
    assert st["counters"]["sticky_hits"] == 16
    for w in workers:
        ray.kill(w)


# -- client-side batching (kvc_router.batching) through verl's own client ------


def test_client_batches_acquire_and_release_to_our_balancer_only(manager):
    from kvc_router import batching

    m = manager("+actor_rollout_ref.rollout.router.type=kvc_aware")
    lb = m.global_load_balancer
    client = m.get_client()
    prompts = [prompt(300 + i, n=64) for i in range(16)]

    async def run():
        outs = await asyncio.gather(
            *(
                client.generate(f"bat-{i}", prompt_ids=p, sampling_params={"max_tokens": 2})
                for i, p in enumerate(prompts)
            )
        )
        b = batching.batcher_for(lb)
        await asyncio.sleep(0.2)  # the last releases leave
        return outs, b.batches, b.carried

    outs, batches, carried = asyncio.run(run())
    assert len(outs) == 16 and all(len(o.token_ids) == 2 for o in outs)
    # 16 acquires + 16 releases in fewer actor calls. How many fewer depends
    # on timing: the acquires leave together, while each release leaves when
    # its response arrives, alone on a loaded host (CI saw 16 batches).
    assert carried == 32 and batches < carried, (carried, batches)
    assert wait_for(lambda: ray.get(lb.get_total_inflight.remote()) == 0)
    st = ray.get(lb.get_status.remote())["router"]
    assert st["counters"]["prompt_tokens"] == sum(len(p) for p in prompts)
    assert sum(len(v) for v in server_logs(m).values()) == 16

    # verl's own balancer has no route_batch: its client calls stay verl's.
    m2 = manager()
    assert asyncio.run(_batcher_in_loop(m2.global_load_balancer)) is None
    assert len(generate(m2.get_client(), "plain", prompt(1)).token_ids) == 8


@pytest.mark.parametrize("admission", [False, True])
def test_releases_teach_the_router_output_lengths(manager, admission):
    """verl's release sends no output length; the hook's does: each
    generate's release names its request and the tokens it generated, so
    the router's length learner (lengths.enabled) learns one count per
    request, through the plain and the admission balancer."""
    args = [
        "+actor_rollout_ref.rollout.router.type=kvc_aware",
        "+actor_rollout_ref.rollout.router.config.lengths={enabled:true}",
    ]
    # Admission is on by default (enabled: auto, the async class); off, the hook runs the plain class.
    args.append(f"+actor_rollout_ref.rollout.router.config.admission={{enabled:{str(admission).lower()}}}")
    m = manager(*args)
    want_cls = "kvc_router.admission.KVCAwareAdmissionBalancer" if admission else "kvc_router.balancer.KVCAwareBalancer"
    assert want_cls in lb_classes(m.global_load_balancer)
    assert ("kvc_router.admission.KVCAwareAdmissionBalancer" in lb_classes(m.global_load_balancer)) is admission
    lb = m.global_load_balancer
    client = m.get_client()
    want = [2 + (i % 5) for i in range(10)]

    async def run():
        return await asyncio.gather(
            *(
                client.generate(f"len-{i}", prompt_ids=prompt(700 + i, n=64), sampling_params={"max_tokens": n})
                for i, n in enumerate(want)
            )
        )

    outs = asyncio.run(run())
    assert [len(o.token_ids) for o in outs] == want
    assert wait_for(lambda: ray.get(lb.get_total_inflight.remote()) == 0)
    lengths = ray.get(lb.get_status.remote())["router"]["lengths"]
    assert lengths["observed_tokens"] == 10 and lengths["observed_durations"] == 0, lengths
    assert lengths["unmatched_releases"] == 0 and lengths["prompts"] == 10, lengths


async def _batcher_in_loop(lb):
    from kvc_router import batching

    return batching.batcher_for(lb)


# -- verl 0.9.1's native router_config_path route ------------------------------


@pytest.mark.skipif(not verl_at_least(0, 9, 1), reason="router_config_path / get_router_handle arrived in verl 0.9.1")
def test_router_config_path_native_route(manager, tmp_path):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    m = manager()  # servers only; verl's default balancer
    path = tmp_path / "router.yaml"
    path.write_text(
        "router_class: kvc_router.KVCAwareBalancer\n"
        "type: kvc_aware\n"
        "config:\n"
        "  strategies:\n"
        "    - {_target_: kvc_router.config.KVCAwareStrategyConfig, collector_names: [vllm_metrics]}\n"
    )
    servers = dict(zip(m.server_addresses, m.server_handles))
    lb = get_router_handle(servers, router_config_path=str(path))
    try:
        assert lb_classes(lb)[0] == "kvc_router.balancer.KVCAwareBalancer"
        assert ray.get(lb.require_acquire_fields.remote()) == ["prompt_ids"]
        client = LLMServerClient(config=m.config, load_balancer_handle=lb)
        p = prompt(40)
        generate(client, "n1", p)
        generate(client, "n1", p + [3] * 20)
        st = ray.get(lb.get_status.remote())
        assert st["router"]["counters"]["prompt_tokens"] == 2 * len(p) + 20
        assert st["router"]["counters"]["sticky_hits"] == 1 and st["total_inflight"] == 0
    finally:
        ray.kill(lb)


def test_admission_cap_defaults_to_the_rollout_slots(manager):
    """admission on without a cap: the hook sets max_inflight to verl's
    rollout.max_num_seqs x data_parallel_size (the library cannot read it)."""
    m = manager(
        "+actor_rollout_ref.rollout.router.type=kvc_aware",
        "+actor_rollout_ref.rollout.router.config.admission={enabled:true}",
    )
    rc = m.config.actor_rollout_ref.rollout
    got = ray.get(
        m.global_load_balancer.__ray_call__.remote(lambda self: dict(self._config.effective["router"]["admission"]))
    )
    # The library fills every other admission key with its default.
    assert got["enabled"] is True and got["max_inflight"] == rc.max_num_seqs * rc.data_parallel_size, got


@pytest.mark.parametrize("multi_turn", [False, True])
def test_hook_tells_the_router_the_rollouts_turns(manager, multi_turn):
    """The hook sets the router's turns from verl's own rollout config:
    rollout.multi_turn.enable -> multi (task_spread from the first turn),
    else single (a first GRPO step's groups stay whole, or split in two
    where responses may outgrow the prompts: group_spread's gates)."""
    args = ["+actor_rollout_ref.rollout.router.type=kvc_aware"]
    if multi_turn:
        args.append("actor_rollout_ref.rollout.multi_turn.enable=true")
    m = manager(*args)
    got = ray.get(m.global_load_balancer.__ray_call__.remote(lambda self: self._config.effective["router"]["turns"]))
    assert got == ("multi" if multi_turn else "single")


def test_hook_tells_the_router_the_response_length(manager):
    """The hook sets the router's response_tokens (group_spread's gate) from
    verl's own rollout.response_length (data.max_response_length)."""
    m = manager("+actor_rollout_ref.rollout.router.type=kvc_aware")
    want = m.config.actor_rollout_ref.rollout.response_length
    assert isinstance(want, int) and want > 0
    got = ray.get(
        m.global_load_balancer.__ray_call__.remote(lambda self: self._config.effective["router"]["response_tokens"])
    )
    assert got == want


@pytest.mark.skipif(not verl_at_least(0, 9, 1), reason="router_config_path / get_router_handle arrived in verl 0.9.1")
def test_router_config_path_with_admission_names_the_admission_class(manager, tmp_path):
    """verl creates the class the YAML names: with admission on it must be
    KVCAwareAdmissionBalancer; the sync class refuses, naming it."""
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    m = manager()
    servers = dict(zip(m.server_addresses, m.server_handles))
    body = "type: kvc_aware\nconfig:\n  admission: {enabled: true, max_inflight: 1}\n"
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("router_class: kvc_router.KVCAwareBalancer\n" + body)
    bad = get_router_handle(servers, router_config_path=str(wrong))
    try:
        with pytest.raises(Exception, match="use kvc_router.KVCAwareAdmissionBalancer"):
            ray.get(bad.get_status.remote(), timeout=60)
    finally:
        ray.kill(bad)
    right = tmp_path / "right.yaml"
    right.write_text("router_class: kvc_router.KVCAwareAdmissionBalancer\n" + body)
    lb = get_router_handle(servers, router_config_path=str(right))
    try:
        assert lb_classes(lb)[0] == "kvc_router.admission.KVCAwareAdmissionBalancer"
        client = LLMServerClient(config=m.config, load_balancer_handle=lb)

        async def burst():
            return await asyncio.gather(
                *(client.generate(f"y{i}", prompt_ids=prompt(900 + i), sampling_params={"max_tokens": 4})
                  for i in range(8))
            )  # fmt: skip

        assert all(len(o.token_ids) == 4 for o in asyncio.run(asyncio.wait_for(burst(), 120)))
        assert wait_for(lambda: ray.get(lb.get_total_inflight.remote()) == 0)
        adm = ray.get(lb.get_status.remote())["router"]["admission"]
        assert adm["queued_total"] > 0 and adm["admitted_total"] == adm["queued_total"] and adm["held"] == 0
    finally:
        ray.kill(lb)


# -- fully-async / separate-async trainers -------------------------------------


@pytest.mark.skipif(not verl_at_least(0, 9, 0), reason="FullyAsyncLLMServerClient arrived in verl 0.9.0")
def test_fully_async_client_and_pool_changes(manager):
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    m = manager("+actor_rollout_ref.rollout.router.type=kvc_aware")
    lb = m.global_load_balancer
    servers = dict(zip(m.server_addresses, m.server_handles))
    ray.get(lb.remove_servers.remote(list(servers)))  # positional, as PPOTrainerSeparateAsync
    client = m.get_client(client_cls=FullyAsyncLLMServerClient, only_hybrid=True)

    async def run():
        task = asyncio.ensure_future(client.generate("fa-1", prompt_ids=prompt(50), sampling_params={"max_tokens": 4}))
        await asyncio.sleep(1.5)  # retrying on "No available servers in load balancer"
        assert not task.done()
        await lb.add_servers.remote(servers)  # positional
        return await asyncio.wait_for(task, 30)

    out = asyncio.run(run())
    assert len(out.token_ids) == 4
    cleared = ray.get(lb.clear_sticky_cache.remote())
    assert cleared["cleared_entries"] == 1 and set(cleared["server_loads"]) == set(servers)
    assert wait_for(lambda: ray.get(lb.get_total_inflight.remote()) == 0)
    assert ray.get(lb.get_all_servers.remote()) == list(servers)


# -- actor options: the hook creates the actor itself ---------------------------


def test_actor_options_create_the_balancer_directly(manager, monkeypatch):
    from kvc_router.verl import actor

    monkeypatch.setitem(actor.ACTOR_OPTIONS, "max_concurrency", 4)
    m = manager("+actor_rollout_ref.rollout.router.type=kvc_aware")
    lb = m.global_load_balancer
    # Not the load_balancer_cls subclass (kvc_router.verl.actor): created with the options, as the
    # class kvc_aware's defaults pick (admission.enabled: auto, the async admission balancer).
    assert lb_classes(lb)[0] == "kvc_router.admission.KVCAwareAdmissionBalancer"
    assert any(h is lb for h in actor.registered_balancers())
    client = m.get_client()
    p = prompt(60)
    generate(client, "opt-1", p)
    assert ray.get(lb.get_status.remote())["router"]["counters"]["prompt_tokens"] == len(p)


# -- router-side admission: an oversubscribed burst through verl's client ------

ADMISSION = [
    "+actor_rollout_ref.rollout.router.type=kvc_aware",
    "+actor_rollout_ref.rollout.router.config.admission={enabled:true,max_inflight:2}",
]


@pytest.mark.parametrize("batching", ["on", "off"])
def test_admission_oversubscribed_burst_through_verls_client(manager, monkeypatch, batching):
    """verl's LLMServerClient, 2 vllm-sim servers with 2 slots each under
    admission, 24 single-turn requests at once from this process and 8
    three-turn trajectories from two agent-loop worker processes: every call
    completes (held acquires wait while the releases that admit them flow),
    requests are held and admitted, nothing stays counted in flight."""
    from kvc_router.verl import actor

    if batching == "off":
        monkeypatch.setenv("KVC_ROUTER_CLIENT_BATCHING", "0")
    m = manager(*ADMISSION)
    lb = m.global_load_balancer
    assert lb_classes(lb)[0] == "kvc_router.admission.KVCAwareAdmissionBalancer"
    assert any(h is lb for h in actor.registered_balancers())
    client = m.get_client()

    async def burst():
        return await asyncio.gather(
            *(client.generate(f"burst-{i}", prompt_ids=prompt(500 + i % 6), sampling_params={"max_tokens": 8})
              for i in range(24))
        )  # fmt: skip

    outs = asyncio.run(asyncio.wait_for(burst(), 120))
    assert all(len(o.token_ids) == 8 for o in outs)
    workers = [AgentLoopWorkerStandIn.remote(m.config, client) for _ in range(2)]
    specs = [[(f"adm-w{w}-traj{i}", prompt(700 + 10 * w + i)) for i in range(4)] for w in range(2)]
    results = ray.get([w.run_trajectories.remote(s, turns=3) for w, s in zip(workers, specs)], timeout=180)
    assert sum(len(r) for r in results) == 8
    assert sum(len(v) for v in server_logs(m).values()) == 24 + 8 * 3
    assert wait_for(lambda: ray.get(lb.get_total_inflight.remote()) == 0)
    adm = ray.get(lb.get_status.remote())["router"]["admission"]
    assert adm["enabled"] and adm["queued_total"] > 0 and adm["admitted_total"] == adm["queued_total"]
    assert adm["held"] == 0 and adm["waiting_callers"] == 0 and adm["unclaimed"] == 0 and adm["rejected_total"] == 0


# -- make actor-bench stays runnable --------------------------------------------


@pytest.mark.skipif(not verl_at_least(0, 9, 1), reason="the bench drives verl 0.9.1's client (fields as kwargs)")
def test_actor_bench_runs_through_the_hooked_client(verl_ray):
    from kvc_harness import actor_bench

    cfg = actor_bench.BenchConfig(
        callers=(16,), seconds=0.5, warmup_seconds=0.2, rounds=1, servers=4, prompt_tokens=256
    )
    variants = [v for v in actor_bench.default_variants() if v.name in ("verl", "kvc", "kvc_unbatched")]
    res = actor_bench.run(verl_ray, cfg, variants, log=lambda *_: None)
    assert set(res) == {"verl", "kvc", "kvc_unbatched"} and all(r[16] > 0 for r in res.values())
    (row,) = actor_bench.rows(res, "kvc", cfg.callers)
    assert set(row) == {"callers", "kvc_pairs_per_s", "verl_pairs_per_s"} and row["callers"] == 16
