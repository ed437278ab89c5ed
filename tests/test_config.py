"""Configuration: the upstream block loads verbatim in every accepted shape,
packaged defaults, translation to the native JSON, and ConfigError cases."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvc_router import ConfigError, KVCAwareBalancer, load_router_config
from kvc_router.config import library_defaults, packaged_config_path

UPSTREAM_YAML = """\
router:
  type: kvc_aware
  config:
    strategies:
      - _target_: verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig
        alpha: 0.7
        load_threshold: 0.9
        layer_weights: {gpu: 0.7, cpu: 0.2, ssd: 0.1}
        collector_names: [vllm_polling]
        weight: 1.0
    sticky_max_size: 10000
"""


@pytest.fixture
def upstream():
    import yaml

    return yaml.safe_load(UPSTREAM_YAML)


def _check_upstream(cfg):
    assert cfg.type == "kvc_aware"
    assert cfg.sticky_max_size == 10000
    # What the block sets reaches the library, which fills in the rest.
    (s,) = cfg.strategies
    defaults = library_defaults("kvc_aware")["router"]["strategies"][0]["params"]
    assert (s["name"], s["weight"]) == ("kvc_aware", 1.0)
    assert s["params"] == {
        **defaults,
        "alpha": 0.7,
        "load_threshold": 0.9,
        "layer_weights": {"gpu": 0.7, "cpu": 0.2, "ssd": 0.1},
    }
    assert cfg.collector_names == ("vllm_metrics",)
    assert cfg.validate() == cfg.effective
    # The balancer's document carries the configuration as written.
    assert cfg.native(sticky_default=5)["max_cache_size"] == 5


def test_upstream_block_every_shape(upstream, tmp_path):
    from omegaconf import OmegaConf

    path = tmp_path / "router.yaml"
    path.write_text(UPSTREAM_YAML)
    for source in (
        upstream,
        upstream["router"],
        upstream["router"]["config"],
        str(path),
        path,
        OmegaConf.create(upstream),
        OmegaConf.create(upstream)["router"],
    ):
        _check_upstream(load_router_config(source))


def test_packaged_defaults():
    d = load_router_config(None)
    assert d.type == "default" and d.collector_names == ()
    d123 = load_router_config(None, max_cache_size=123)
    assert d123.sticky_max_size == 123
    assert d123.strategies == ({"name": "least_inflight", "weight": 1.0, "params": {}},)
    k = load_router_config("kvc_aware")
    assert k.type == "kvc_aware" and k.collector_names == ("vllm_metrics",)
    assert load_router_config({"type": "kvc_aware"}) == k
    assert load_router_config({"router": {"type": "default"}}) == d
    assert packaged_config_path("kvc_aware").endswith("configs/kvc_aware.yaml")


def test_full_translation():
    cfg = load_router_config(
        {
            "type": "kvc_aware",
            "config": {
                "strategies": [
                    {"name": "kvc_aware", "alpha": 0.5, "collector_names": ["vllm_zmq", "vllm_metrics"]},
                    {"_target_": "kvc_router.config.LeastInflightStrategyConfig", "weight": 0.5},
                ],
                "block_size": 32,
                "model": "m",
                "speculate": False,
                "max_prompt_tokens": 65536,
                "max_procs": 2,
                "servers": {"a:1": {"block_size": 16, "events": False}},
                "index": {"max_entries": 1000},
                "load": {"max_num_seqs": 64},
                "collector": {
                    "interval_ms": 250,
                    "unhealthy_after": 5,
                    "urls": {"a:1": "http://a:1/m"},
                    "endpoints": {"a:1": ["a:5557", {"endpoint": "tcp://a:5558", "replay": "a:5559"}]},
                    "topic": "kv-event",
                    "replay_timeout_ms": 100,
                },
            },
        }
    )
    n = cfg.effective
    r = n["router"]
    assert [(s["name"], s["weight"], s["params"].get("alpha")) for s in r["strategies"]] == [
        ("kvc_aware", 1.0, 0.5),
        ("least_inflight", 0.5, None),
    ]
    assert r["block_size"] == 32 and r["model"] == "m" and r["speculate"] is False and r["max_prompt_tokens"] == 65536
    assert r["servers"] == {"a:1": {"block_size": 16, "events": False}}
    assert (r["load"]["max_num_seqs"], r["load"]["unhealthy_after"], r["index"]["max_entries"]) == (64, 5, 1000)
    assert n["max_procs"] == 2 and n["log_level"] == "warn"
    zmq, met = n["collectors"]["collectors"]
    library_keys = {"interval_ms": 250, "urls": {"a:1": "http://a:1/m"}, "replay_timeout_ms": 100}
    assert zmq["name"] == "vllm_zmq" and met["name"] == "vllm_metrics"
    assert {k: zmq[k] for k in library_keys} == {k: met[k] for k in library_keys} == library_keys
    assert zmq["endpoints"] == {
        "a:1": [
            {"endpoint": "tcp://a:5557", "topic": "kv-event"},
            {"endpoint": "tcp://a:5558", "replay": "tcp://a:5559", "topic": "kv-event"},
        ]
    }
    assert [e.endpoint for e in cfg.collector.endpoints["a:1"]] == ["tcp://a:5557", "tcp://a:5558"]
    assert cfg.collector.topic == "kv-event" and cfg.collector.use_handle_endpoints
    # The library accepts it.
    KVCAwareBalancer({"a:1": None}, router_config=cfg).close()


def test_packaged_yaml_is_the_library_defaults():
    """configs/kvc_aware.yaml writes out the library's defaults: every
    kvc_aware parameter, each equal to the library's value, and loading it
    yields exactly the library's effective defaults."""
    import yaml

    with open(packaged_config_path("kvc_aware"), encoding="utf-8") as f:
        (strategy,) = yaml.safe_load(f)["router"]["config"]["strategies"]
    lib = library_defaults("kvc_aware")
    (lib_strategy,) = lib["router"]["strategies"]
    written = {k: v for k, v in strategy.items() if k not in ("_target_", "collector_names", "weight")}
    assert written == lib_strategy["params"]
    assert strategy["weight"] == lib_strategy["weight"]
    effective = load_router_config("kvc_aware").validate()
    # The packaged file and the library's default for a bare type agree.
    assert load_router_config(packaged_config_path("kvc_aware")) == load_router_config("kvc_aware")
    assert load_router_config(packaged_config_path("default")) == load_router_config("default")
    # The collector entry shows the settings it runs with.
    assert effective["collectors"] == {
        "collectors": [
            {
                "name": "vllm_metrics",
                "interval_ms": 100,
                "timeout_ms": 1000,
                "max_bytes": 8 << 20,
                "backoff_max_ms": 5000,
            }
        ]
    }
    assert {**effective, "collectors": lib["collectors"]} == lib
    # The default mode likewise.
    assert {**load_router_config(None).validate()} == library_defaults("default")


