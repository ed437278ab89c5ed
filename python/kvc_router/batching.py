"""Client-side batching of acquire/release calls to the balancer actor.

The balancer is one Ray actor on verl's hot path, and a Ray actor call costs
far more than routing one request (hundreds of microseconds of task
submission, scheduling and (de)serialisation against tens for the native
``acquire``). Each verl agent-loop worker runs many trajectories on one event
loop, and all of them ``await lb.acquire_server.remote(...)``. The
:class:`Batcher` coalesces the calls made by one event loop into a single
``lb.route_batch.remote(releases, acquires)`` call:

* nothing waits for a timer: a call made while fewer than ``max_inflight``
  batches are in flight is sent on the next loop iteration (together with
  whatever else that iteration queued), so an idle client pays no latency;
* while batches are in flight, new calls queue and leave together as soon as
  one returns, so under load one actor call carries many requests;
* releases (fire-and-forget in verl) ride along and are applied before the
  batch's acquires, so the next routing decision already sees them;
* prompts travel as ``array('i')`` (a byte buffer) instead of a list of
  Python ints, which the actor would otherwise unpickle int by int and then
  convert again for the native call.

Routing semantics are the actor's: the same ``acquire_server`` and
``release_server`` run there, in arrival order. A failed acquire raises the
actor's exception in its own caller only; a lost actor fails every caller of
the batch with Ray's error, as individual calls would.

With router-side admission (:mod:`kvc_router.admission`) ``route_batch``
answers a held acquire with a :class:`~kvc_router.admission.Held` ticket
instead of waiting. Its caller keeps awaiting; one poller task per batcher
asks the actor ``await_admission(tickets)`` for all of them at once (a call
that returns as soon as one is decided), while acquires and releases keep
flowing in their own batches. A caller cancelled while held sends
``cancel_admission``; a slot admitted to a caller that is gone is released.

A held request never reached a server, so when the actor restarts
(``max_restarts``) under it — the poll fails with Ray's actor error, or the
new instance answers :class:`~kvc_router.admission.StaleTicketError` — the
batcher acquires it again (up to ``RESUBMITS`` times) instead of failing its
caller. So are the acquires of a batch whose call failed because the actor
died: the dead instance's counts died with it.
"""

from __future__ import annotations

import array
import asyncio
import functools
import logging
import os
import struct
import threading
import weakref
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .admission import Held, StaleTicketError

logger = logging.getLogger("kvc_router")

#: The actor method a balancer must have for its callers to batch.
METHOD = "route_batch"

#: Set to "0" to send one actor call per acquire/release, as verl does.
ENV = "KVC_ROUTER_CLIENT_BATCHING"

#: Batches in flight per event loop and balancer. Two let the actor start the
#: next batch while the previous one's results travel back.
MAX_INFLIGHT = 2
#: Requests in one batch; more wait for the next one.
MAX_BATCH = 256
#: Prompt bytes in one batch (a single larger prompt still goes, alone).
#: Ray passes task arguments up to 100 KiB inline with the call and puts
#: larger ones in the object store, which costs more than the batching saves.
MAX_BATCH_BYTES = 64 * 1024
#: Times one acquire is sent again after the actor restarted under it.
RESUBMITS = 5


def _actor_lost(e: BaseException) -> bool:
    """Ray's error for a call to an actor that died or is restarting."""
    if isinstance(e, StaleTicketError):
        return True
    try:
        from ray.exceptions import ActorUnavailableError, RayActorError
    except ImportError:  # pragma: no cover - Ray is how a batcher exists
        return False
    return isinstance(e, (RayActorError, ActorUnavailableError))


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def supports_batching(handle: Any) -> bool:
    """True if ``handle`` is an actor handle of a balancer with ``route_batch``
    (an attribute lookup on the local handle: no actor call)."""
    if handle is None:
        return False
    try:
        return callable(getattr(handle, METHOD).remote)
    except Exception:  # noqa: BLE001 - ActorHandle raises AttributeError for unknown methods
        return False


def pack_prompt(prompt_ids: Any) -> Any:
    """A list of token ids as ``array('i')``; anything else unchanged (the
    actor validates it and raises the precise error). Unpickling a list of
    2048 ints costs the actor ~90 us; an array's bytes cost next to nothing."""
    if isinstance(prompt_ids, list):
        if prompt_ids and (type(prompt_ids[0]) is bool or type(prompt_ids[-1]) is bool):
            return prompt_ids  # the actor's check refuses bools as tokens
        try:
            # struct packs a list about twice as fast as array('i', list).
            packed = array.array("i")
            packed.frombytes(struct.pack(f"={len(prompt_ids)}i", *prompt_ids))
            return packed
        except (struct.error, TypeError, OverflowError):
            return prompt_ids
    return prompt_ids


def _payload(prompt: Any) -> int:
    if isinstance(prompt, array.array):
        return prompt.itemsize * len(prompt)
    return 8 * len(prompt) if isinstance(prompt, (list, tuple)) else 0


