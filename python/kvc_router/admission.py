"""``KVCAwareAdmissionBalancer``: the balancer with router-side admission.

With router-side admission on (``router.config.admission.enabled``, whose
default ``auto`` is on in this class; kvc_aware mode), the router holds a
request while every server already has its cap in flight, and gives each
slot a release frees to the held request that fits that server best
(core/internal/router/admission.go). A held ``acquire_server`` must wait without
blocking the actor: the releases that will free its slot arrive as later
calls to the same actor. So this balancer is an *async* Ray actor (its
methods are coroutines on the actor's event loop):

* ``acquire_server`` submits the request; if it is held, the call awaits its
  admission (a release, a batched release or the periodic pump admits it)
  and returns ``(server_id, handle)`` exactly as an unheld acquire does. A
  caller cancelled while held gives its place up; if it was admitted in the
  meantime its slot is released.
* ``route_batch`` (client batching, :mod:`kvc_router.batching`) never waits:
  each acquire's entry is its ``(server_id, handle)``, its exception, or a
  :class:`Held` marker with a ticket; the client then awaits those tickets
  with ``await_admission`` (one call for many tickets) while its releases
  keep flowing in later batches, and gives up a ticket with
  ``cancel_admission``.
* while anything is held a task pumps every ``PUMP_INTERVAL_S`` seconds, so
  room that appears without a release (a server added, a cap raised by
  fresh metrics) is used.

A ticket carries this instance's random generation in its high bits, so a
ticket from before an actor restart (``max_restarts``) never names another
caller's request: it is answered with :class:`StaleTicketError` and the
client acquires again. A ticket whose owner neither claims it nor asks for
it for ``admission.claim_timeout_ms`` (a dead client) is cancelled while
held and released once admitted, so a dead client cannot keep slots.

Every future is created, resolved and claimed on the actor's event loop, so
no lock is needed; a ticket has exactly one owner (the waiting call, or the
client through ``await_admission``) and a slot admitted to a ticket whose
owner is gone is released at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from . import _native
from .balancer import _ACQUIRE_ATTEMPTS, _MISSING, KVCAwareBalancer, _pool_kept_changing
from .errors import KVR_NO_SERVERS, NoServerError, error_for

logger = logging.getLogger("kvc_router")

#: Seconds between two pumps while requests are held.
PUMP_INTERVAL_S = 0.05
#: Longest single ``await_admission`` wait (the client asks again, with the
#: tickets it got meanwhile).
AWAIT_TIMEOUT_S = 0.25


class StaleTicketError(KeyError):
    """An admission ticket this balancer instance never issued: the actor
    restarted since (its held requests are gone), or the ticket is foreign.
    The request never reached a server; acquire it again."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "stale admission ticket"


#: Bits of a ticket below the instance generation.
_TICKET_BITS = 32


@dataclass(frozen=True)
class Held:
    """``route_batch``'s entry for an acquire the router holds: await it with
    ``await_admission([ticket])``."""

    ticket: int


