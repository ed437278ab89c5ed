"""verl >= 0.9.1 shapes (no verl needed): the router_config_path constructor
call, require_*_fields, release_server(request_id=...), and the pure helpers of
kvc_router.verl. The end-to-end tests with the real verl are tests/verl/."""

from __future__ import annotations

import types

import pytest
from kvc_router import KVCAwareBalancer, load_router_config
from kvc_router.errors import ConfigError
from kvc_router.verl import detection, patches, ports


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
        # The defaults' length-correlation learner matches releases by id.
        assert ray.get(lb.require_release_fields.remote()) == ["request_id"]
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
    assert detection.router_block({}) is None
    assert detection.router_block({"router": {"type": "default"}}) is None
    b = detection.router_block({"router": {"type": "kvc_aware"}})
    assert b["type"] == "kvc_aware" and b["config"]["strategies"]
    with pytest.raises(ConfigError):
        detection.router_block({"router": {"type": "round_robin"}})


def test_kv_events_ports_are_disjoint():
    seen = set()
    for dp in (1, 2, 4):
        seen.clear()
        for rank in range(8):
            pub, replay = ports.kv_events_ports(rank, dp, 30000)
            block = {pub + k for k in range(dp)} | {replay + k for k in range(dp)}
            assert len(block) == 2 * dp and not block & seen
            seen |= block


