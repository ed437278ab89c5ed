"""Issue 29's admission rows on the Python path (kvc_router.admission and the
client batcher): restarts, dead clients, closing, the detail call, an empty
pool. The balancer runs on this test's event loop as Ray runs it (an async
actor's methods are coroutines on one loop); the real-Ray cases are in
testbed's chaos run (make chaos) and test_admission.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List

import pytest
from kvc_router import KVCAwareAdmissionBalancer, NoServerError
from kvc_router.admission import Held, StaleTicketError


def config(max_inflight: int = 1, **adm: Any) -> Dict[str, Any]:
    return {
        "type": "kvc_aware",
        "config": {
            "strategies": [{"name": "kvc_aware", "collector_names": []}],
            "admission": {"enabled": True, "max_inflight": max_inflight, **adm},
        },
    }


def prompt(i: int, n: int = 32) -> List[int]:
    return [1000 * (i + 1) + t for t in range(n)]


SID = "10.0.0.1:8000"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_row6_a_ticket_of_another_instance_is_stale_not_someone_elses():
    """After an actor restart the new instance must not take an old ticket
    for one of its own: before, both instances counted from 1 and the old
    client's await_admission took the new caller's admission."""

    async def main() -> None:
        old = KVCAwareAdmissionBalancer({SID: "h"}, router_config=config())
        new = KVCAwareAdmissionBalancer({SID: "h"}, router_config=config())
        try:
            await old.acquire_server("r0", prompt(0))
            (t_old,) = await old.route_batch([], [("a", prompt(1))])
            await new.acquire_server("r0", prompt(0))
            (t_new,) = await new.route_batch([], [("b", prompt(2))])
            assert isinstance(t_old, Held) and isinstance(t_new, Held)
            assert t_old.ticket != t_new.ticket
            await new.release_server(SID)  # admits the new instance's own caller
            ((t, got),) = await new.await_admission([t_old.ticket], 0.0)
            assert t == t_old.ticket and isinstance(got, StaleTicketError), got
            assert "acquire it again" in str(got)
            ((t, got),) = await new.await_admission([t_new.ticket], 0.0)
            assert got == (SID, "h"), "the new instance's caller lost its admission"
        finally:
            old.close()
            new.close()

    run(main())


def test_row5_a_dead_clients_tickets_are_given_up_after_the_claim_timeout():
    """A client that got Held tickets and died never asks for them: the held
    one is cancelled, the admitted one released, so the slots come back."""

    async def main() -> None:
        lb = KVCAwareAdmissionBalancer({SID: "h"}, router_config=config(claim_timeout_ms=300))
        try:
            await lb.acquire_server("r0", prompt(0))
            dead = await lb.route_batch([], [("d1", prompt(1)), ("d2", prompt(2))])
            assert all(isinstance(h, Held) for h in dead)
            await lb.release_server(SID)  # admits d1 to the dead client
            assert lb.get_inflight_count(SID) == 1
            end = time.monotonic() + 10
            while time.monotonic() < end and lb.get_status()["router"]["admission"]["expired_tickets"] < 2:
                await asyncio.sleep(0.05)
            adm = lb.get_status()["router"]["admission"]
            assert adm["expired_tickets"] == 2 and adm["held"] == 0 and adm["unclaimed"] == 0, adm
            assert lb.get_inflight_count(SID) == 0, "the dead client's admitted slot leaked"
            # A live client asking in time keeps its ticket past the timeout.
            (live,) = await lb.route_batch([], [("l", prompt(3))])
            assert not isinstance(live, Held)
            (held,) = await lb.route_batch([], [("l2", prompt(4))])
            for _ in range(12):
                assert await lb.await_admission([held.ticket], 0.05) == []
            await lb.release_server(SID)
            ((_, got),) = await lb.await_admission([held.ticket], 1.0)
            assert got == (SID, "h")
        finally:
            lb.close()

    run(main())


def test_row20_a_held_acquire_cancelled_in_the_turn_of_close_ends_cancelled():
    async def main() -> None:
        for close_first in (False, True):
            lb = KVCAwareAdmissionBalancer({SID: "h"}, router_config=config())
            await lb.acquire_server("r0", prompt(0))
            t = asyncio.ensure_future(lb.acquire_server("r1", prompt(1)))
            await asyncio.sleep(0.01)
            if close_first:
                lb.close()
                t.cancel()
            else:
                t.cancel()
                lb.close()
            with pytest.raises(asyncio.CancelledError):
                await t

    run(main())


def test_row10_acquire_server_detail_goes_through_admission():
    async def main() -> None:
        lb = KVCAwareAdmissionBalancer({SID: "h"}, router_config=config())
        try:
            d = await lb.acquire_server_detail("r0", prompt(0))
            assert d["server"] == SID and d["reason"] == "scored" and "hit_blocks" in d
            waiting = asyncio.ensure_future(lb.acquire_server_detail("r1", prompt(1)))
            await asyncio.sleep(0.05)
            assert not waiting.done(), "acquire_server_detail routed past the cap"
            assert lb.get_inflight_count(SID) == 1
            await lb.release_server(SID)
            d = await asyncio.wait_for(waiting, 10)
            assert d == {"server": SID, "reason": "admitted", "held": True}
            assert lb.get_inflight_count(SID) == 1
        finally:
            lb.close()

    run(main())


def test_row8_held_acquires_fail_when_the_pool_stays_empty():
    async def main() -> None:
        lb = KVCAwareAdmissionBalancer({SID: "h"}, router_config=config(empty_pool_ms=200))
        try:
            await lb.acquire_server("r0", prompt(0))
            waiting = asyncio.ensure_future(lb.acquire_server("r1", prompt(1)))
            await asyncio.sleep(0.05)
            lb.remove_servers([SID])
            with pytest.raises(NoServerError, match="admission.empty_pool_ms"):
                await asyncio.wait_for(waiting, 10)
            assert lb.get_status()["router"]["admission"]["failed_total"] == 1
        finally:
            lb.close()

    run(main())