class KVCAwareAdmissionBalancer(KVCAwareBalancer):
    """:class:`~kvc_router.KVCAwareBalancer` with router-side admission; the
    same constructor and methods, ``acquire_server``, ``release_server`` and
    ``route_batch`` as coroutines (Ray runs it as an async actor). Here
    ``admission.enabled``'s default, ``auto``, is on (kvc_aware mode);
    kvc_router's verl integration creates it for kvc_aware by itself."""

    _ADMISSION = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before the base constructor: it starts the metrics thread, which
        # may call get_status() at once.
        #: random per instance, in every ticket's high bits: a restarted
        #: actor never takes an old ticket for one of its own
        self._generation = secrets.randbits(30) + 1
        self._tickets = itertools.count((self._generation << _TICKET_BITS) + 1)
        #: ticket -> its future, from hold until its owner claims the result
        self._pending: Dict[int, asyncio.Future] = {}
        #: batched tickets -> when their owner last asked (the lease)
        self._touched: Dict[int, float] = {}
        #: tickets held in the router (not admitted, not cancelled)
        self._waiting: Set[int] = set()
        self._pumper: Optional[asyncio.Task] = None
        self._adm = {"held_calls": 0, "released_unclaimed": 0, "pumps": 0, "expired_tickets": 0, "stale_tickets": 0}
        super().__init__(*args, **kwargs)
        self._claim_timeout_s = self._config.admission_claim_timeout_s

    # -- verl's interface --------------------------------------------------

    async def acquire_server(self, request_id: str, prompt_ids: Any = None) -> Tuple[str, Any]:  # type: ignore[override]
        """``(server_id, handle)``, awaiting admission if the router holds the
        request. Raises :class:`~kvc_router.errors.AdmissionQueueFullError`
        when ``admission.max_queue`` requests are already held."""
        got = self._submit(request_id, prompt_ids)
        if not isinstance(got, Held):
            return got
        return await self._await_held(got)

    async def _await_held(self, got: Held) -> Tuple[str, Any]:
        self._adm["held_calls"] += 1
        fut = self._pending[got.ticket]
        try:
            await fut
        except asyncio.CancelledError:
            self._give_up(got.ticket, fut)
            raise
        self._pending.pop(got.ticket, None)
        return fut.result()

    async def release_server(  # type: ignore[override]
        self, server_id: str, request_id: Optional[str] = None, output_tokens: Any = None, **kwargs: Any
    ) -> None:
        """Counts one request finished and admits held requests into its room
        (``request_id`` and ``output_tokens`` as the base class's)."""
        self._release(server_id, request_id, output_tokens)

    async def route_batch(self, releases: Sequence[Any], acquires: Sequence[Tuple[str, Any]]) -> List[Any]:  # type: ignore[override]
        """The releases, then the acquires, without waiting: one entry per
        acquire, ``(server_id, handle)``, the exception it raised, or
        :class:`Held` (await it with :meth:`await_admission`)."""
        out = self._route_batch(releases, acquires, self._release, self._submit)
        now = time.monotonic()
        for res in out:
            if isinstance(res, Held):
                self._touched[res.ticket] = now
        return out

    async def await_admission(
        self, tickets: Sequence[int], timeout_s: float = AWAIT_TIMEOUT_S
    ) -> List[Tuple[int, Any]]:
        """Waits until at least one of ``tickets`` is decided, or
        ``timeout_s``; returns ``[(ticket, (server_id, handle) or
        exception)]`` for each decided one, which the caller now owns (it
        must release what it does not use). An unknown ticket is answered
        with a ``KeyError`` at once."""
        out: List[Tuple[int, Any]] = []
        futs = []
        now = time.monotonic()
        for t in tickets:
            fut = self._pending.get(t)
            if fut is None:
                out.append((t, self._unknown_ticket(t)))
            else:
                futs.append(fut)
                if t in self._touched:
                    self._touched[t] = now
        if futs and not out and not any(f.done() for f in futs):
            await asyncio.wait(futs, timeout=max(0.0, min(float(timeout_s), 60.0)), return_when=asyncio.FIRST_COMPLETED)
        for t in tickets:
            fut = self._pending.get(t)
            if fut is None or not fut.done() or fut.cancelled():
                continue
            del self._pending[t]
            self._touched.pop(t, None)
            exc = fut.exception()
            out.append((t, exc if exc is not None else fut.result()))
        return out

    async def cancel_admission(self, tickets: Sequence[int]) -> int:
        """The client's callers of ``tickets`` gave up: each held one leaves
        the queue, each already admitted one is released. Returns how many
        were still known."""
        n = 0
        for t in tickets:
            fut = self._pending.pop(t, None)
            if fut is not None:
                n += 1
                self._give_up(t, fut)
        return n

    async def acquire_server_detail(self, request_id: str, prompt_ids: Any = None) -> Dict[str, Any]:  # type: ignore[override]
        """:meth:`acquire_server` through admission (held while the pool is
        full, as every acquire is), returning the decision's details: the
        routed decision, or for a held request ``{"server", "reason":
        "admitted", "held": True}``."""
        got = self._submit(request_id, prompt_ids, detail=True)
        if not isinstance(got, Held):
            return got
        sid, _ = await self._await_held(got)
        return {"server": sid, "reason": "admitted", "held": True}

    def get_status(self) -> Dict[str, Any]:
        """:meth:`KVCAwareBalancer.get_status`; ``router.admission`` adds
        the callers waiting here to the library's admission counters."""
        st = super().get_status()
        adm = st["router"].setdefault("admission", {})
        adm["waiting_callers"] = len(self._waiting)
        adm["ticket_generation"] = self._generation
        adm["unclaimed"] = len(self._pending) - len(self._waiting)
        adm.update(self._adm)
        return st

    def close(self) -> None:
        if self._pumper is not None:
            self._pumper.cancel()
            self._pumper = None
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(NoServerError("the balancer was closed while the request was held"))
        self._waiting.clear()
        self._touched.clear()
        super().close()

    # -- internals -----------------------------------------------------------

    def _submit(self, request_id: str, prompt_ids: Any, detail: bool = False) -> Any:
        """``(server_id, handle)`` (``detail``: the decision's dict) or
        :class:`Held`; on the event loop."""
        rid = _native._utf8(request_id, "request_id")
        keep, addr, n = _native.pack_tokens(prompt_ids, self._max_tokens)
        if self._waiting:
            # Room that appeared without a release (a server added, a cap
            # raised, a reconciled slot) goes to the held requests first;
            # the library enforces that order, this hands them theirs now.
            admitted = self._router.pump()
            if admitted:
                self._resolve(admitted)
        for _ in range(_ACQUIRE_ATTEMPTS):
            pool, handles, known = self._view
            pin = self._pin(request_id, pool)
            ticket = next(self._tickets)
            got = self._router.submit(rid, addr, n, pin, known, ticket, detail=detail)
            if got is None:
                del keep
                return self._hold(ticket)
            idx, _, sid = got[:3]
            sid, handle = self._handle_for(pool, handles, idx, sid)
            if handle is not _MISSING:
                del keep
                return got[3] if detail else (sid, handle)
        del keep
        raise _pool_kept_changing()

    def _hold(self, ticket: int) -> Held:
        loop = asyncio.get_running_loop()
        self._pending[ticket] = loop.create_future()
        self._waiting.add(ticket)
        if self._pumper is None or self._pumper.done():
            self._pumper = loop.create_task(self._pump_while_held())
        return Held(ticket)

    def _release(self, server_id: Any, request_id: Any = None, output_tokens: Any = None) -> None:
        sid = _native.lookup_id(server_id)
        if sid is None:
            self._ignored_ids += 1  # not a str: no server has it (as release_server)
            return
        done = self._done_args(request_id, output_tokens)
        _, admitted = self._router.release_admit(sid) if done is None else self._router.release_done(sid, *done)
        if admitted:
            self._resolve(admitted)

    def _resolve(self, admitted: List[Dict[str, Any]]) -> None:
        """Hands each admitted request to its waiting owner, or releases it
        when the owner is gone."""
        for a in admitted:
            t, sid = a["ticket"], a.get("server", "")
            self._waiting.discard(t)
            fut = self._pending.get(t)
            if "error" in a:
                # Failed while held (the pool stayed empty): its owner gets
                # the library's error; nothing was counted in flight.
                self._pending.pop(t, None)
                if fut is not None and not fut.done():
                    fut.set_exception(error_for(a.get("code", KVR_NO_SERVERS), a["error"]))
                continue
            if fut is None or fut.done():
                # Cancelled while the router admitted it: nobody will
                # release this slot but us.
                self._pending.pop(t, None)
                self._adm["released_unclaimed"] += 1
                self._release(sid)
                continue
            handle = self._handles.get(sid, _MISSING)
            if handle is _MISSING:
                # Removed after the library admitted onto it (its count went
                # with it): the caller sees the pool change as an error.
                fut.set_exception(NoServerError(f"server {sid!r} was removed while admitting a held request"))
            else:
                fut.set_result((sid, handle))

    def _unknown_ticket(self, t: Any) -> KeyError:
        if isinstance(t, int) and t >> _TICKET_BITS != self._generation:
            self._adm["stale_tickets"] += 1
            return StaleTicketError(
                f"kvc-router: admission ticket {t} was not issued by this balancer instance (the actor "
                "restarted, or the ticket is foreign); its request never reached a server: acquire it again"
            )
        return KeyError(f"kvc-router: admission ticket {t} is not held by this balancer")

    def _give_up(self, ticket: int, fut: asyncio.Future) -> None:
        """Ticket's owner is gone (cancelled): leave the queue, or release the
        slot it was admitted to."""
        self._pending.pop(ticket, None)
        self._waiting.discard(ticket)
        self._touched.pop(ticket, None)
        if self._router.closed:
            # close() already failed every held future; nothing is counted.
            if not fut.done():
                fut.cancel()
            return
        if self._router.cancel(ticket):
            if not fut.done():
                fut.cancel()
            return
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self._adm["released_unclaimed"] += 1
            self._release(fut.result()[0])
        # Else it is admitted but not resolved yet: _resolve finds no owner
        # and releases it.

    def _expire(self, now: float) -> None:
        """Gives up the batched tickets whose owner has not asked for them
        for the claim timeout (a dead client): cancelled while held,
        released once admitted."""
        limit = now - self._claim_timeout_s
        for t in [t for t, seen in self._touched.items() if seen < limit]:
            fut = self._pending.pop(t, None)
            self._touched.pop(t, None)
            if fut is not None:
                self._adm["expired_tickets"] += 1
                self._give_up(t, fut)

    async def _pump_while_held(self) -> None:
        try:
            while (self._waiting or self._touched) and not self._router.closed:
                await asyncio.sleep(PUMP_INTERVAL_S)
                if self._router.closed:
                    return
                if self._touched:
                    self._expire(time.monotonic())
                if not self._waiting:
                    continue
                self._adm["pumps"] += 1
                admitted = self._router.pump()
                if admitted:
                    self._resolve(admitted)
        except Exception:  # noqa: BLE001 - never let the pump die silently
            logger.exception("[KVCAwareAdmissionBalancer] pump failed")
            raise


__all__ = ["KVCAwareAdmissionBalancer", "Held", "StaleTicketError", "PUMP_INTERVAL_S", "AWAIT_TIMEOUT_S"]
