"""Client-side batching (kvc_router.batching) against a real balancer actor.

The batcher must not change what a caller sees: the same server ids (sticky
bindings hold), errors raised in the caller whose request failed and nowhere
else, counts that return to zero, and a dead actor surfacing as Ray's error
instead of a hang."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List

import pytest
from kvc_router import KVCAwareBalancer, batching
from kvc_router import metrics as km
from kvc_router.errors import NoServerError

KVC = {"type": "kvc_aware", "config": {"strategies": [{"name": "kvc_aware", "collector_names": []}]}}
SERVERS = {f"10.0.0.{i}:8000": None for i in range(4)}


def prompt(i: int, n: int = 64) -> List[int]:
    return [1000 * (i + 1) + t for t in range(n)]


def drained(ray: Any, lb: Any, timeout: float = 30.0) -> int:
    end = time.monotonic() + timeout
    while True:
        total = ray.get(lb.get_total_inflight.remote())
        if total == 0 or time.monotonic() > end:
            return total
        time.sleep(0.01)


# -- the actor method, in-process ---------------------------------------------


def test_route_batch_applies_releases_first_and_isolates_errors():
    lb = KVCAwareBalancer(dict(SERVERS), router_config=KVC)
    sid, _ = lb.acquire_server("r0", prompt(0))
    assert lb.get_total_inflight() == 1
    out = lb.route_batch([sid], [("r1", prompt(1)), ("r2", ["x"]), ("r3", prompt(3)), ("r4",)])
    assert len(out) == 4
    assert out[0][0] in SERVERS and out[2][0] in SERVERS
    assert isinstance(out[1], TypeError) and "found str 'x'" in str(out[1])
    assert isinstance(out[3], ValueError)  # malformed item: its own error
    # r0 released before the batch's acquires, and only the two good acquires count.
    assert lb.get_total_inflight() == 2
    # Sticky through the batch path, as through acquire_server.
    assert lb.route_batch([], [("r1", prompt(1))])[0][0] == out[0][0]


def test_route_batch_on_empty_pool_raises_verls_message_per_item():
    lb = KVCAwareBalancer({}, router_config=KVC)
    (err,) = lb.route_batch([], [("r", prompt(0))])
    assert isinstance(err, NoServerError) and "No available servers in load balancer" in str(err)


def test_pack_prompt():
    packed = batching.pack_prompt([1, -2, 3])
    assert packed.typecode == "i" and list(packed) == [1, -2, 3]
    for bad in (["x"], [2**31], "abc", None):
        assert batching.pack_prompt(bad) is bad  # left for the actor to reject precisely


# -- the batcher against a real actor ------------------------------------------


def test_batcher_coalesces_concurrent_callers_and_keeps_sticky(make_actor, ray_cluster):
    lb = make_actor(servers=dict(SERVERS), router_config=KVC)
    assert batching.supports_batching(lb)

    async def main():
        b = batching.batcher_for(lb)
        assert b is batching.batcher_for(lb)  # one per loop and actor
        first = await asyncio.gather(*(b.acquire(f"req-{i}", prompt(i)) for i in range(64)))
        sent = b.batches
        for sid, _ in first:
            b.release(sid)
        again = await asyncio.gather(*(b.acquire(f"req-{i}", prompt(i)) for i in range(64)))
        for sid, _ in again:
            b.release(sid)
        await asyncio.sleep(0)
        return first, again, sent, b

    first, again, sent, b = asyncio.run(main())
    assert all(sid in SERVERS for sid, _ in first)
    assert [s for s, _ in again] == [s for s, _ in first]  # request_id stays sticky
    assert sent < 64 / 4  # 64 concurrent callers shared a handful of actor calls
    assert b.carried == 64 * 4  # every acquire and release travelled
    st = ray_cluster.get(lb.get_status.remote())["router"]["client_batches"]
    assert st == {"calls": b.batches, "acquires": 128, "releases": 128}
    assert drained(ray_cluster, lb) == 0


def test_batch_size_caps_keep_arguments_inline(make_actor, ray_cluster):
    lb = make_actor(servers=dict(SERVERS), router_config=KVC)

    async def main(**caps: int) -> Any:
        b = batching.Batcher(lb, asyncio.get_running_loop(), max_inflight=1, **caps)
        res = await asyncio.gather(*(b.acquire(f"cap-{i}", prompt(i, n=64)) for i in range(12)))
        for sid, _ in res:
            b.release(sid)
        await asyncio.sleep(0)
        return res, b.batches

    # 64 tokens = 256 bytes: two prompts fit in 600 bytes, a third does not.
    res, batches = asyncio.run(main(max_batch_bytes=600))
    assert all(sid in SERVERS for sid, _ in res) and batches >= 12 / 2
    res, batches = asyncio.run(main(max_batch=3))
    assert batches >= 12 / 3
    # One prompt larger than the cap still goes (alone).
    res, batches = asyncio.run(main(max_batch_bytes=10))
    assert batches >= 12 and len(res) == 12
    assert drained(ray_cluster, lb) == 0
    assert batching._payload(batching.pack_prompt(prompt(0, n=64))) == 256


def test_batcher_failed_acquire_raises_in_its_caller_only(make_actor, ray_cluster):
    lb = make_actor(servers=dict(SERVERS), router_config=KVC)

    async def main():
        b = batching.batcher_for(lb)
        res = await asyncio.gather(
            *(b.acquire(f"r{i}", ["bad"] if i == 5 else prompt(i)) for i in range(12)), return_exceptions=True
        )
        for r in res:
            if not isinstance(r, BaseException):
                b.release(r[0])
        await asyncio.sleep(0)
        return res

    res = asyncio.run(main())
    assert isinstance(res[5], TypeError) and "found str 'bad'" in str(res[5])
    assert all(r[0] in SERVERS for i, r in enumerate(res) if i != 5)
    assert drained(ray_cluster, lb) == 0


def test_cancelled_caller_has_its_server_released(make_actor, ray_cluster):
    lb = make_actor(servers=dict(SERVERS), router_config=KVC)

    async def main():
        b = batching.batcher_for(lb)
        await b.acquire("warm", prompt(0))  # fields known, one request counted
        b.release((await b.acquire("warm", prompt(0)))[0])
        task = asyncio.ensure_future(b.acquire("gone", prompt(1)))
        await asyncio.sleep(0)
        while b._acquires or b._scheduled:  # until the batch carrying "gone" left
            await asyncio.sleep(0)
        assert b._inflight >= 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Let the actor's answer arrive and the compensating release go out.
        for _ in range(500):
            await asyncio.sleep(0.01)
            if b._inflight == 0 and not b._releases:
                break

    asyncio.run(main())
    # Only "warm"'s first acquire is still counted; "gone" was given back.
    assert ray_cluster.get(lb.get_total_inflight.remote()) == 1


def test_dead_actor_fails_every_pending_caller(make_actor, ray_cluster):
    import ray

    lb = make_actor(servers=dict(SERVERS), router_config=KVC)

    async def main():
        b = batching.batcher_for(lb)
        await b.acquire("ok", prompt(0))
        ray.kill(lb)
        # ray.kill is asynchronous: wait until the actor is known dead, so a
        # batch sent next cannot still be served by it.
        for _ in range(600):
            try:
                await lb.get_total_inflight.remote()
            except ray.exceptions.RayActorError:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("actor still answering 30 s after ray.kill")
        return await asyncio.wait_for(
            asyncio.gather(*(b.acquire(f"r{i}", prompt(i)) for i in range(8)), return_exceptions=True), 60
        )

    res = asyncio.run(main())
    assert len(res) == 8 and all(isinstance(r, ray.exceptions.RayActorError) for r in res)


def test_batching_off_by_env_and_for_other_balancers(make_actor, ray_cluster, monkeypatch):
    lb = make_actor(servers=dict(SERVERS), router_config=KVC)

    class Plain:  # a balancer without route_batch (as verl's own)
        def acquire_server(self, request_id: str) -> Any:
            return "s", None

    plain = ray_cluster.remote(Plain).remote()
    try:

        async def probe():
            return batching.batcher_for(lb), batching.batcher_for(plain)

        ours, theirs = asyncio.run(probe())
        assert ours is not None and theirs is None
        assert batching.batcher_for(lb) is None  # no running event loop
        monkeypatch.setenv(batching.ENV, "0")
        assert asyncio.run(probe()) == (None, None)
    finally:
        ray_cluster.kill(plain)


# -- the verl client patch on verl's two client shapes (stand-ins; tests/verl
# runs the real releases) -----------------------------------------------------


def _client_shapes() -> dict:
    class Client091:  # verl 0.9.1: forwards the declared fields itself
        def __init__(self, lb: Any) -> None:
            self._load_balancer, self._lb_require_acquire_fields, self.calls = lb, None, 0

        async def _acquire_server(self, request_id: str, **extra: Any) -> Any:
            self.calls += 1
            if self._lb_require_acquire_fields is None:
                self._lb_require_acquire_fields = list(await self._load_balancer.require_acquire_fields.remote())
            fields = {k: extra[k] for k in self._lb_require_acquire_fields if k in extra}
            return await self._load_balancer.acquire_server.remote(request_id=request_id, **fields)

        def _release_server(self, server_id: str, request_id: Any = None) -> None:
            self._load_balancer.release_server.remote(server_id=server_id)

        async def generate(self, request_id: str, *, prompt_ids: Any, sampling_params: Any) -> str:
            sid, _ = await self._acquire_server(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
            self._release_server(sid, request_id=request_id)
            return sid

    class Client080:  # verl 0.8.0 / 0.9.0: acquire takes the request id only
        def __init__(self, lb: Any) -> None:
            self._load_balancer, self.calls = lb, 0

        async def _acquire_server(self, request_id: str) -> Any:
            self.calls += 1
            return await self._load_balancer.acquire_server.remote(request_id=request_id)

        def _release_server(self, server_id: str) -> None:
            self._load_balancer.release_server.remote(server_id=server_id)

        async def generate(self, request_id: str, *, prompt_ids: Any, sampling_params: Any) -> str:
            sid, _ = await self._acquire_server(request_id)
            self._release_server(sid)
            return sid

    return {"0.9.1": Client091, "0.8.0": Client080}


@pytest.mark.parametrize("shape", ["0.9.1", "0.8.0"])
def test_verl_client_patch_batches_for_ours_and_leaves_verls_alone(make_actor, ray_cluster, shape):
    import types

    from kvc_router.verl import patches

    cls = _client_shapes()[shape]
    assert patches.patch_client(types.SimpleNamespace(LLMServerClient=cls)) == patches.APPLIED
    ours = make_actor(servers=dict(SERVERS), router_config=KVC)
    prompts = [prompt(i) for i in range(24)]

    async def run(lb: Any) -> Any:
        c = cls(lb)
        sids = await asyncio.gather(
            *(c.generate(f"v-{i}", prompt_ids=p, sampling_params={}) for i, p in enumerate(prompts))
        )
        await asyncio.sleep(0.2)
        b = batching.batcher_for(lb)
        return sids, c.calls, (b.batches, b.carried)

    sids, calls, (batches, carried) = asyncio.run(run(ours))
    assert all(s in SERVERS for s in sids)
    assert calls == 0 and carried == 48 and batches < 24  # verl's acquire body never ran: batched
    st = ray_cluster.get(ours.get_status.remote())["router"]
    assert st["counters"]["prompt_tokens"] == sum(len(p) for p in prompts)  # prompts reached the router
    assert drained(ray_cluster, ours) == 0

    # A balancer without route_batch (verl's own, here a stand-in) gets verl's calls.
    class VerlLike:
        def acquire_server(self, request_id: str) -> Any:
            return "s0", None

        def release_server(self, server_id: str) -> None:
            pass

        def require_acquire_fields(self) -> list:
            return []

    verl_lb = ray_cluster.remote(VerlLike).remote()
    try:
        c = cls(verl_lb)

        async def one() -> str:
            return await c.generate("x", prompt_ids=prompt(0), sampling_params={})

        assert asyncio.run(one()) == "s0" and c.calls == 1
    finally:
        ray_cluster.kill(verl_lb)


# -- releases carry the output's length to the learner ------------------------

KVC_LENGTHS = {
    "type": "kvc_aware",
    "config": {"strategies": [{"name": "kvc_aware", "collector_names": []}], "lengths": {"enabled": True}},
}


class _Out:
    """A generate output as verl's TokenOutput holds it."""

    def __init__(self, n: int) -> None:
        self.token_ids = list(range(n))


