"""Records a differential trace against the real NVIDIA Dynamo KV router.

Runs ``dynamo._core.KvRouter`` (ai-dynamo-runtime from .venv-peers, at its
defaults: ``KvRouterConfig()``) over ``--workers`` workers registered with a
model card, feeds it KV events through Dynamo's own publisher
(``KvEventPublisher.publish_stored`` / ``publish_removed``), and routes a
seeded request stream with ``best_worker(tokens, request_id=...)``,
``mark_prefill_complete`` and ``free``. Every operation and every Dynamo
answer (chosen worker, overlap, and ``get_potential_loads`` just before the
decision) is written as JSON. ``go test ./testbed/peers -run
TestDynamoDifferential`` replays the same operations through kvbench's
``dynamo_cost`` (peers.Dynamo.Cost with the bench driver's router-local
accounting) and compares the choices.

Run with the peers venv's Python (nothing else is needed):
  .venv-peers/bin/python testbed/scripts/dynamo_diff.py --out testbed/peers/testdata/dynamo_trace.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

os.environ.setdefault("DYN_LOG", "error")
for _k in ("DYN_TCP_RPC_HOST", "DYN_EVENT_PLANE_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_SYSTEM_HOST"):
    os.environ.setdefault(_k, "127.0.0.1")

BS = 16


async def _never_called(request: Any) -> Any:  # pragma: no cover
    raise RuntimeError("not served")
    yield request


async def record(workers: int, ops: int, seed: int) -> Dict[str, Any]:
    import dynamo._core as c

    disc = tempfile.mkdtemp(prefix="kvc-dynamo-diff-")
    os.environ["DYN_FILE_KV"] = disc
    loop = asyncio.get_running_loop()
    rts, pubs, ids = [], [], []
    try:
        for _ in range(workers):
            rt = c.DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
            ep = rt.endpoint("kvcdiff.worker.generate")
            asyncio.ensure_future(ep.serve_endpoint(_never_called))
            rc = c.ModelRuntimeConfig()
            rc.total_kv_blocks, rc.max_num_seqs, rc.max_num_batched_tokens = 100000, 256, 8192
            await c.register_model(c.ModelInput.Tokens, c.ModelType.Completions, ep, "diff", "diff",
                                   worker_type=c.WorkerType.Aggregated, kv_cache_block_size=BS, runtime_config=rc,
                                   skip_model_assets=True)
            # Manual mode (no zmq_endpoint): events go in through publish_*.
            pubs.append(c.KvEventPublisher(ep, kv_block_size=BS))
            rts.append(rt)
            ids.append(ep.connection_id())
        rrt = c.DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
        rts.append(rrt)
        router = c.KvRouter(rrt.endpoint("kvcdiff.worker.generate"), BS, c.KvRouterConfig())
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if len({d["worker_id"] for d in await router.get_potential_loads([1] * BS)}) == workers:
                    break
            except Exception:  # noqa: BLE001 - discovery is asynchronous
                pass
            await asyncio.sleep(0.1)
        widx = {w: i for i, w in enumerate(ids)}

        rng = random.Random(seed)
        # Shared prefixes (system prompts) of 2-12 blocks; prompts add a
        # unique suffix, so overlaps range from none to long.
        prefixes = [[rng.randrange(1, 50000) for _ in range(BS * rng.randint(2, 12))] for _ in range(6)]
        stored: List[Dict[Tuple[int, ...], int]] = [dict() for _ in range(workers)]  # chain -> engine hash
        next_hash = [1]
        active: List[str] = []
        prefilling: List[str] = []
        trace: List[Dict[str, Any]] = []
        placed: Dict[str, Tuple[int, List[int]]] = {}

        unsettled = [0]  # events whose effect never showed within settle's timeout

        async def prefill_on(w: int, tokens: List[int]) -> int:
            for d in await router.get_potential_loads(tokens):
                if widx[d["worker_id"]] == w:
                    return int(d["potential_prefill_tokens"])
            raise RuntimeError(f"worker {w} missing from get_potential_loads")

        async def settle(w: int, tokens: List[int], before: int, timeout_s: float = 1.0) -> None:
            """Dynamo applies events asynchronously: wait until worker w's
            potential prefill for tokens moves off its value before the
            event (the overlap the event adds or removes), so the next
            decision sees it; at most timeout_s, for an event Dynamo's
            overlap for these tokens does not show. A fixed 30 ms pause was
            too short on a loaded CI host: removals still pending made
            Dynamo's overlaps longer than the events give."""
            deadline = time.monotonic() + timeout_s
            while await prefill_on(w, tokens) == before:
                if time.monotonic() > deadline:
                    unsettled[0] += 1
                    return
                await asyncio.sleep(0.005)

        def chains(tokens: List[int]) -> List[Tuple[int, ...]]:
            return [tuple(tokens[: (i + 1) * BS]) for i in range(len(tokens) // BS)]

        for n in range(ops):
            r = rng.random()
            if r < 0.55 or not active:
                rid = f"r{n}"
                pre = rng.choice(prefixes) if rng.random() < 0.85 else []
                suffix = [rng.randrange(1, 50000) for _ in range(rng.randint(1, 6 * BS))]
                tokens = pre + suffix
                loads = await router.get_potential_loads(tokens)
                wid, _dp, overlap = await router.best_worker(tokens, request_id=rid)
                w = widx[wid]
                trace.append({"op": "route", "id": rid, "tokens": tokens, "worker": w, "overlap": overlap,
                              "loads": [{"worker": widx[d["worker_id"]],
                                         "prefill_tokens": d["potential_prefill_tokens"],
                                         "decode_blocks": d["potential_decode_blocks"],
                                         "active": d["active_requests"]} for d in loads]})
                active.append(rid)
                prefilling.append(rid)
                placed[rid] = (w, tokens)
            elif r < 0.75 and prefilling:
                rid = prefilling.pop(rng.randrange(len(prefilling)))
                await router.mark_prefill_complete(rid)
                trace.append({"op": "prefill_done", "id": rid})
                # The engine stores the prompt's full blocks it did not hold.
                w, tokens = placed[rid]
                new, parent = [], None
                for ch in chains(tokens):
                    if ch in stored[w]:
                        parent = stored[w][ch]
                        continue
                    new.append(ch)
                if new:
                    first = len(chains(tokens)) - len(new)
                    toks = tokens[first * BS: (first + len(new)) * BS]
                    hashes = []
                    for ch in new:
                        stored[w][ch] = next_hash[0]
                        hashes.append(next_hash[0])
                        next_hash[0] += 1
                    upto = tokens[: (first + len(new)) * BS]
                    before = await prefill_on(w, upto)
                    pubs[w].publish_stored(toks, [BS] * len(new), hashes, parent)
                    trace.append({"op": "stored", "worker": w, "first_block": first, "id": rid, "blocks": len(new)})
                    await settle(w, upto, before)
            elif r < 0.93:
                rid = active.pop(rng.randrange(len(active)))
                if rid in prefilling:
                    prefilling.remove(rid)
                await router.free(rid)
                trace.append({"op": "free", "id": rid})
            else:
                # Eviction: the engine drops the tail block of a random chain
                # (a leaf: no stored chain extends it).
                w = rng.randrange(workers)
                leaves = [ch for ch in stored[w] if not any(len(o) > len(ch) and o[: len(ch)] == ch
                                                            for o in stored[w])]
                if leaves:
                    ch = rng.choice(leaves)
                    before = await prefill_on(w, list(ch))
                    pubs[w].publish_removed([stored[w].pop(ch)])
                    trace.append({"op": "removed", "worker": w, "tokens": list(ch)})
                    await settle(w, list(ch), before)
        return {"dynamo": "ai-dynamo-runtime " + _version(), "block_size": BS, "workers": workers, "seed": seed,
                "config": "KvRouterConfig() defaults", "unsettled_events": unsettled[0], "ops": trace}
    finally:
        # Let Dynamo's threads deliver what they still owe this loop (the
        # last loads queries) before it closes under them.
        await asyncio.sleep(0.2)
        for p in pubs:
            p.shutdown()
        for rt in rts:
            rt.shutdown()
        shutil.rmtree(disc, ignore_errors=True)


def _version() -> str:
    import importlib.metadata as md

    return md.version("ai-dynamo-runtime")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--ops", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    data = asyncio.run(record(a.workers, a.ops, a.seed))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    routes = sum(1 for o in data["ops"] if o["op"] == "route")
    print(f"dynamo_diff: {len(data['ops'])} operations, {routes} decisions -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
