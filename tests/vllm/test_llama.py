"""Two real vLLM engines (full-attention tiny Llama, block 32): what the
router learns from their /metrics and KV events, replay, the reset, and
routing end to end against verl's default balancer on the same requests."""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Any, Dict, List

import pytest
from vllm_lib import balancer, index_blocks, prompt, served, settle, wait_until


@pytest.fixture(scope="module")
def engines(reaper: Any, models: Dict[str, str]) -> List[Any]:
    from kvc_harness import vllm_cpu

    return vllm_cpu.start_engines(reaper, [models["llama"], models["llama"]], kv_cache_bytes=64 << 20)


def test_metrics_parsed(engines: List[Any]) -> None:
    """/metrics of vLLM 0.32: the block size from vllm:cache_config_info,
    load gauges, no scrape errors."""
    from kvc_harness.balancer import server_status

    lb = balancer(engines, collectors=("vllm_metrics",))
    try:

        def scraped() -> Any:
            st = lb.get_status()
            return st if all(server_status(st, e.sid)["load"]["has_metrics"] for e in engines) else None

        st = wait_until(scraped, 60, "a scrape of every engine")
        for e in engines:
            s = server_status(st, e.sid)
            assert s["block_size"] == 32, s
            assert s["load"]["healthy"], s
            assert s["load"]["scrapes"] > 0 and s["load"]["errors"] == 0, s
    finally:
        lb.close()


def test_events_and_block_size_from_events(engines: List[Any]) -> None:
    """With KV events alone (no /metrics), every batch decodes, nothing is
    dropped, and queries are keyed at the block size the events carry (32,
    not the router's default 16): the prompt the engine cached is found."""
    from kvc_harness.balancer import publisher_status

    a = engines[0]
    lb = balancer(engines, collectors=("vllm_zmq",))
    try:
        p = prompt(1, 200)
        a.complete(p, max_tokens=2)
        wait_until(lambda: index_blocks(lb, a.sid) >= 6, 60, "the prompt's 6 blocks in the index")
        d = lb.acquire_server_detail("q1", p + prompt(2, 10))
        lb.release_server(d["server"])
        assert d["server"] == a.sid and d["block_size"] == 32 and sum(d["hit_blocks"]) == 6, d
        ev = publisher_status(lb.get_status(), a.sid)["events"]
        assert ev["decode_errors"] == 0 and not ev.get("dropped_events") and ev["stored_blocks"] >= 6, ev
    finally:
        lb.close()


def test_replay_fills_a_late_subscriber(engines: List[Any]) -> None:
    """A balancer started after the engine published learns those blocks
    from the replay endpoint (vLLM's ring buffer), without a new request."""
    from kvc_harness.balancer import publisher_status

    b = engines[1]
    p = prompt(3, 160)
    b.complete(p, max_tokens=2)
    lb = balancer(engines, collectors=("vllm_zmq",))
    try:
        wait_until(lambda: index_blocks(lb, b.sid) >= 5, 60, "replayed blocks in the index")
        pub = publisher_status(lb.get_status(), b.sid)
        assert pub["replays"] >= 1 and pub["startup_unreplayed"] == 0, pub
    finally:
        lb.close()


def test_reset_clears_with_the_next_step(engines: List[Any]) -> None:
    """POST /reset_prefix_cache (verl's clear_kv_cache): vLLM 0.32 publishes
    AllBlocksCleared only with its next step, then the index drops the
    server's blocks; the router's own reset_prefix_index needs no event."""
    from kvc_harness.balancer import publisher_status

    a = engines[0]
    lb = balancer(engines, collectors=("vllm_zmq",))
    try:
        p = prompt(4, 128)
        a.complete(p, max_tokens=2)
        wait_until(lambda: index_blocks(lb, a.sid) >= 4, 60, "blocks in the index")
        cleared = publisher_status(lb.get_status(), a.sid)["events"]["cleared"]
        a.reset_prefix_cache()
        a.complete(prompt(5, 40), max_tokens=2)  # the step that carries the clear
        wait_until(
            lambda: publisher_status(lb.get_status(), a.sid)["events"]["cleared"] > cleared, 60, "AllBlocksCleared"
        )
        d = lb.acquire_server_detail("after-reset", p + [7])
        lb.release_server(d["server"])
        assert sum(d["hit_blocks"]) == 0, d
    finally:
        lb.close()