@pytest.mark.parametrize("shape", ["0.9.1", "0.8.0"])
@pytest.mark.parametrize("batch", ["1", "0"])
def test_verl_client_patch_sends_output_counts_with_releases(make_actor, ray_cluster, monkeypatch, shape, batch):
    """With our balancer, a generate's release leaves when the generate
    returns and names the request and its output's token count (verl's own
    release sends neither): the router learns one length per request. A
    generate that fails after its acquire is released without a count."""
    import types

    from kvc_router.verl import patches

    monkeypatch.setenv(batching.ENV, batch)
    base = _client_shapes()[shape]

    class Client(base):  # type: ignore[misc, valid-type]
        async def generate(self, request_id: str, *, prompt_ids: Any, sampling_params: Any) -> Any:
            sid, _ = await self._acquire_server(request_id, **({"prompt_ids": prompt_ids} if shape == "0.9.1" else {}))
            try:
                if sampling_params.get("fail"):
                    raise RuntimeError("engine died")
                return _Out(10 + int(request_id.split("-")[1]))
            finally:
                self._release_server(sid, **({"request_id": request_id} if shape == "0.9.1" else {}))

    assert patches.patch_client(types.SimpleNamespace(LLMServerClient=Client)) == patches.APPLIED
    lb = make_actor(servers=dict(SERVERS), router_config=KVC_LENGTHS)

    async def run() -> Any:
        c = Client(lb)
        outs = await asyncio.gather(
            *(c.generate(f"v-{i}", prompt_ids=prompt(i), sampling_params={}) for i in range(12))
        )
        with pytest.raises(RuntimeError, match="engine died"):
            await c.generate("v-99", prompt_ids=prompt(99), sampling_params={"fail": True})
        return outs

    outs = asyncio.run(run())
    assert [len(o.token_ids) for o in outs] == [10 + i for i in range(12)]
    assert drained(ray_cluster, lb) == 0
    lengths = ray_cluster.get(lb.get_status.remote())["router"]["lengths"]
    # 12 counts; the failed request's release named no request (nothing learnt).
    assert lengths["observed_tokens"] == 12 and lengths["observed_durations"] == 0, lengths
    assert lengths["unmatched_releases"] == 0 and lengths["prompts"] == 12, lengths