def _mut(upstream, path, value):
    u = copy.deepcopy(upstream)
    node = u
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return u


S0 = ("router", "config", "strategies", 0)


@pytest.mark.parametrize(
    "path, value, key, match",
    [
        (S0 + ("_target_",), "os.system", "router.config.strategies[0]._target_", "not an allowed strategy"),
        (S0 + ("_target_",), "builtins.eval", "router.config.strategies[0]._target_", "allowed: "),
        (S0 + ("alpha",), 1.5, "router.config.strategies[0].alpha", r"in \[0, 1\]"),
        (S0 + ("alpha",), "0.7", "router.config.strategies[0].alpha", "must be a number"),
        (S0 + ("alpha",), True, "router.config.strategies[0].alpha", "must be a number"),
        (S0 + ("alpha",), float("inf"), "router.config.strategies[0].alpha", "finite"),
        (S0 + ("load_threshold",), 0, "router.config.strategies[0].load_threshold", r"\(0, 1\]"),
        (S0 + ("weight",), -1.0, "router.config.strategies[0].weight", "must be > 0"),
        (
            S0 + ("layer_weights",),
            {"gpu": 0.5, "nvme": 0.5},
            "router.config.strategies[0].layer_weights.nvme",
            "allowed: gpu, cpu, ssd",
        ),
        (S0 + ("layer_weights",), [0.7], "router.config.strategies[0].layer_weights", "must be an object"),
        (
            S0 + ("collector_names",),
            ["vllm_pollin"],
            "router.config.strategies[0].collector_names[0]",
            "allowed: 'vllm_metrics', 'vllm_polling', 'sglang_metrics', 'vllm_zmq'",
        ),
        (S0 + ("colector_names",), [], "router.config.strategies[0].colector_names", "unknown key"),
        (("router", "config", "sticky_max_size"), -5, "router.config.sticky_max_size", "must be positive"),
        (("router", "config", "sticky_max_size"), 10.5, "router.config.sticky_max_size", "must be an integer"),
        (("router", "config", "strategies"), "kvc_aware", "router.config.strategies", "must be a list"),
        (("router", "config", "cache_size"), 1, "router.config.cache_size", "unknown key"),
        (("router", "type"), "round_robin", "router.type", "allowed: 'default', 'kvc_aware'"),
        (("router", "config", "collector"), {"interval_ms": -1}, "router.config.collector.interval_ms", "negative"),
        (("router", "config", "collector"), {"intervl_ms": 1}, "router.config.collector.intervl_ms", "unknown key"),
        (
            ("router", "config", "collector"),
            {"endpoints": {"s": "http://x:1"}},
            'router.config.collector.endpoints["s"][0]',
            "allowed schemes",
        ),
        (("router", "config", "max_prompt_tokens"), -1, "router.config.max_prompt_tokens", "must be positive"),
        (("router", "config", "session_move_tokens"), 1.5, "router.config.session_move_tokens", r"0 \(off\) or in"),
        (("router", "config", "session_move_tokens"), "3", "router.config.session_move_tokens", "must be a number"),
        (("router", "config", "index"), {"max_entries": -1}, "router.config.index.max_entries", "negative"),
        (("router", "config", "log_level"), "loud", "router.config.log_level", "allowed: debug"),
        (("router", "config", "metrics_flavor"), "tgi", "router.config.metrics_flavor", "'vllm', 'sglang'"),
        (("router", "extra"), 1, "router.extra", "unknown key"),
    ],
)
def test_config_errors(upstream, path, value, key, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_router_config(_mut(upstream, path, value))
    assert info.value.key == key
    assert key in str(info.value)


def test_other_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="neither a router type"):
        load_router_config("kvc")
    with pytest.raises(ConfigError, match="cannot read"):
        load_router_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("router: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_router_config(str(bad))
    with pytest.raises(ConfigError, match="must be a dict"):
        load_router_config(42)
    with pytest.raises(ConfigError, match="needs mode kvc_aware") as info:
        load_router_config({"type": "default", "config": {"strategies": [{"name": "kvc_aware"}]}})
    assert info.value.key == "config.strategies[0].name"
    with pytest.raises(ConfigError, match="contradicts"):
        load_router_config(
            {"strategies": [{"name": "least_inflight", "_target_": "kvc_router.config.KVCAwareStrategyConfig"}]}
        )
    with pytest.raises(ConfigError, match="needs '_target_'"):
        load_router_config({"strategies": [{"alpha": 0.5}]})
    for kwargs, key in [
        ({"max_cache_size": -1}, "max_cache_size"),
        ({"max_cache_size": 0}, "max_cache_size"),
        ({"max_cache_size": "10"}, "max_cache_size"),
        ({"full_determinism": 1}, "full_determinism"),
    ]:
        with pytest.raises(ConfigError) as info:
            KVCAwareBalancer({}, **kwargs)
        assert info.value.key == key


def test_sticky_size_precedence():
    b = KVCAwareBalancer({"s0": None}, max_cache_size=7)
    assert b.get_status()["router"]["sticky_max_size"] == 7
    b.close()
    b = KVCAwareBalancer(
        {"s0": None}, max_cache_size=7, router_config={"strategies": [{"name": "kvc_aware"}], "sticky_max_size": 9}
    )
    assert b.get_status()["router"]["sticky_max_size"] == 9
    b.close()


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=6))
_keys = st.sampled_from(
    [
        "router",
        "type",
        "config",
        "strategies",
        "_target_",
        "alpha",
        "weight",
        "collector",
        "sticky_max_size",
        "layer_weights",
        "gpu",
        "name",
        "collector_names",
        "endpoints",
        "x",
    ]
)
_trees = st.recursive(
    _scalars, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(_keys, c, max_size=4)), max_leaves=12
)