def test_lengths_from_kv_events(engines: List[Any]) -> None:
    """verl without the hook releases with the request id and no count:
    the router reads each output's length off the engine's KV events (every
    block decode fills is a BlockStored chained to the one before, the first
    to the prompt's last full block), for two samples of one prompt decoding
    together, instead of learning the acquire-to-release time."""
    by_sid = {e.sid: e for e in engines}
    lb = balancer(engines, collectors=("vllm_zmq",), lengths={"enabled": True})
    try:
        # Until a server's first event the router keys prompts at its own
        # block size (16); the engines' is 32.
        for e in engines:
            e.complete(prompt(20 + len(e.sid), 64), max_tokens=2)
            wait_until(lambda e=e: index_blocks(lb, e.sid) >= 2, 60, f"{e.sid}'s first blocks in the index")
        p = prompt(21, 100)  # 3 full blocks of 32, 4 tokens into the fourth
        rids = ["len-a", "len-b"]
        sids = [lb.acquire_server(rid, p)[0] for rid in rids]
        with cf.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda sid: by_sid[sid].complete(p, max_tokens=96), sids))
        for sid in set(sids):
            settle(lb, sid)
        for rid, sid in zip(rids, sids):
            lb.release_server(sid, request_id=rid)
        lens = lb.get_status()["router"]["lengths"]
        assert lens["observed_from_events"] == 2, lens
        assert lens["observed_tokens"] == lens["observed_durations"] == lens["unmatched_releases"] == 0, lens
    finally:
        lb.close()


def _run(engines: List[Any], policy: str, groups: List[List[int]], samples: int) -> Dict[str, float]:
    """One GRPO-like step: every group's samples sent concurrently through
    the balancer; returns the engines' own prefix-cache counters' deltas."""
    from kvc_harness.client import parse_counters

    if policy != "kvc_aware":
        for e in engines:
            e.reset_prefix_cache()
    lb = balancer(engines) if policy == "kvc_aware" else _verl_default(engines)
    try:
        if policy == "kvc_aware":
            from kvc_harness.balancer import server_status

            wait_until(
                lambda: all(server_status(lb.get_status(), e.sid)["load"]["has_metrics"] for e in engines),
                60,
                "scrapes",
            )
            _reset_seen(lb, engines)
        before = {e.sid: parse_counters(e.metrics_text()) for e in engines}
        by_sid = {e.sid: e for e in engines}
        reqs = [(f"{policy}-{g}-{s}", p) for s in range(samples) for g, p in enumerate(groups)]
        placed: Dict[str, set] = {}

        def one(rid_p: Any) -> int:
            rid, p = rid_p
            sid, _ = lb.acquire_server(rid, p)
            placed.setdefault(rid.rsplit("-", 1)[0], set()).add(sid)
            try:
                return served(by_sid[sid].complete(p, max_tokens=8).get("usage"))
            finally:
                lb.release_server(sid)

        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(one, reqs))
        after = {e.sid: parse_counters(e.metrics_text()) for e in engines}
        # What a failure needs to be read: how many servers each group went
        # to, and what the router's event feeds had applied.
        from kvc_harness.balancer import publisher_status

        st = lb.get_status()
        feeds = {}
        if policy == "kvc_aware":
            feeds = {e.sid: (publisher_status(st, e.sid).get("events") or {}) for e in engines}
    finally:
        lb.close()
    q = sum(after[s]["queries"] - before[s]["queries"] for s in after)
    h = sum(after[s]["hits"] - before[s]["hits"] for s in after)
    return {"queries": q, "hits": h, "hit_rate": h / q if q else 0.0,
            "servers_per_group": sorted(len(v) for v in placed.values()),
            "events": {sid: {k: ev.get(k) for k in ("stored_blocks", "removed_blocks", "cleared")}
                       for sid, ev in feeds.items()}}