def test_configure_replica_and_endpoints():
    cfg = types.SimpleNamespace(engine_kwargs={"vllm": {"block_size": 32}}, data_parallel_size=2)
    rep = types.SimpleNamespace(config=cfg, replica_rank=3, nnodes=1)
    spec = ports.configure_replica(rep, True, True, 30000)
    vk = cfg.engine_kwargs["vllm"]
    assert vk["block_size"] == 32 and vk["disable_log_stats"] is False
    assert vk["kv_events_config"]["endpoint"] == "tcp://*:30012"
    assert vk["kv_events_config"]["replay_endpoint"] == "tcp://*:30014"
    assert vk["kv_events_config"]["topic"] == "kvc-router.replica-3"
    mgr = types.SimpleNamespace(_kvc_events={3: spec}, rollout_replicas=[rep], server_addresses=["10.0.0.7:8000"])
    eps = ports.endpoints_for(mgr)
    assert [e["endpoint"] for e in eps["10.0.0.7:8000"]] == ["tcp://10.0.0.7:30012", "tcp://10.0.0.7:30013"]
    block = ports.balancer_block(
        {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware"}], "kv_events": "auto"}}, eps
    )
    rc = load_router_config(block)
    assert "vllm_zmq" in rc.collector_names and len(rc.collector.endpoints["10.0.0.7:8000"]) == 2


def test_configure_sglang_replica():
    """rollout.name: sglang: ServerArgs-shaped settings in engine_kwargs["sglang"]
    (enable_metrics, kv_events_config as a JSON string, page_size = the router's
    block size) and a balancer reading sglang:* metrics plus the KV events."""
    import json

    cfg = types.SimpleNamespace(
        engine_kwargs={"sglang": {"page_size": 1, "mem_fraction_static": 0.5}}, data_parallel_size=1
    )
    rep = types.SimpleNamespace(config=cfg, replica_rank=2, nnodes=1)
    spec = ports.configure_replica(rep, True, True, 30000, engine="sglang", block_size=32)
    sk = cfg.engine_kwargs["sglang"]
    assert "vllm" not in cfg.engine_kwargs
    assert sk["enable_metrics"] is True and sk["page_size"] == 32 and sk["mem_fraction_static"] == 0.5
    kv = json.loads(sk["kv_events_config"])  # SGLang's ServerArgs takes a JSON string
    assert kv == {"publisher": "zmq", "endpoint": "tcp://*:30004", "replay_endpoint": "tcp://*:30005",
                  "topic": "kvc-router.replica-2"}  # fmt: skip
    mgr = types.SimpleNamespace(_kvc_events={2: spec}, rollout_replicas=[rep], server_addresses=["10.0.0.7:9000"])
    block = ports.balancer_block(
        {"type": "kvc_aware", "config": {"kv_events": "auto"}}, ports.endpoints_for(mgr), engine="sglang"
    )
    rc = load_router_config(block)
    assert set(rc.collector_names) == {"sglang_metrics", "vllm_zmq"} and rc.metrics_flavor == "sglang"
    # A user's strategy naming vllm_metrics reads SGLang's names instead.
    block = ports.balancer_block(
        {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware", "collector_names": ["vllm_metrics"]}]}},
        {},
        engine="sglang",
    )
    assert load_router_config(block).collector_names == ("sglang_metrics",)


def test_prefill_decode_replicas_get_distinct_event_ports():
    """verl 0.9.x prefill/decode replicas (rollout.disaggregation): 1 prefill +
    N decode servers launched from one replica config. Each launch gets its
    own KV-event ports (vLLM's _spawn_pd_server, SGLang's async _launch_one),
    disjoint across servers and replicas; the balancer subscribes to the
    prefill server's, the one verl routes to."""
    import asyncio
    import json

    class FakeVLLMPD:  # the call shape of vLLMPDReplica._spawn_pd_server
        def _spawn_pd_server(self, role, actor_name):
            kv = self.config.engine_kwargs["vllm"]["kv_events_config"]
            self.seen.append((role, kv["endpoint"], kv["replay_endpoint"], kv["topic"]))
            return actor_name

    class FakeSGLangPD:  # SGLangPDReplica._launch_one is a coroutine
        async def _launch_one(self, role, actor_name):
            await asyncio.sleep(0)
            kv = json.loads(self.config.engine_kwargs["sglang"]["kv_events_config"])
            self.seen.append((role, kv["endpoint"], kv["replay_endpoint"], kv["topic"]))
            return [actor_name]

    patches._wrap_method(FakeVLLMPD, "_spawn_pd_server", patches._make_pd_launch)
    patches._wrap_method(FakeSGLangPD, "_launch_one", patches._make_pd_launch)
    disagg = {"enabled": True, "decode_replicas": 2}
    ports_seen = []
    for engine, cls in (("vllm", FakeVLLMPD), ("sglang", FakeSGLangPD)):
        for rank in (0, 1):
            rep = cls()
            rep.seen, rep.replica_rank, rep.nnodes = [], rank, 1
            rep.config = types.SimpleNamespace(engine_kwargs={}, data_parallel_size=1, disaggregation=disagg)
            spec = ports.configure_replica(rep, True, True, 30000, engine=engine, block_size=32)
            before = rep.config.engine_kwargs
            for role, name in (("prefill", "p"), ("decode", "d0"), ("decode", "d1")):
                if engine == "vllm":
                    rep._spawn_pd_server(role, name)
                else:
                    asyncio.run(rep._launch_one(role, name))
            assert rep.config.engine_kwargs is before  # the replica's own config is restored
            assert [s[0] for s in rep.seen] == ["prefill", "decode", "decode"]
            assert rep.seen[0][1] == f"tcp://*:{spec['pub']}" and len({s[3] for s in rep.seen}) == 3
            mgr = types.SimpleNamespace(_kvc_events={rank: spec}, rollout_replicas=[rep], server_addresses=["h:1"])
            assert ports.endpoints_for(mgr)["h:1"][0]["endpoint"] == f"tcp://h:{spec['pub']}"
            for s in rep.seen:
                ports_seen += [s[1], s[2]]
        assert len(set(ports_seen)) == len(ports_seen) == 12  # 2 replicas x 3 servers x (pub, replay)
        ports_seen.clear()


def test_config_strip_on_plain_dict():
    calls = []
    mod = types.SimpleNamespace(omega_conf_to_dataclass=lambda c, t=None: calls.append(dict(c)) or "ok")
    patches.patch_config(mod)
    patches.patch_config(mod)  # idempotent
    assert mod.omega_conf_to_dataclass({"_target_": "verl.workers.config.RolloutConfig", "router": {}}) == "ok"
    mod.omega_conf_to_dataclass({"_target_": "x.ActorConfig", "router": 1})
    assert calls == [{"_target_": "verl.workers.config.RolloutConfig"}, {"_target_": "x.ActorConfig", "router": 1}]


# -- the gate: kvc_aware asked for, a patch could not apply --------------------


@pytest.fixture
def fresh_patches(monkeypatch):
    """Isolates the patch record of this process; verl reports version 0.9.1."""
    monkeypatch.setattr(patches, "_results", {})
    monkeypatch.setattr(patches, "_requested", False)
    monkeypatch.setattr(patches, "verl_version", lambda: "0.9.1")
    return patches


def _fake_config_module():
    calls = []
    mod = types.SimpleNamespace(omega_conf_to_dataclass=lambda c, t=None: calls.append(dict(c)) or "converted")
    return mod, calls


ROLLOUT = "verl.workers.config.RolloutConfig"


def test_failed_patch_fails_kvc_aware_start_up(fresh_patches):
    cfg_mod, calls = _fake_config_module()
    fresh_patches.on_import("verl.utils.config", cfg_mod)
    # A verl whose llm_server no longer defines LLMServerManager (moved/renamed).
    fresh_patches.on_import("verl.workers.rollout.llm_server", types.SimpleNamespace(LLMServerClient=object))
    res = fresh_patches.results()
    assert res[patches.CONFIG][0] == patches.APPLIED
    assert res[patches.INIT_LB][0] == patches.FAILED and "LLMServerManager" in res[patches.INIT_LB][1]
    # Without a router block (or with type default) verl runs unmodified.
    assert cfg_mod.omega_conf_to_dataclass({"_target_": ROLLOUT}) == "converted"
    assert cfg_mod.omega_conf_to_dataclass({"_target_": ROLLOUT, "router": {"type": "default"}}) == "converted"
    assert calls == [{"_target_": ROLLOUT}, {"_target_": ROLLOUT}]
    # Asking for kvc_aware: start-up fails naming the version and the patch,
    # and the router key is not stripped (verl's default balancer never runs).
    with pytest.raises(patches.VerlIncompatibleError) as e:
        cfg_mod.omega_conf_to_dataclass({"_target_": ROLLOUT, "router": {"type": "kvc_aware"}})
    msg = str(e.value)
    assert "verl 0.9.1" in msg and patches.INIT_SERVERS in msg
    assert len(calls) == 2


def test_patch_failing_after_kvc_aware_was_seen_fails_the_import(fresh_patches):
    cfg_mod, _ = _fake_config_module()
    fresh_patches.on_import("verl.utils.config", cfg_mod)
    assert cfg_mod.omega_conf_to_dataclass({"_target_": ROLLOUT, "router": {"type": "kvc_aware"}}) == "converted"
    broken = types.SimpleNamespace(CheckpointEngineManager=type("CheckpointEngineManager", (), {}))
    with pytest.raises(patches.VerlIncompatibleError, match=r"CheckpointEngineManager\.update_weights.*verl 0\.9\.1"):
        fresh_patches.on_import("verl.checkpoint_engine.base", broken)


def test_manager_gate_names_a_failed_config_patch(fresh_patches):
    fresh_patches.on_import("verl.utils.config", types.SimpleNamespace())  # no omega_conf_to_dataclass
    mgr = types.SimpleNamespace(rollout_config={"name": "vllm", "router": {"type": "kvc_aware"}})
    with pytest.raises(patches.VerlIncompatibleError, match=r"verl\.utils\.config\.omega_conf_to_dataclass"):
        patches.plan_for(mgr)
    assert patches.plan_for(types.SimpleNamespace(rollout_config={"name": "vllm"})) is None


@pytest.mark.parametrize("version", ["0.7.1", "0.6.0"])
def test_unsupported_release_says_so(fresh_patches, monkeypatch, version):
    monkeypatch.setattr(patches, "verl_version", lambda: version)
    with pytest.raises(patches.VerlIncompatibleError, match=rf"verl {version} .*supports verl >= 0\.8\.0"):
        patches.ensure_supported()


def test_version_parsing():
    assert detection.version_tuple("0.9.1") == (0, 9, 1)
    assert detection.version_tuple("0.10.0.dev0") == (0, 10, 0)
    assert detection.version_tuple("1.0") == (1, 0, 0)
    assert detection.version_tuple("unknown") is None
    assert detection.unsupported_reason("0.8.0") is None and detection.unsupported_reason("0.7.1")


def test_boot_and_package_agree_on_names():
    import _kvc_router_verl_boot as boot
    from kvc_router.verl import alias

    assert boot.WATCHED == patches.WATCHED
    assert boot.ALIASES == set(alias.MODULES) and boot.ALIAS_ROOT == alias.ROOT


# -- the verl.workers.rollout.llm_router alias (a stand-in verl tree) ---------

ALIAS_PROBE = r"""
import dataclasses, json, sys
import _kvc_router_verl_boot
import kvc_router
out = {}
try:
    from verl.workers.rollout.llm_router import KVCAwareBalancer
    from verl.workers.rollout.llm_router.config.strategy import KVCAwareStrategyConfig
    import verl.workers.rollout.llm_router.config as cfgmod
    s = KVCAwareStrategyConfig(alpha=0.6, load_threshold=0.7, layer_weights={"gpu": 1.0, "cpu": 0.0, "ssd": 0.0},
                               collector_names=("vllm_metrics",), weight=2.0)
    out["same_balancer"] = KVCAwareBalancer is kvc_router.KVCAwareBalancer
    out["same_strategy"] = KVCAwareStrategyConfig is cfgmod.KVCAwareStrategyConfig is kvc_router.KVCAwareStrategyConfig
    out["dataclass"] = dataclasses.is_dataclass(s)
    out["fields"] = [s.alpha, s.load_threshold, s.weight, list(s.collector_names)]
except ImportError as e:
    out["import_error"] = type(e).__name__
try:
    import verl.workers.rollout.llm_router.balancer  # not one of the fixed names
    out["other_name"] = "imported"
except ImportError:
    out["other_name"] = "refused"
mod = sys.modules.get("verl.workers.rollout.llm_router")
out["own"] = getattr(mod, "OWN", False)
print(json.dumps(out))
"""


def _fake_verl(root, ships_llm_router=False):
    pkg = root / "verl" / "workers" / "rollout"
    pkg.mkdir(parents=True)
    for d in (root / "verl", root / "verl" / "workers", pkg):
        (d / "__init__.py").write_text("")
    if ships_llm_router:
        (pkg / "llm_router").mkdir()
        (pkg / "llm_router" / "__init__.py").write_text("OWN = True\n")
    return root


def _probe_alias(root, **env):
    import json
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    pypath = os.pathsep.join([str(root), os.path.join(os.path.dirname(here), "python")])
    e = {k: v for k, v in os.environ.items() if k != "KVC_ROUTER_VERL_HOOK"}
    e.update(PYTHONPATH=pypath, **env)
    out = subprocess.run([sys.executable, "-c", ALIAS_PROBE], env=e, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_llm_router_alias_served_when_verl_lacks_it(tmp_path):
    got, err = _probe_alias(_fake_verl(tmp_path))
    assert got == {
        "same_balancer": True,
        "same_strategy": True,
        "dataclass": True,
        "fields": [0.6, 0.7, 2.0, ["vllm_metrics"]],
        "other_name": "refused",
        "own": False,
    }, err
    assert "verl ships" not in err


def test_llm_router_alias_off_with_the_hook(tmp_path):
    got, _ = _probe_alias(_fake_verl(tmp_path), KVC_ROUTER_VERL_HOOK="0")
    assert got["import_error"] == "ModuleNotFoundError"


def test_verl_own_llm_router_wins(tmp_path):
    got, err = _probe_alias(_fake_verl(tmp_path, ships_llm_router=True))
    assert got["own"] is True and "same_balancer" not in got  # verl's package has no KVCAwareBalancer
    lines = [ln for ln in err.splitlines() if "verl ships verl.workers.rollout.llm_router itself" in ln]
    assert len(lines) == 1, err


def _status(*args, root=None, **env):
    """``python -m kvc_router.verl status ARGS`` in a child: (exit code, stdout, stderr)."""
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if k != "KVC_ROUTER_VERL_HOOK"}
    if root is not None:
        here = os.path.dirname(os.path.abspath(__file__))
        e["PYTHONPATH"] = os.pathsep.join([str(root), os.path.join(os.path.dirname(here), "python")])
    e.update(env)
    out = subprocess.run(
        [sys.executable, "-m", "kvc_router.verl", "status", *args], env=e, capture_output=True, text=True, timeout=120
    )
    return out.returncode, out.stdout, out.stderr


def test_status_without_verl_says_so_and_what_to_do():
    """This venv has no verl: the pre-flight check says verl is not installed,
    names the supported releases and the install command, and exits 1."""
    import json

    rc, text, err = _status()
    assert rc == 1, err
    assert "verl: NOT INSTALLED" in text and "verl >= 0.8.0 (tested: 0.8.0, 0.9.0, 0.9.1)" in text, text
    assert "NOT READY" in text and "fix: pip install verl==0.9.1" in text, text
    assert "engines: vllm " in text and "sglang " in text and "ray " in text, text
    rc, out, err = _status("--json")
    rep = json.loads(out)
    assert rc == 1 and rep["ready"] is False and rep["verl"]["installed"] is False, err
    assert rep["verl"]["version"] is None and rep["patches"] == {}
    assert rep["kvc_router"]["error"] is None and rep["kvc_router"]["build"]["abi_version"] == 1
    assert rep["hook"]["pth"].endswith("kvc_router_verl.pth") and rep["hook"]["balancers_in_process"] == 0
    assert set(rep["engines"]) == {"vllm", "sglang"}
    assert any("verl is not installed" in p["what"] for p in rep["problems"]), rep["problems"]
    rc, _, err = _status("--bogus")
    assert rc == 2 and "usage" in err
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "kvc_router.verl", "bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr and "pre-flight" in bad.stderr


def _fake_release(root, version):
    """A verl package with published metadata of ``version`` and none of the
    modules the hook patches (what a release before 0.8.0 looks like to it).
    The real 0.7.1 wheel is checked in tests/verl (make test-verl)."""
    _fake_verl(root)
    meta = root / f"verl-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {version}\n")
    return root


def test_status_on_an_unsupported_release_names_it_and_the_upgrade(tmp_path):
    import json

    rc, text, err = _status(root=_fake_release(tmp_path, "0.7.1"))
    assert rc == 1, err
    assert "verl: 0.7.1 at " in text and "NOT SUPPORTED" in text, text
    assert "verl 0.7.1 has no LLMServerManager" in text and "fix: upgrade verl: pip install verl==0.9.1" in text
    rc, out, _ = _status("--json", root=tmp_path)
    rep = json.loads(out)
    assert rep["verl"]["version"] == "0.7.1" and rep["verl"]["supported"] is False
    # Each patch was tried by importing its module: this release has none of them.
    assert rep["patches"]["verl.workers.rollout.llm_server.LLMServerManager._init_global_load_balancer"] == {
        "state": "module absent",
        "detail": "this verl has no verl.workers.rollout.llm_server",
    }


def test_status_reports_the_hook_switched_off(tmp_path):
    rc, text, _ = _status(root=_fake_release(tmp_path, "0.9.1"), KVC_ROUTER_VERL_HOOK="0")
    assert rc == 1 and "start-up hook: OFF" in text and "fix: unset KVC_ROUTER_VERL_HOOK" in text, text
    # A supported version whose modules are missing: named per patch, with the fix.
    assert "verl: 0.9.1 at " in text and "supported (tested)" in text, text
    assert "patch verl.utils.config.omega_conf_to_dataclass: this verl has no verl.utils.config" in text, text
