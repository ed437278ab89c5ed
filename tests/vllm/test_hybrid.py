"""A real vLLM engine serving a hybrid-attention model (one full-attention
layer, one sliding-window layer of 48 tokens; two KV-cache groups, block
32): both groups' events apply (none dropped, no batch rejected), and the
hit the router predicts for each request is the hit the engine serves."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
from vllm_lib import balancer, predicted_tokens, prompt, served, settle, wait_until


@pytest.fixture(scope="module")
def engine(reaper: Any, models: Dict[str, str]) -> Any:
    from kvc_harness import vllm_cpu

    return vllm_cpu.start_engines(reaper, [models["hybrid"]], kv_cache_bytes=64 << 20)[0]


def test_hybrid_predicts_what_the_engine_serves(engine: Any, capsys: Any) -> None:
    from kvc_harness.balancer import publisher_status

    lb = balancer([engine])
    try:
        wait_until(lambda: publisher_status(lb.get_status(), engine.sid).get("connected"), 60, "the subscription")
        base = prompt(7, 200)
        # Repeats, extensions, and prompts sharing only a prefix whose end
        # the sliding-window group dropped (the engine serves 0 of it).
        plan: List[List[int]] = [
            base,
            base,
            base + prompt(8, 70),
            base[:110] + prompt(9, 90),
            base + prompt(8, 70),
            base[:150] + prompt(10, 40),
            base[:110] + prompt(9, 90),
        ]
        rows = []
        for i, p in enumerate(plan):
            settle(lb, engine.sid)  # route once the previous request's events are applied
            d = lb.acquire_server_detail(f"h{i}", p)
            try:
                got = served(engine.complete(p, max_tokens=3).get("usage"))
            finally:
                lb.release_server(d["server"])
            rows.append((len(p), predicted_tokens(d), got))
        with capsys.disabled():
            print("\n  hybrid (full + sliding window 48), per request (prompt, predicted, served):", rows)
        assert [r[1] for r in rows] == [r[2] for r in rows], rows
        # The case that needs the window group: a shared prefix the engine does not serve.
        assert any(r[2] == 0 and r[0] > 110 for r in rows[1:]), rows
        ev = publisher_status(lb.get_status(), engine.sid)["events"]
        assert ev["decode_errors"] == 0 and not ev.get("dropped_events"), ev
        assert ev["window_blocks"] > 0 and ev["stored_blocks"] > 0, ev
    finally:
        lb.close()