def _replay_quiet(lb: Any, engines: List[Any], still_s: float = 2.0, timeout: float = 60.0) -> None:
    """Waits until a new subscription's replay of the engines' history is
    over: no subscription's sequence number moves for still_s."""
    from kvc_harness.balancer import publisher_status

    def seqs() -> List[Any]:
        st = lb.get_status()
        return [publisher_status(st, e.sid).get("last_seq") for e in engines]

    last, since, deadline = seqs(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() - since < still_s:
        if time.monotonic() > deadline:
            raise AssertionError(f"the KV-event replay did not settle in {timeout:.0f}s: {last}")
        time.sleep(0.1)
        now = seqs()
        if now != last:
            last, since = now, time.monotonic()


def _reset_seen(lb: Any, engines: List[Any], still_s: float = 2.0, timeout: float = 60.0) -> None:
    """The weight sync done before the step, as a running router sees it.
    A new subscription first replays each engine's history (the earlier
    tests' blocks and resets), and vLLM publishes a reset's cache-cleared
    event only with the engine's next step: either clear, applied while the
    step is being routed, wipes the siblings the router has just placed
    (on a CI host slow enough, kvc_aware's hits fell to default's). So: wait
    until the replay is over (no subscription's sequence number moves for
    still_s while the engines are idle), reset the engines, run one tiny
    request on each so the clear is published, and wait until the router
    has applied each engine's clear and its index holds nothing."""
    from kvc_harness.balancer import publisher_status

    _replay_quiet(lb, engines, still_s, timeout)

    def cleared() -> Dict[str, int]:
        st = lb.get_status()
        return {e.sid: int(publisher_status(st, e.sid)["events"].get("cleared", 0)) for e in engines}

    before = cleared()
    for e in engines:
        e.reset_prefix_cache()
        # vLLM publishes the reset's cache-cleared event with the engine's
        # next step: one tiny request (no full block, so nothing stored).
        e.complete(prompt(990 + engines.index(e), 8), max_tokens=1)
    def applied() -> bool:
        return all(n > before[sid] for sid, n in cleared().items()) and all(
            index_blocks(lb, e.sid) == 0 for e in engines
        )

    wait_until(applied, timeout, "each engine's reset applied by the router")


def _verl_default(engines: List[Any]) -> Any:
    from kvc_router import KVCAwareBalancer

    return KVCAwareBalancer(servers={e.sid: None for e in engines}, router_config=None)


def test_routing_end_to_end_beats_verl_default(engines: List[Any], capsys: Any) -> None:
    """The same GRPO step (6 prompts x 8 samples, sent 8 at a time) through
    verl's default balancer and through kvc_aware with live metrics and
    events: the engines' own counters say kvc_aware gets more prefix hits."""
    groups = [prompt(100 + g, 256) for g in range(6)]
    default = _run(engines, "verl_default", groups, samples=8)
    kvc = _run(engines, "kvc_aware", groups, samples=8)
    with capsys.disabled():
        print(
            "\n  real vLLM, 2 engines: prefix hit rate "
            f"verl_default {default['hit_rate']:.1%}, kvc_aware {kvc['hit_rate']:.1%}"
        )
    assert default["queries"] == kvc["queries"] > 0
    assert kvc["hit_rate"] > default["hit_rate"], (default, kvc)


def test_weight_sync_late_clear_keeps_the_next_rollouts_placements(engines: List[Any]) -> None:
    """verl's weight sync on real vLLM: every engine's /reset_prefix_cache,
    then reset_prefix_index(). vLLM publishes each reset only with that
    engine's next step, the next rollout's first, by when the router has
    placed that rollout's first requests there. The late clear drops the old
    weights' blocks and keeps those placements: the group's next sample
    still follows its siblings, with their prompt predicted resident."""
    from kvc_harness.balancer import index_server

    by_sid = {e.sid: e for e in engines}
    # Siblings follow their prefix holder: the spreads and a fresh router's
    # multi-turn presumption (session_weight) would split them on purpose.
    strategy = {"_target_": "kvc_router.config.KVCAwareStrategyConfig", "collector_names": ["vllm_zmq"],
                "group_spread": 0, "task_spread": 0, "session_weight": 0}
    lb = balancer(engines, collectors=("vllm_zmq",), strategies=[strategy])
    placed: List[str] = []
    try:
        _replay_quiet(lb, engines)
        for i, e in enumerate(engines):  # the old weights' blocks on every engine
            e.complete(prompt(40 + i, 128), max_tokens=2)
            wait_until(lambda e=e: index_blocks(lb, e.sid) >= 4, 60, f"{e.sid}'s blocks in the index")
        for e in engines:
            e.reset_prefix_cache()
        lb.reset_prefix_index()
        time.sleep(1.0)  # an idle vLLM publishes no reset, however long it waits

        def resets(sid: str) -> int:
            return int(index_server(lb.get_status(), sid)["reset_clears"])

        assert [resets(e.sid) for e in engines] == [0, 0]
        p = prompt(42, 8 * 32 + 1)  # 8 full blocks of 32, all hittable
        for i in range(3):
            placed.append(lb.acquire_server(f"late-{i}", p)[0])
        holder = placed[0]
        assert placed == [holder] * 3, placed
        by_sid[holder].complete(prompt(43, 40), max_tokens=2)  # the holder's first step carries its reset
        wait_until(lambda: resets(holder) == 1, 60, "the holder's late reset applied")
        ix = index_server(lb.get_status(), holder)
        assert ix["kept_speculative"] >= 8, ix
        d = lb.acquire_server_detail("late-3", p)
        placed.append(d["server"])
        assert d["server"] == holder and sum(d["hit_blocks"]) == 8 and d["block_size"] == 32, d
    finally:
        for sid in placed:
            lb.release_server(sid)
        lb.close()