def test_release_server_counts_bad_output_tokens_and_still_releases():
    lb = KVCAwareBalancer(dict(SERVERS), router_config=KVC_LENGTHS)
    assert lb.require_release_fields() == ["request_id"]
    for i, bad in enumerate([-1, 1 << 30, 2.5, True, "7"]):
        sid, _ = lb.acquire_server(f"b{i}", prompt(i))
        lb.release_server(sid, request_id=f"b{i}", output_tokens=bad)
    sid, _ = lb.acquire_server("ok", prompt(50))
    lb.release_server(sid, request_id="ok", output_tokens=33)
    st = lb.get_status()["router"]
    assert st["total_inflight"] == 0 and st["bad_output_tokens"] == 5
    # The bad ones were learnt as durations (or nothing, at 0 ms): never as counts.
    assert st["lengths"]["observed_tokens"] == 1 and st["lengths"]["unmatched_releases"] == 0
    # The defaults learn too, for the correlations group_spread_min_corr and
    # task_spread_min_corr read; either spread alone still asks for the id;
    # with no spread to gate, nothing learns and no id is asked for.
    assert KVCAwareBalancer(dict(SERVERS), router_config=KVC).require_release_fields() == ["request_id"]
    base = KVC["config"]["strategies"][0]
    for off in ({"group_spread": 0}, {"task_spread": 0}):
        one = {"type": "kvc_aware", "config": {"strategies": [{**base, **off}]}}
        assert KVCAwareBalancer(dict(SERVERS), router_config=one).require_release_fields() == ["request_id"], off
    no_spread = {"type": "kvc_aware", "config": {"strategies": [{**base, "group_spread": 0, "task_spread": 0}]}}
    assert KVCAwareBalancer(dict(SERVERS), router_config=no_spread).require_release_fields() == []