class Batcher:
    """Coalesces the acquire/release calls of one event loop to one balancer
    actor. Use :func:`batcher_for`; every method must run on that loop."""

    def __init__(
        self,
        handle: Any,
        loop: asyncio.AbstractEventLoop,
        max_inflight: int = MAX_INFLIGHT,
        max_batch: int = MAX_BATCH,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        if max_inflight < 1 or max_batch < 1:
            raise ValueError("max_inflight and max_batch must be >= 1")
        self._handle = handle
        self._loop = loop
        self._max_inflight = max_inflight
        self._max_batch = max_batch
        self._max_batch_bytes = max_batch_bytes
        self._acquires: List[Tuple[str, Any, asyncio.Future, int]] = []
        #: times each caller's future was sent again (actor restarts)
        self._resent: Dict[asyncio.Future, int] = {}
        #: server ids, or (server id, request id, output tokens)
        self._releases: List[Any] = []
        self._inflight = 0
        self._scheduled = False
        self._fields: Optional[List[str]] = None
        self._fields_query: Optional[asyncio.Future] = None
        #: the loop keeps only weak references to tasks: these keep collectors alive.
        self._collectors: Set[asyncio.Task] = set()
        #: held acquires (router-side admission): ticket -> caller's future
        self._held: Dict[int, asyncio.Future] = {}
        #: held acquires: ticket -> (request_id, prompt), to send again
        self._held_req: Dict[int, Tuple[str, Any]] = {}
        self._poller: Optional[asyncio.Task] = None
        self._cancels: List[int] = []
        #: batches sent, requests carried (acquires + releases): for tests and status.
        self.batches = 0
        self.carried = 0
        #: acquires the actor held, and admission polls sent
        self.held = 0
        self.polls = 0
        #: acquires sent again after the actor restarted under them
        self.resubmitted = 0

    async def acquire(self, request_id: str, prompt_ids: Any = None) -> Tuple[str, Any]:
        """``(server_id, handle)``, as ``lb.acquire_server.remote(...)`` returns."""
        if self._fields is None:
            await self._query_fields()
        prompt = pack_prompt(prompt_ids) if "prompt_ids" in (self._fields or ()) else None
        fut = self._loop.create_future()
        self._acquires.append((request_id, prompt, fut, _payload(prompt)))
        self._kick()
        return await fut

    async def _query_fields(self) -> None:
        # One query for all the callers that arrive before the answer.
        if self._fields_query is None:
            self._fields_query = asyncio.ensure_future(self._handle.require_acquire_fields.remote())
        try:
            fields = await asyncio.shield(self._fields_query)
        except Exception:
            self._fields_query = None  # let the next caller ask again
            raise
        self._fields = list(fields)

    def release(self, server_id: str, request_id: Optional[str] = None, output_tokens: Optional[int] = None) -> None:
        """Fire-and-forget, as verl's client releases. With ``request_id``
        (and the request's ``output_tokens`` when known) the balancer's
        length learner learns from it."""
        self._releases.append(server_id if request_id is None else (server_id, request_id, output_tokens))
        self._kick()

    def _kick(self) -> None:
        if not self._scheduled and self._inflight < self._max_inflight:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        while self._inflight < self._max_inflight and (self._acquires or self._releases):
            n, size = 0, 0
            for item in self._acquires[: self._max_batch]:
                if n and size + item[3] > self._max_batch_bytes:
                    break
                n, size = n + 1, size + item[3]
            batch, self._acquires = self._acquires[:n], self._acquires[n:]
            releases, self._releases = self._releases, []
            try:
                ref = getattr(self._handle, METHOD).remote(releases, [(rid, p) for rid, p, _, _ in batch])
            except Exception as e:  # noqa: BLE001 - submission failed: each caller sees why
                for _, _, fut, _ in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            self._inflight += 1
            self.batches += 1
            self.carried += len(batch) + len(releases)
            task = self._loop.create_task(self._collect(ref, batch))
            self._collectors.add(task)
            task.add_done_callback(self._collectors.discard)

    def _resubmit(self, request_id: str, prompt: Any, fut: asyncio.Future, err: BaseException) -> bool:
        """Sends an acquire that never reached a server again after the
        actor restarted under it; False (the caller gets ``err``) after
        RESUBMITS tries or when its caller is gone."""
        n = self._resent.get(fut, 0)
        if fut.done() or n >= RESUBMITS or not _actor_lost(err):
            self._resent.pop(fut, None)
            return False
        self._resent[fut] = n + 1
        self.resubmitted += 1
        logger.warning("kvc-router: balancer actor lost under acquire %r (%r); sending it again", request_id, err)
        # A restarting actor takes calls once it is back; a short pause
        # keeps a dead one from being hammered.
        self._loop.call_later(0.1 * (n + 1), self._requeue, request_id, prompt, fut)
        return True

    def _requeue(self, request_id: str, prompt: Any, fut: asyncio.Future) -> None:
        if not fut.done():
            self._acquires.append((request_id, prompt, fut, _payload(prompt)))
            self._kick()

    async def _collect(self, ref: Any, batch: Sequence[Tuple[str, Any, asyncio.Future, int]]) -> None:
        futures = [fut for _, _, fut, _ in batch]
        try:
            results = await ref
        except BaseException as e:  # noqa: BLE001 - the actor call failed: fail its callers alike
            for rid, prompt, fut, _ in batch:
                if not fut.done() and not self._resubmit(rid, prompt, fut, e):
                    fut.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            if not isinstance(e, Exception):
                raise
            return
        finally:
            self._inflight -= 1
            if self._acquires or self._releases:
                self._kick()
        if len(results) != len(futures):
            err = RuntimeError(f"kvc-router: {METHOD} answered {len(results)} results for {len(futures)} requests")
            for fut in futures:
                if not fut.done():
                    fut.set_exception(err)
            return
        for (rid, prompt, fut, _), res in zip(batch, results):
            if not isinstance(res, Held):
                self._resent.pop(fut, None)
            if isinstance(res, Held):
                self._hold(res.ticket, fut, (rid, prompt))
            elif isinstance(res, BaseException):
                if not fut.done():
                    fut.set_exception(res)
            elif fut.done():
                # The caller gave up (cancelled) after the actor counted the
                # request: release it, or the server's count leaks.
                self.release(res[0])
            else:
                fut.set_result(res)

    # -- router-side admission ---------------------------------------------

    def _hold(self, ticket: int, fut: asyncio.Future, req: Tuple[str, Any]) -> None:
        self.held += 1
        if fut.done():  # the caller gave up before the batch came back
            self._cancel(ticket)
            return
        self._held[ticket] = fut
        self._held_req[ticket] = req
        fut.add_done_callback(functools.partial(self._held_done, ticket))
        if self._poller is None or self._poller.done():
            self._poller = self._loop.create_task(self._poll())
            self._collectors.add(self._poller)
            self._poller.add_done_callback(self._collectors.discard)

    def _held_done(self, ticket: int, fut: asyncio.Future) -> None:
        # The poller pops a ticket before resolving it: one still here was
        # cancelled by its caller.
        self._held_req.pop(ticket, None)
        self._resent.pop(fut, None)
        if self._held.pop(ticket, None) is not None:
            self._cancel(ticket)

    def _cancel(self, ticket: int) -> None:
        if not self._cancels:
            self._loop.call_soon(self._send_cancels)
        self._cancels.append(ticket)

    def _send_cancels(self) -> None:
        tickets, self._cancels = self._cancels, []
        if tickets:
            try:
                self._handle.cancel_admission.remote(tickets)
            except Exception as e:  # noqa: BLE001 - the actor is gone: nothing is held any more
                logger.warning("kvc-router: cancel_admission failed: %r", e)

    async def _poll(self) -> None:
        """Awaits the held tickets' admission, all in one actor call at a time."""
        while self._held:
            tickets = list(self._held)
            self.polls += 1
            try:
                decided = await self._handle.await_admission.remote(tickets)
            except Exception as e:  # noqa: BLE001 - the actor call failed: fail the callers it held
                for t in tickets:
                    fut = self._held.pop(t, None)
                    rid, prompt = self._held_req.pop(t, ("", None))
                    if fut is not None and not fut.done() and not self._resubmit(rid, prompt, fut, e):
                        fut.set_exception(e)
                continue
            for t, res in decided:
                fut = self._held.pop(t, None)
                rid, prompt = self._held_req.pop(t, ("", None))
                if fut is not None and isinstance(res, BaseException) and self._resubmit(rid, prompt, fut, res):
                    continue  # held by an instance that is gone: acquired again
                if fut is not None:
                    self._resent.pop(fut, None)
                if fut is None or fut.done():
                    # Its caller gave up after the actor admitted it.
                    if not isinstance(res, BaseException):
                        self.release(res[0])
                elif isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)


_lock = threading.Lock()
#: (loop, actor key) -> Batcher; loops are weak so a closed loop's batchers go.
_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict] = weakref.WeakKeyDictionary()


def _actor_key(handle: Any) -> Any:
    aid = getattr(handle, "_actor_id", None)
    return aid.hex() if aid is not None and hasattr(aid, "hex") else id(handle)


def batcher_for(handle: Any) -> Optional[Batcher]:
    """This event loop's batcher for ``handle``, or None when batching does not
    apply (disabled, no running loop, or not a batching balancer)."""
    if not enabled() or not supports_batching(handle):
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    key = _actor_key(handle)
    with _lock:
        per_loop = _batchers.get(loop)
        if per_loop is None:
            per_loop = _batchers[loop] = {}
        b = per_loop.get(key)
        if b is None:
            b = per_loop[key] = Batcher(handle, loop)
        return b
