"""The soak: acquire/release pairs through the balancer Ray actor from several
client actors, while two vllm-sim servers stream KV events (real
completions) and are scraped for metrics. Behind tests/test_soak.py
(scaled down, in `make test`) and testbed/scripts/soak.py (1M pairs, `make soak`).

Reports: pairs done, throughput, in-flight count and router counters at the
end (nothing lost), balancer-actor RSS and goroutine count after warm-up and
at the end.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from typing import Any, Callable, Dict

from kvc_harness.balancer import kvc_config, publisher_status, server_status
from kvc_harness.fleet import Sim
from kvc_harness.procs import Reaper, rss_bytes, wait_for
from kvc_harness.workloads import seeded_prompt


def run_soak(
    ray: Any, pairs: int, clients: int = 4, warmup_frac: float = 0.1, log: Callable[[str], Any] = print
) -> Dict[str, Any]:
    """Runs the soak on a Ray cluster started with procs.start_ray (its
    workers import kvc_harness); returns the figures check_soak judges."""
    from kvc_router import KVCAwareBalancer

    reaper = Reaper()
    try:
        sims = [Sim(reaper).start() for _ in range(2)]
        cfg = kvc_config(
            endpoints={s.id: s.endpoints_config() for s in sims}, interval_ms=50, timeout_ms=500, log_level="warn"
        )
        lb = ray.remote(KVCAwareBalancer).remote(servers={s.id: None for s in sims}, router_config=cfg)
        reaper.add(lambda: ray.kill(lb))
        pid = ray.get(lb.__ray_call__.remote(lambda self: os.getpid()))

        def ready():
            st = ray.get(lb.get_status.remote())
            return all(
                server_status(st, s.id)["load"]["has_metrics"] and publisher_status(st, s.id).get("connected")
                for s in sims
            )

        wait_for(ready, 60, "collectors live", interval=0.1)

        # Events keep streaming: real completions on both servers.
        stop = threading.Event()
        done_completions = [0]

        def stream():
            i = 0
            while not stop.is_set():
                try:
                    sims[i % 2].complete(seeded_prompt(10_000 + i % 5000), max_tokens=2)
                    done_completions[0] += 1
                except (OSError, RuntimeError, http.client.HTTPException):
                    time.sleep(0.05)
                i += 1
                time.sleep(0.002)

        streamer = threading.Thread(target=stream, daemon=True)
        streamer.start()
        reaper.add(lambda: (stop.set(), streamer.join(timeout=10)))

        @ray.remote(num_cpus=0)
        class Client:
            def __init__(self, lb, cid):
                self.lb, self.cid = lb, cid
                self.prompts = [seeded_prompt(cid * 1000 + k, 128) for k in range(16)]

            def run(self, n: int, offset: int, window: int = 16) -> Dict[str, Any]:
                """n acquire/release pairs, up to `window` in flight at once."""
                import ray as r

                errors = 0
                for lo in range(offset, offset + n, window):
                    ids = range(lo, min(lo + window, offset + n))
                    try:
                        got = r.get(
                            [
                                self.lb.acquire_server.remote(f"c{self.cid}-{i % 2000}", self.prompts[i % 16])
                                for i in ids
                            ]
                        )
                        r.get([self.lb.release_server.remote(sid) for sid, _ in got])
                    except Exception:  # noqa: BLE001 - counted, reported, asserted on
                        errors += 1
                return {"pairs": n, "errors": errors}

        cs = [Client.remote(lb, c) for c in range(clients)]
        reaper.add(lambda: [ray.kill(c) for c in cs])
        per = pairs // clients
        warm = max(1, int(per * warmup_frac))

        def steady_goroutines() -> int:
            # Scrapes, re-dials and replays come and go: the floor of a few
            # samples is the steady count.
            gs = []
            for _ in range(20):
                gs.append(ray.get(lb.get_status.remote())["router"]["goroutines"])
                time.sleep(0.1)
            return min(gs)

        t0 = time.monotonic()
        res = ray.get([c.run.remote(warm, 0) for c in cs])
        warm_rss, warm_g = rss_bytes(pid), steady_goroutines()
        log(f"warm-up: {warm * clients} pairs, actor RSS {warm_rss / 2**20:.1f} MiB, goroutines {warm_g}")

        t1 = time.monotonic()
        res += ray.get([c.run.remote(per - warm, warm) for c in cs], timeout=24 * 3600)
        t2 = time.monotonic()
        # Measured in the same state as after warm-up: events still streaming.
        end_rss, end_g = rss_bytes(pid), steady_goroutines()
        stop.set()
        streamer.join(timeout=10)
        time.sleep(0.5)  # let the last events land
        st = ray.get(lb.get_status.remote())
        c = st["router"]["counters"]
        out = {
            "pairs": sum(r["pairs"] for r in res),
            "errors": sum(r["errors"] for r in res),
            "clients": clients,
            "seconds": t2 - t0,
            "pairs_per_s": (per - warm) * clients / max(t2 - t1, 1e-9),
            "total_inflight": ray.get(lb.get_total_inflight.remote()),
            "acquires": c["acquires"],
            "releases": c["releases"],
            "completions": done_completions[0],
            "events_batches": sum(publisher_status(st, s.id)["events"]["batches"] for s in sims),
            "scrapes": sum(server_status(st, s.id)["load"]["scrapes"] for s in sims),
            "rss_warm": warm_rss,
            "rss_end": end_rss,
            "rss_growth": (end_rss - warm_rss) / warm_rss,
            "goroutines_warm": warm_g,
            "goroutines_end": end_g,
            "index_entries": st["router"]["index"]["entries"],
        }
        log(
            f"soak: {out['pairs']} pairs from {clients} client actors in {out['seconds']:.1f}s "
            f"({out['pairs_per_s']:.0f} pairs/s), errors {out['errors']}; in flight at end {out['total_inflight']}; "
            f"acquires {out['acquires']} releases {out['releases']}; {out['completions']} completions streamed "
            f"{out['events_batches']} event batches, {out['scrapes']} scrapes; actor RSS {warm_rss / 2**20:.1f} -> "
            f"{end_rss / 2**20:.1f} MiB ({out['rss_growth'] * 100:+.2f}%); goroutines {warm_g} -> {end_g}"
        )
        return out
    finally:
        reaper.close()


def check_soak(out: Dict[str, Any], rss_slack: float = 0.05) -> None:
    """Nothing lost, nothing leaked: AssertionError (with the figures) otherwise."""
    assert out["errors"] == 0, out
    assert out["total_inflight"] == 0, out
    assert out["acquires"] == out["releases"] == out["pairs"], out
    assert out["events_batches"] > 0 and out["scrapes"] > 0, out
    assert out["rss_growth"] < rss_slack, out
    assert out["goroutines_end"] <= out["goroutines_warm"] + 4, out