@settings(max_examples=300, deadline=None)
@given(_trees)
def test_arbitrary_input_never_crashes(tree):
    try:
        cfg = load_router_config(tree) if isinstance(tree, dict) else None
    except ConfigError:
        return
    if cfg is not None:
        cfg.native()


def test_kvc_aware_refinement_knobs_reach_the_native_config() -> None:
    cfg = load_router_config(
        {
            "type": "kvc_aware",
            "config": {
                "strategies": [
                    {
                        "_target_": "kvc_router.config.KVCAwareStrategyConfig",
                        "marginal": False,
                        "token_load": False,
                        "saved_scale_tokens": 0,
                        "kv_tokens": 1000,
                    }
                ]
            },
        }
    )
    set_params = {"marginal": False, "token_load": False, "saved_scale_tokens": 0, "kv_tokens": 1000}
    params = cfg.validate()["router"]["strategies"][0]["params"]
    assert {k: params[k] for k in set_params} == set_params
    assert params["alpha"] == library_defaults("kvc_aware")["router"]["strategies"][0]["params"]["alpha"]


@pytest.mark.parametrize(
    ("key", "value"),
    [("marginal", "yes"), ("token_load", 1), ("saved_scale_tokens", -1), ("kv_tokens", 0), ("kv_tokens", 1.5)],
)
def test_kvc_aware_refinement_knobs_are_validated(key: str, value: object) -> None:
    from kvc_router.config import load_router_config
    from kvc_router.errors import ConfigError

    strategy = {"_target_": "kvc_router.config.KVCAwareStrategyConfig", key: value}
    with pytest.raises(ConfigError, match=key):
        load_router_config({"type": "kvc_aware", "config": {"strategies": [strategy]}})


