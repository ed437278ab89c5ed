"""verl PR #6940's own check, ``TestKVCAwareBalancerImport`` (import, config
parsing, strategy construction, LLMServerManager integration smoke), against
the published verl with the kvc-router wheel installed: the PR's import path
``verl.workers.rollout.llm_router`` is served by the wheel's alias."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import sys

import pytest
import ray
from verl_sim import SimLLMServerManager

ALIAS_TARGET = "verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig"
STRATEGY = (
    "+actor_rollout_ref.rollout.router.config.strategies=[{_target_:" + ALIAS_TARGET + ",alpha:0.7,"
    "load_threshold:0.85,layer_weights:{gpu:0.8,cpu:0.15,ssd:0.05},collector_names:[vllm_metrics],weight:1.5}]"
)


class TestKVCAwareBalancerImport:
    def test_import(self):
        import kvc_router
        from verl.workers.rollout.llm_router import KVCAwareBalancer, KVCAwareStrategyConfig
        from verl.workers.rollout.llm_router.config import KVCAwareStrategyConfig as FromConfig
        from verl.workers.rollout.llm_router.config.strategy import KVCAwareStrategyConfig as FromStrategy

        assert KVCAwareBalancer is kvc_router.KVCAwareBalancer
        assert KVCAwareStrategyConfig is FromConfig is FromStrategy is kvc_router.KVCAwareStrategyConfig
        assert dataclasses.is_dataclass(KVCAwareStrategyConfig)
        # Served by the wheel's alias (published verl does not ship the package).
        assert getattr(sys.modules["verl.workers.rollout.llm_router"], "__kvc_router_alias__", False)
        with pytest.raises(ImportError):
            import verl.workers.rollout.llm_router.balancer  # noqa: F401 - only the fixed names exist

    def test_config_parsing(self, compose):
        from kvc_router import ConfigError, load_router_config
        from kvc_router.verl import router_block

        cfg = compose("+actor_rollout_ref.rollout.router.type=kvc_aware", STRATEGY)
        block = router_block(cfg.actor_rollout_ref.rollout)
        rc = load_router_config(block)
        # Parsed into the library's spec: only what the YAML set, the
        # library fills in the rest (Go owns defaults).
        (s,) = rc.strategies
        assert s["name"] == "kvc_aware" and s["weight"] == 1.5
        p = s["params"]
        assert (p["alpha"], p["load_threshold"]) == (0.7, 0.85)
        assert dict(p["layer_weights"]) == {"gpu": 0.8, "cpu": 0.15, "ssd": 0.05}
        eff = rc.validate()["router"]["strategies"][0]["params"]
        assert eff["alpha"] == 0.7 and eff["token_load"] is True  # set value kept, default filled in
        assert "vllm_metrics" in rc.collector_names
        with pytest.raises(ConfigError, match=r"strategies\[0\]\.alpah"):
            load_router_config(
                {"type": "kvc_aware", "config": {"strategies": [{"_target_": ALIAS_TARGET, "alpah": 0.5}]}}
            )
        with pytest.raises(ConfigError, match="alpha"):
            load_router_config(
                {"type": "kvc_aware", "config": {"strategies": [{"_target_": ALIAS_TARGET, "alpha": 7}]}}
            )

    def test_strategy_construction(self, verl_ray):
        from kvc_router import RouterConfig
        from verl.workers.rollout.llm_router import KVCAwareBalancer
        from verl.workers.rollout.llm_router.config.strategy import KVCAwareStrategyConfig

        s = KVCAwareStrategyConfig(
            alpha=0.6,
            load_threshold=0.9,
            layer_weights={"gpu": 1.0, "cpu": 0.0, "ssd": 0.0},
            collector_names=(),
            weight=2.0,
        )
        assert (s.alpha, s.load_threshold, s.weight, tuple(s.collector_names)) == (0.6, 0.9, 2.0, ())
        with pytest.raises(dataclasses.FrozenInstanceError):
            s.alpha = 0.1  # type: ignore[misc]
        # The class pickles into a Ray actor and routes with that strategy.
        lb = ray.remote(KVCAwareBalancer).remote(
            servers={"s0": None, "s1": None}, router_config=RouterConfig(type="kvc_aware", strategies=(s,))
        )
        try:
            assert ray.get(lb.require_acquire_fields.remote()) == ["prompt_ids"]
            sid, _ = ray.get(lb.acquire_server.remote(request_id="r", prompt_ids=[1] * 64))
            assert sid in ("s0", "s1")
            st = ray.get(lb.get_status.remote())["router"]
            assert st["mode"] == "kvc_aware" and st["counters"]["prompt_tokens"] == 64
        finally:
            ray.kill(lb)

    def test_llm_server_manager_integration_smoke(self, verl_ray, compose):
        """YAML -> verl's LLMServerManager -> KVCAwareBalancer receiving prompt_ids."""
        m = SimLLMServerManager.create(compose("+actor_rollout_ref.rollout.router.type=kvc_aware", STRATEGY))
        try:
            lb = m.global_load_balancer
            mro = ray.get(lb.__ray_call__.remote(lambda self: [c.__module__ for c in type(self).__mro__]))
            assert "kvc_router.balancer" in mro
            client = m.get_client()
            rng = random.Random(7)
            ids = [rng.randrange(1, 30000) for _ in range(300)]
            out = asyncio.run(client.generate("smoke", prompt_ids=ids, sampling_params={"max_tokens": 4}))
            assert len(out.token_ids) == 4
            st = ray.get(lb.get_status.remote())
            assert st["router"]["counters"]["prompt_tokens"] == len(ids)
            assert st["total_inflight"] == 0 or ray.get(lb.get_total_inflight.remote()) == 0
        finally:
            m.shutdown()
            ray.kill(m.global_load_balancer)
