"""The benchmarks' ``verl_default`` against verl's own GlobalRequestLoadBalancer.

A seeded script of acquires (new request ids, and returning ones: sticky
turns) and releases is run through verl's class from the installed release
with ``random.seed(SEED)``, and through the arena's re-implementation
(kvc_harness.verl_default.VerlDefault, seeded alike): every decision must be
equal. verl's decisions are also the committed trace that kvbench's Go
replay is checked against (testbed/peers/testdata/verl_default_trace_<v>.json,
TestVerlDefaultReplaysVerlTrace): the trace must be exactly what this verl
produces. verl 0.9.1 breaks least-loaded ties at random (PR #7613); 0.9.0
and 0.8.0 take the first tied server.
"""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "testbed"))

from kvc_harness.verl_default import VerlDefault  # noqa: E402

SEED = 20261202
SERVERS = 4
TRACE_DIR = os.path.join(REPO, "testbed", "peers", "testdata")


def _script(n_ops: int = 600, seed: int = 7):
    """Acquires and releases in the shape of a rollout: bursts of new ids,
    some returning (sticky) ids, releases of servers with requests in flight.
    Only the op kinds and ids are fixed here; servers come from the balancer."""
    rng = random.Random(seed)
    ops = []
    issued = []
    for i in range(n_ops):
        r = rng.random()
        if r < 0.55 or not issued:
            rid = f"r{i}"
            issued.append(rid)
            ops.append(("acquire", rid))
        elif r < 0.65:
            ops.append(("acquire", rng.choice(issued)))
        else:
            ops.append(("release", None))
    return ops


def _run(acquire, release, ops, pick_release):
    out = []
    held = []
    for op, rid in ops:
        if op == "acquire":
            sid = acquire(rid)
            held.append(sid)
            out.append({"op": "acquire", "id": rid, "server": sid})
        elif held:
            sid = held.pop(pick_release.randrange(len(held)))
            release(sid)
            out.append({"op": "release", "id": "", "server": sid})
    return out


def _verl_trace(seed: int = SEED):
    from verl.workers.rollout import llm_server

    servers = {f"s{i}": None for i in range(SERVERS)}
    random.seed(seed)
    cls = llm_server.GlobalRequestLoadBalancer
    # verl 0.8.0 decorates it with @ray.remote; its decisions are the plain
    # class's, which Ray keeps as __ray_actor_class__.
    cls = getattr(cls, "__ray_actor_class__", cls)
    lb = cls(servers=servers)
    return _run(lambda rid: lb.acquire_server(request_id=rid)[0], lambda sid: lb.release_server(server_id=sid),
                _script(), random.Random(3))


def _tie_mode(version: str) -> bool:
    """True when this verl sends ties to the first server."""
    major_minor_patch = tuple(int(x) for x in version.split(".")[:3])
    return major_minor_patch < (0, 9, 1)


def test_harness_verl_default_equals_verl(expected_verl):
    want = _verl_trace()
    mine = VerlDefault([f"s{i}" for i in range(SERVERS)], seed=SEED, first_tie=_tie_mode(expected_verl))
    got = _run(lambda rid: mine.acquire_server(rid)[0], mine.release_server, _script(), random.Random(3))
    assert len(got) == len(want) > 300
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"op {i}: harness {g}, verl {expected_verl} {w}"
    # The script exercises ties: at least a third of acquires had a choice.
    firsts = sum(1 for w in want if w["op"] == "acquire" and w["server"] == "s0")
    assert firsts < len([w for w in want if w["op"] == "acquire"])


@pytest.mark.parametrize("other_seed", [1, 2])
def test_verl_091_ties_are_random(expected_verl, other_seed):
    """Another seed changes verl 0.9.1's decisions (and only 0.9.1's)."""
    a, b = _verl_trace(), _verl_trace(other_seed)
    if _tie_mode(expected_verl):
        assert a == b
    else:
        assert a != b


def test_committed_trace_is_verls(expected_verl):
    """kvbench's Go replay reads this trace; it must be verl's own output.
    KVC_WRITE_VERL_TRACE=1 rewrites it from the installed verl."""
    if expected_verl not in ("0.9.1", "0.9.0"):
        pytest.skip(f"no committed trace for verl {expected_verl}")
    doc = {"verl": expected_verl, "seed": SEED, "servers": SERVERS, "ops": _verl_trace()}
    path = os.path.join(TRACE_DIR, f"verl_default_trace_{expected_verl}.json")
    if os.environ.get("KVC_WRITE_VERL_TRACE") == "1":
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=0)
            f.write("\n")
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == doc, (f"{path} is not what verl {expected_verl} decides; "
                                     "rewrite it with KVC_WRITE_VERL_TRACE=1")