# --------------------------------------------------------------------------
# Python and the library agree: configurations drawn from every key, with
# values in and out of range and of the wrong type.

_junk = st.one_of(st.text(max_size=3), st.booleans(), st.lists(st.integers(), max_size=1), st.none())
_ints = st.one_of(st.integers(-3, 70000), st.floats(-2, 3, allow_nan=False), _junk)
_fracs = st.one_of(st.floats(-0.5, 1.5, allow_nan=False), st.integers(-1, 2), _junk)


def _maybe(**fields):
    """A dict of any subset of fields (optional keys), plus maybe a typo key."""
    return st.fixed_dictionaries({}, optional={**fields, "typo_key": st.integers()})


_kvc_params = _maybe(
    alpha=_fracs,
    load_threshold=_fracs,
    weight=_fracs,
    marginal=st.one_of(st.booleans(), _junk),
    token_load=st.one_of(st.booleans(), _junk),
    kv_tokens=_ints,
    saved_scale_tokens=_ints,
    layer_weights=st.one_of(st.dictionaries(st.sampled_from(["gpu", "cpu", "ssd", "hbm"]), _fracs, max_size=3), _junk),
    collector_names=st.lists(st.sampled_from(["vllm_metrics", "vllm_polling", "vllm_zmq", "tgi"]), max_size=2),
)
_strategy = st.one_of(
    _kvc_params.map(lambda d: {"_target_": "kvc_router.config.KVCAwareStrategyConfig", **d}),
    _maybe(weight=_fracs).map(lambda d: {"name": "least_inflight", **d}),
    st.sampled_from([{"name": "round_robin"}, {"name": "kvc_aware"}, {"_target_": "os.system"}]),
)
_inner = _maybe(
    strategies=st.lists(_strategy, max_size=2),
    sticky_max_size=_ints,
    load_threshold=_fracs,
    sticky_overload=st.one_of(st.booleans(), _junk),
    block_size=_ints,
    model=st.one_of(st.text(max_size=4), st.integers()),
    speculate=st.one_of(st.booleans(), _junk),
    events_default=st.one_of(st.booleans(), _junk),
    max_prompt_tokens=_ints,
    session_move_tokens=st.one_of(st.floats(-3, 2000, allow_nan=False), _junk),
    max_procs=st.one_of(st.integers(-1, 5000), _junk),
    log_level=st.sampled_from(["debug", "warn", "loud", 3]),
    servers=st.dictionaries(st.sampled_from(["a:1", "b:2"]), _maybe(block_size=_ints, capacity=_ints), max_size=2),
    index=_maybe(max_entries=_ints, spec_ttl_ms=_ints),
    load=_maybe(max_num_seqs=_ints, unhealthy_after=_ints),
    collector=_maybe(interval_ms=_ints, timeout_ms=_ints, unhealthy_after=_ints, max_bytes=_ints),
)
_block = st.tuples(st.sampled_from(["kvc_aware", "default"]), _inner).map(
    lambda t: {"router": {"type": t[0], "config": t[1]}}
)


