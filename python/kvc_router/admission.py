"""``KVCAwareAdmissionBalancer``: the balancer with router-side admission.

With ``router.config.admission.enabled`` (kvc_aware mode), the router holds a
request while every server already has its cap in flight, and gives each
slot a release frees to the held request that fits that server best
(core/router/admission.go). A held ``acquire_server`` must wait without
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

Every future is created, resolved and claimed on the actor's event loop, so
no lock is needed; a ticket has exactly one owner (the waiting call, or the
client through ``await_admission``) and a slot admitted to a ticket whose
owner is gone is released at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from . import _native
from .balancer import _ACQUIRE_ATTEMPTS, _MISSING, KVCAwareBalancer, _pool_kept_changing
from .errors import NoServerError

logger = logging.getLogger("kvc_router")

#: Seconds between two pumps while requests are held.
PUMP_INTERVAL_S = 0.05
#: Longest single ``await_admission`` wait (the client asks again, with the
#: tickets it got meanwhile).
AWAIT_TIMEOUT_S = 0.25


@dataclass(frozen=True)
class Held:
    """``route_batch``'s entry for an acquire the router holds: await it with
    ``await_admission([ticket])``."""

    ticket: int


class KVCAwareAdmissionBalancer(KVCAwareBalancer):
    """:class:`~kvc_router.KVCAwareBalancer` with router-side admission; the
    same constructor and methods, ``acquire_server``, ``release_server`` and
    ``route_batch`` as coroutines (Ray runs it as an async actor). Use it
    when the configuration sets ``admission: {enabled: true}``; kvc_router's
    verl integration picks it by itself."""

    _ADMISSION = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before the base constructor: it starts the metrics thread, which
        # may call get_status() at once.
        self._tickets = itertools.count(1)
        #: ticket -> its future, from hold until its owner claims the result
        self._pending: Dict[int, asyncio.Future] = {}
        #: tickets held in the router (not admitted, not cancelled)
        self._waiting: Set[int] = set()
        self._pumper: Optional[asyncio.Task] = None
        self._adm = {"held_calls": 0, "released_unclaimed": 0, "pumps": 0}
        super().__init__(*args, **kwargs)

    # -- verl's interface --------------------------------------------------

    async def acquire_server(self, request_id: str, prompt_ids: Any = None) -> Tuple[str, Any]:  # type: ignore[override]
        """``(server_id, handle)``, awaiting admission if the router holds the
        request. Raises :class:`~kvc_router.errors.AdmissionQueueFullError`
        when ``admission.max_queue`` requests are already held."""
        got = self._submit(request_id, prompt_ids)
        if not isinstance(got, Held):
            return got
        self._adm["held_calls"] += 1
        fut = self._pending[got.ticket]
        try:
            await fut
        except asyncio.CancelledError:
            self._give_up(got.ticket, fut)
            raise
        self._pending.pop(got.ticket, None)
        return fut.result()

    async def release_server(self, server_id: str, request_id: Optional[str] = None, **kwargs: Any) -> None:  # type: ignore[override]
        """Counts one request finished and admits held requests into its room."""
        self._release(server_id)

    async def route_batch(self, releases: Sequence[str], acquires: Sequence[Tuple[str, Any]]) -> List[Any]:  # type: ignore[override]
        """The releases, then the acquires, without waiting: one entry per
        acquire, ``(server_id, handle)``, the exception it raised, or
        :class:`Held` (await it with :meth:`await_admission`)."""
        return self._route_batch(releases, acquires, self._release, self._submit)

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
        for t in tickets:
            fut = self._pending.get(t)
            if fut is None:
                out.append((t, KeyError(f"kvc-router: admission ticket {t} is not held by this balancer")))
            else:
                futs.append(fut)
        if futs and not out and not any(f.done() for f in futs):
            await asyncio.wait(futs, timeout=max(0.0, min(float(timeout_s), 60.0)), return_when=asyncio.FIRST_COMPLETED)
        for t in tickets:
            fut = self._pending.get(t)
            if fut is None or not fut.done() or fut.cancelled():
                continue
            del self._pending[t]
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

    def get_status(self) -> Dict[str, Any]:
        """:meth:`KVCAwareBalancer.get_status`; ``router.admission`` adds
        the callers waiting here to the library's admission counters."""
        st = super().get_status()
        adm = st["router"].setdefault("admission", {})
        adm["waiting_callers"] = len(self._waiting)
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
        super().close()

    # -- internals -----------------------------------------------------------

    def _submit(self, request_id: str, prompt_ids: Any) -> Any:
        """``(server_id, handle)`` or :class:`Held`; on the event loop."""
        rid = _native._utf8(request_id, "request_id")
        keep, addr, n = _native.pack_tokens(prompt_ids, self._max_tokens)
        for _ in range(_ACQUIRE_ATTEMPTS):
            pool, handles, known = self._view
            pin = self._pin(request_id, pool)
            ticket = next(self._tickets)
            got = self._router.submit(rid, addr, n, pin, known, ticket)
            if got is None:
                del keep
                return self._hold(ticket)
            idx, _, sid = got
            sid, handle = self._handle_for(pool, handles, idx, sid)
            if handle is not _MISSING:
                del keep
                return sid, handle
        del keep
        raise _pool_kept_changing()

    def _hold(self, ticket: int) -> Held:
        loop = asyncio.get_running_loop()
        self._pending[ticket] = loop.create_future()
        self._waiting.add(ticket)
        if self._pumper is None or self._pumper.done():
            self._pumper = loop.create_task(self._pump_while_held())
        return Held(ticket)

    def _release(self, server_id: Any) -> None:
        sid = _native.lookup_id(server_id)
        if sid is None:
            self._ignored_ids += 1  # not a str: no server has it (as release_server)
            return
        _, admitted = self._router.release_admit(sid)
        if admitted:
            self._resolve(admitted)

    def _resolve(self, admitted: List[Dict[str, Any]]) -> None:
        """Hands each admitted request to its waiting owner, or releases it
        when the owner is gone."""
        for a in admitted:
            t, sid = a["ticket"], a["server"]
            self._waiting.discard(t)
            fut = self._pending.get(t)
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

    def _give_up(self, ticket: int, fut: asyncio.Future) -> None:
        """Ticket's owner is gone (cancelled): leave the queue, or release the
        slot it was admitted to."""
        self._pending.pop(ticket, None)
        self._waiting.discard(ticket)
        if self._router.cancel(ticket):
            if not fut.done():
                fut.cancel()
            return
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self._adm["released_unclaimed"] += 1
            self._release(fut.result()[0])
        # Else it is admitted but not resolved yet: _resolve finds no owner
        # and releases it.

    async def _pump_while_held(self) -> None:
        try:
            while self._waiting and not self._router.closed:
                await asyncio.sleep(PUMP_INTERVAL_S)
                if self._router.closed:
                    return
                self._adm["pumps"] += 1
                admitted = self._router.pump()
                if admitted:
                    self._resolve(admitted)
        except Exception:  # noqa: BLE001 - never let the pump die silently
            logger.exception("[KVCAwareAdmissionBalancer] pump failed")
            raise


__all__ = ["KVCAwareAdmissionBalancer", "Held", "PUMP_INTERVAL_S", "AWAIT_TIMEOUT_S"]