def test_work_weight_places_by_the_output_releases_taught():
    """kvc_aware's work_weight (with lengths on) counts the output the router
    learnt for a server's in-flight requests as load: once one server runs a
    prompt whose responses were long, new short requests go elsewhere until
    its release (naming the request, with its count) takes the charge back."""
    cfg = {
        "type": "kvc_aware",
        "config": {
            "strategies": [
                {"name": "kvc_aware", "collector_names": [], "work_weight": 1.0, "group_spread": 0.0,
                 "task_spread": 0.0, "session_weight": 0.0, "kv_tokens": 10000}
            ],
            "lengths": {"enabled": True},
        },
    }
    servers = {"10.0.0.1:8000": None, "10.0.0.2:8000": None}
    first, second = list(servers)
    with KVCAwareBalancer(dict(servers), router_config=cfg) as lb:
        # Teach: prompt 0 answers 6,000 tokens, prompts 1-4 answer 10.
        for i, n in ((0, 6000), (1, 10), (2, 10), (3, 10), (4, 10)):
            sid, _ = lb.acquire_server(f"t{i}", prompt(i))
            lb.release_server(sid, request_id=f"t{i}", output_tokens=n)
        lb.reset_prefix_index()  # a weight sync: a new step, lengths kept
        long_sid, _ = lb.acquire_server("long", prompt(0))
        assert long_sid == first
        shorts = [lb.acquire_server(f"s{i}", prompt(i))[0] for i in (1, 2, 3, 4)]
        assert shorts == [second] * 4, shorts
        st = lb.get_status()
        predicted = st["router"]["lengths"]["predicted_tokens"]
        assert predicted == {first: 6000.0, second: 40.0}, predicted
        # The same figures go to Prometheus, one gauge per server.
        exported = {dict(lab)["server"]: v for name, lab, v in km.samples(st) if name == "lengths_predicted_tokens"}
        assert exported == predicted, exported
        lb.release_server(long_sid, request_id="long", output_tokens=5900)
        assert lb.get_status()["router"]["lengths"]["predicted_tokens"][first] == 0.0
        assert lb.acquire_server("after", prompt(9))[0] == first