def _resolves(tree, key):
    """The ConfigError key names an entry of the input (``router.config.x[0].y``
    or ``...servers['a:1']``), not only some path of the library's own."""
    node = tree
    for part in re.findall(r"""\.?([^.\[\]]+)|\[(\d+)\]|\[["']([^"']*)["']\]""", key):
        name, idx, quoted = part
        if idx:
            if not isinstance(node, list) or int(idx) >= len(node):
                return False
            node = node[int(idx)]
            continue
        k = name or quoted
        if not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return True


@settings(max_examples=250, deadline=None)
@given(_block)
def test_every_rejection_names_the_users_key(tree):
    """One parser (the library's): a rejected configuration names a key of
    the input, as the user wrote it; an accepted one builds a router."""
    from kvc_router import _native

    try:
        cfg = load_router_config(tree)
    except ConfigError as e:
        assert e.key and _resolves(tree, e.key), (e.key, str(e))
        assert str(e).startswith(e.key + ": ")
        return
    _native.Router(cfg.native(sticky_default=10000)).close()


def test_strategy_dataclass_covers_the_library_params_and_sends_only_what_is_set():
    """KVCAwareStrategyConfig (verl PR #6940's name) has a field for every
    parameter the library's kvc_aware takes, and sends only the fields set."""
    import dataclasses

    from kvc_router import KVCAwareStrategyConfig, library_defaults

    params = library_defaults("kvc_aware")["router"]["strategies"][0]["params"]
    names = {f.name for f in dataclasses.fields(KVCAwareStrategyConfig)}
    assert names - {"collector_names", "weight"} == set(params)
    s = KVCAwareStrategyConfig(alpha=0.6, collector_names=("vllm_zmq",), weight=2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.alpha = 0.1  # type: ignore[misc]
    assert s.to_dict() == {"_target_": KVCAwareStrategyConfig.target, "alpha": 0.6, "collector_names": ["vllm_zmq"],
                           "weight": 2.0}  # fmt: skip
    rc = load_router_config({"type": "kvc_aware", "config": {"strategies": [s]}})
    assert rc.collector_names == ("vllm_zmq",) and rc.strategies[0]["weight"] == 2.0
    eff = rc.validate()["router"]["strategies"][0]["params"]
    assert eff == {**params, "alpha": 0.6}
    with pytest.raises(ConfigError, match=r"strategies\[0\]\.alpha"):
        load_router_config({"type": "kvc_aware", "config": {"strategies": [KVCAwareStrategyConfig(alpha=7)]}})


def _nested(depth: int, leaf: object = 1) -> object:
    v = leaf
    for i in range(depth):
        v = {"k": v} if i % 2 else [v]
    return v


@pytest.mark.parametrize(
    "where",
    ["index", "strategies", "collector", "top", "yaml", "dictconfig", "cycle"],
)
def test_deep_configs_raise_config_error(where, tmp_path):
    """Issue 20 D6: a config nested ~1,000 levels deep raised a bare
    RecursionError from the Python walk; every shape now gets a ConfigError
    naming where it is too deep (limit MAX_CONFIG_DEPTH)."""
    from kvc_router.config import MAX_CONFIG_DEPTH

    deep = _nested(1000)
    cfg = {"type": "kvc_aware", "config": {"index": {"max_entries": deep}}}
    if where == "strategies":
        cfg = {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware", "params": deep}]}}
    elif where == "collector":
        cfg = {"type": "kvc_aware", "config": {"collector": {"endpoints": {"s": deep}}}}
    elif where == "top":
        cfg = _nested(1000, {"type": "kvc_aware"})
    elif where == "cycle":
        loop: dict = {"type": "kvc_aware", "config": {}}
        loop["config"]["index"] = loop
        cfg = loop
    elif where == "yaml":
        path = tmp_path / "deep.yaml"
        path.write_text("type: kvc_aware\nconfig:\n  index: " + "[" * 3000 + "]" * 3000 + "\n")
        cfg = str(path)
    elif where == "dictconfig":
        omegaconf = pytest.importorskip("omegaconf")
        # ~80 levels already fail inside OmegaConf.create().
        cfg = omegaconf.OmegaConf.create({"type": "kvc_aware", "config": {"index": _nested(70)}})
    with pytest.raises(ConfigError, match="nested"):
        load_router_config(cfg)
    # Below the limit the walk completes and the usual key check answers.
    ok_depth = {"type": "kvc_aware", "config": {"index": {"max_entries": _nested(MAX_CONFIG_DEPTH - 6)}}}
    with pytest.raises(ConfigError) as info:
        load_router_config(ok_depth)
    assert "nested" not in str(info.value)


def test_whole_verl_config_is_recognised(upstream, tmp_path):
    """Issue 31: a whole verl YAML (actor_rollout_ref: ...) passed as the
    router config takes its router block; without one, the error names the
    key to add and how."""
    import yaml

    whole = {"actor_rollout_ref": {"rollout": {"name": "vllm", **upstream}}, "trainer": {"n_gpus_per_node": 8}}
    _check_upstream(load_router_config(whole))
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(yaml.safe_dump(whole))
    _check_upstream(load_router_config(str(path)))
    # A composed verl config whose other sections hold interpolations this
    # process cannot resolve still gives its router block.
    from omegaconf import OmegaConf

    composed = OmegaConf.create({**whole, "trainer": {"project": "${oc.env:NO_SUCH_VARIABLE_KVC}"}})
    _check_upstream(load_router_config(composed))
    with pytest.raises(ConfigError, match=r"\+actor_rollout_ref\.rollout\.router\.type=kvc_aware") as info:
        load_router_config({"actor_rollout_ref": {"rollout": {"name": "vllm"}}, "data": {}})
    assert info.value.key == "actor_rollout_ref.rollout.router"
    bad = copy.deepcopy(whole)
    bad["actor_rollout_ref"]["rollout"]["router"]["config"]["strategies"][0]["alpha"] = 2
    with pytest.raises(ConfigError) as info:
        load_router_config(bad)
    assert info.value.key == "actor_rollout_ref.rollout.router.config.strategies[0].alpha"


def test_router_config_from_keywords():
    """verl PR #6940's KVCAwareConfig(strategies=[...]) form builds the same
    configuration as the mapping; no keys is the default router."""
    from kvc_router import KVCAwareConfig, KVCAwareStrategyConfig, RouterConfig

    s = KVCAwareStrategyConfig(alpha=0.6, collector_names=("vllm_metrics",))
    kw = KVCAwareConfig(type="kvc_aware", strategies=(s,), sticky_max_size=77)
    assert kw == load_router_config({"type": "kvc_aware", "config": {"strategies": [s], "sticky_max_size": 77}})
    assert kw.sticky_max_size == 77 and kw.strategies[0]["params"]["alpha"] == 0.6
    assert RouterConfig(strategies=[s]).type == "kvc_aware"
    assert RouterConfig() == load_router_config(None)
    with pytest.raises(ConfigError, match="alpha"):
        RouterConfig(type="kvc_aware", strategies=[KVCAwareStrategyConfig(alpha=3)])


def test_integration_keys_come_from_the_library():
    """The keys only Python acts on are the library's too: defaults filled
    in, YAML's `off` (false) read as off, errors named."""
    cfg = load_router_config({"kv_events": False, "metrics": False, "collector": {"handle_timeout_ms": 250}})
    assert (cfg.kv_events, cfg.kv_events_base_port, cfg.enable_server_metrics, cfg.metrics_flavor) == (
        "off",
        0,
        False,
        "vllm",
    )
    assert cfg.metrics.enabled is False and cfg.metrics.period_s == 5.0
    assert cfg.collector.handle_timeout_ms == 250 and cfg.collector.use_handle_endpoints is True
    for inner, key in [
        ({"metrics": {"period_s": 0}}, "metrics.period_s"),
        ({"kv_events_base_port": 70000}, "kv_events_base_port"),
        ({"collector": {"use_handle_endpoints": "yes"}}, "collector.use_handle_endpoints"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_router_config({"type": "kvc_aware", "config": inner})
        assert info.value.key == "config." + key
