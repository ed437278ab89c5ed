"""verl >= 0.9.1 shapes (no verl needed): the router_config_path constructor
call, require_*_fields, release_server(request_id=...), and the pure helpers of
kvc_router.verl_hook. The end-to-end tests with the real verl are tests/verl/."""

from __future__ import annotations

import types

import pytest
from kvc_router import KVCAwareBalancer, load_router_config, verl_hook
from kvc_router.errors import ConfigError


def test_positional_yaml_dict_is_the_router_config(ray_cluster):
    ray = ray_cluster
    yaml_cfg = {
        "router_class": "kvc_router.KVCAwareBalancer",
        "type": "kvc_aware",
        "config": {"strategies": [{"name": "kvc_aware"}]},
    }
    lb = ray.remote(KVCAwareBalancer).remote({"s0": None, "s1": None}, yaml_cfg)  # verl's plugin call
    try:
        assert ray.get(lb.require_acquire_fields.remote()) == ["prompt_ids"]
        assert ray.get(lb.require_release_fields.remote()) == []
        sid, _ = ray.get(lb.acquire_server.remote(request_id="r", prompt_ids=[1] * 64))
        lb.release_server.remote(server_id=sid, request_id="r")
        st = ray.get(lb.get_status.remote())
        assert st["router"]["mode"] == "kvc_aware" and st["router"]["counters"]["prompt_tokens"] == 64
    finally:
        ray.kill(lb)


def test_yaml_with_only_router_class_selects_kvc_defaults():
    b = KVCAwareBalancer({"s0": None}, {"router_class": "kvc_router.KVCAwareBalancer"})
    try:
        assert b.get_status()["router"]["mode"] == "kvc_aware"
    finally:
        b.close()
    d = KVCAwareBalancer({"s0": None})
    try:
        assert d.require_acquire_fields() == [] and d.get_status()["router"]["mode"] == "default"
    finally:
        d.close()


def test_integration_keys_parse():
    c = load_router_config(
        {
            "type": "kvc_aware",
            "config": {
                "strategies": [{"name": "kvc_aware"}],
                "kv_events": "auto",
                "kv_events_base_port": 31000,
                "enable_server_metrics": True,
            },
        }
    )
    assert (c.kv_events, c.kv_events_base_port, c.enable_server_metrics) == ("auto", 31000, True)
    with pytest.raises(ConfigError, match="kv_events"):
        load_router_config({"strategies": [{"name": "kvc_aware"}], "kv_events": "sometimes"})


def test_router_block_selection():
    assert verl_hook.router_block({}) is None
    assert verl_hook.router_block({"router": {"type": "default"}}) is None
    b = verl_hook.router_block({"router": {"type": "kvc_aware"}})
    assert b["type"] == "kvc_aware" and b["config"]["strategies"]
    with pytest.raises(ConfigError):
        verl_hook.router_block({"router": {"type": "round_robin"}})


def test_kv_events_ports_are_disjoint():
    seen = set()
    for dp in (1, 2, 4):
        seen.clear()
        for rank in range(8):
            pub, replay = verl_hook.kv_events_ports(rank, dp, 30000)
            ports = {pub + k for k in range(dp)} | {replay + k for k in range(dp)}
            assert len(ports) == 2 * dp and not ports & seen
            seen |= ports


def test_configure_replica_and_endpoints():
    cfg = types.SimpleNamespace(engine_kwargs={"vllm": {"block_size": 32}}, data_parallel_size=2)
    rep = types.SimpleNamespace(config=cfg, replica_rank=3, nnodes=1)
    spec = verl_hook.configure_replica(rep, True, True, 30000)
    vk = cfg.engine_kwargs["vllm"]
    assert vk["block_size"] == 32 and vk["disable_log_stats"] is False
    assert vk["kv_events_config"]["endpoint"] == "tcp://*:30012"
    assert vk["kv_events_config"]["replay_endpoint"] == "tcp://*:30014"
    assert vk["kv_events_config"]["topic"] == "kvc-router.replica-3"
    mgr = types.SimpleNamespace(_kvc_events={3: spec}, rollout_replicas=[rep], server_addresses=["10.0.0.7:8000"])
    eps = verl_hook.endpoints_for(mgr)
    assert [e["endpoint"] for e in eps["10.0.0.7:8000"]] == ["tcp://10.0.0.7:30012", "tcp://10.0.0.7:30013"]
    block = verl_hook.balancer_block(
        {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware"}], "kv_events": "auto"}}, eps
    )
    rc = load_router_config(block)
    assert "vllm_zmq" in rc.collector_names and len(rc.collector.endpoints["10.0.0.7:8000"]) == 2


def test_config_strip_on_plain_dict():
    calls = []
    mod = types.SimpleNamespace(omega_conf_to_dataclass=lambda c, t=None: calls.append(dict(c)) or "ok")
    verl_hook._patch_config(mod)
    verl_hook._patch_config(mod)  # idempotent
    assert mod.omega_conf_to_dataclass({"_target_": "verl.workers.config.RolloutConfig", "router": {}}) == "ok"
    mod.omega_conf_to_dataclass({"_target_": "x.ActorConfig", "router": 1})
    assert calls == [{"_target_": "verl.workers.config.RolloutConfig"}, {"_target_": "x.ActorConfig", "router": 1}]