def test_work_weight_without_lengths_is_refused_by_name():
    cfg = {
        "type": "kvc_aware",
        "config": {"strategies": [{"name": "kvc_aware", "collector_names": [], "work_weight": 1.0}]},
    }
    with pytest.raises(ValueError, match=r"work_weight.*lengths\.enabled"):
        KVCAwareBalancer(dict(SERVERS), router_config=cfg)


def test_status_shows_the_measured_length_correlation():
    """A weight sync ends a step: the router reports how alike a prompt's
    samples were (the intra-class correlation of their log lengths) in the
    status and as a gauge; before any step ends there is none, and
    longest-first stays closed (lengths.min_corr) until there is."""
    def gated(st: dict) -> list:
        return [v for n, _, v in km.samples(st) if n == "lengths_longest_first_gated"]

    with KVCAwareBalancer(dict(SERVERS), router_config=KVC_LENGTHS) as lb:
        assert not lb.get_status()["router"]["lengths"]["length_corr_known"]
        assert not [n for n, _, _ in km.samples(lb.get_status()) if n == "lengths_corr"]
        assert lb.get_status()["router"]["lengths"]["longest_first_gated"] and gated(lb.get_status()) == [1]
        for k in range(10):
            for j in range(4):
                rid = f"p{k}-{j}"
                sid, _ = lb.acquire_server(rid, prompt(k))
                lb.release_server(sid, request_id=rid, output_tokens=100 * (k + 1) + j)
        lb.reset_prefix_index()
        st = lb.get_status()
        lens = st["router"]["lengths"]
        assert lens["length_corr_known"] and 0.99 < lens["length_corr"] <= 1.0, lens
        assert [v for n, _, v in km.samples(st) if n == "lengths_corr"] == [lens["length_corr"]]
        assert not lens["longest_first_gated"] and gated(st) == [0]


def test_status_shows_the_measured_task_correlation():
    """Agent trajectories (a request id kept over its turns, each turn
    released with its output tokens) are summed per trajectory and grouped
    by their first turn's prompt: at a weight sync the router reports how
    alike a task's trajectories were, which kvc_aware's task_spread_min_corr
    reads. Here a task sets its trajectories' later turns while the first
    turns are alike for every task."""
    with KVCAwareBalancer(dict(SERVERS), router_config=KVC) as lb:
        assert not lb.get_status()["router"]["lengths"]["task_corr_known"]
        for k in range(10):
            for j in range(4):
                rid = f"t{k}-{j}"
                p = prompt(k)
                for turn in range(3):
                    sid, _ = lb.acquire_server(rid, p)
                    out = 100 + j if turn == 0 else 50 * (k + 1) ** 2 + j
                    lb.release_server(sid, request_id=rid, output_tokens=out)
                    p = p + [90_000 + 1000 * k + 100 * j + turn] * 16
        lb.reset_prefix_index()
        st = lb.get_status()
        lens = st["router"]["lengths"]
        assert lens["task_corr_known"] and 0.95 < lens["task_corr"] <= 1.0, lens
        assert [v for n, _, v in km.samples(st) if n == "lengths_task_corr"] == [lens["task_corr"]]
