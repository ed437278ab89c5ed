#!/usr/bin/env python3
"""kvc-router demo: default (verl's balancer) vs kvc_aware, step time first.

The headline is one oversubscribed GRPO step: prompts x samples (default 128 x 8
= 1,024 sequences, 4x the 256 running slots of 4 servers x max_num_seqs 64)
submitted at once by Ray agent-loop worker actors, each sample acquiring a
server through the balancer actor, sending one non-streamed /v1/completions
with token ids and releasing it, with the long response tail of reasoning RL.
It reports step time (first submission to last completion), prefix-cache hit
rate and preemptions from the servers' /metrics, and TTFT (submission to first
token). ``--no-sat`` skips it.

Then it starts a small simulated vLLM fleet (bin/vllm-sim, KV events on, prefix caching,
a GPU KV capacity small enough that cache affinity matters), starts Ray locally,
creates the balancer exactly as verl does (``ray.remote(KVCAwareBalancer)``),
and drives a GRPO workload (prompts x samples per step, a weight update =
``POST /reset_prefix_cache`` on every server + ``reset_prefix_index()``
between steps) and a multi-turn agent workload from several Ray worker actors
that acquire a server through the balancer actor, call it over HTTP
(``/v1/completions`` with token ids, streaming) and release it. It does this
twice on cold fleets, once per policy, and prints a comparison measured from
the servers' own ``/metrics`` and client-side TTFT, and writes a plot.

With ``--servers-file FILE`` it attaches to running servers instead (one JSON
object per line: url, kv_events_endpoints, kv_events_replay_endpoints, topic;
the lines vllm-sim prints) and resets their prefix caches between the policies;
``testbed/scripts/gpu-validate.sh`` uses this with real vLLM servers.

Every process it starts (the fleet, Ray) is stopped on exit, on an error and on
Ctrl-C / SIGTERM. The run itself is kvc_harness.demo; run this with
``PYTHONPATH=testbed`` (``make demo`` does).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

try:
    from kvc_harness.demo import DemoOptions, run
except ModuleNotFoundError as e:
    if e.name != "kvc_harness":
        raise
    sys.exit("kvc_harness not found: run with PYTHONPATH=testbed (as `make demo` does)")


def parse_args(argv: Optional[List[str]] = None) -> DemoOptions:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, default=4, help="simulated servers (default 4)")
    ap.add_argument("--prompts", type=int, help="GRPO prompts per step (default 8)")
    ap.add_argument("--samples", type=int, help="GRPO samples per prompt (default 8)")
    ap.add_argument("--steps", type=int, help="GRPO rollout steps (default 3)")
    ap.add_argument("--tasks", type=int, help="agent tasks (default 4)")
    ap.add_argument("--agent-samples", type=int, help="agent trajectories per task (default 4)")
    ap.add_argument("--turns", type=int, help="agent turns per trajectory (default 4)")
    ap.add_argument("--workers", type=int, default=4, help="Ray rollout-worker actors (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a smaller, faster run (the test suite's)")
    ap.add_argument("--speed", type=float, help="vllm-sim simulated seconds per wall second (default 2, quick 4)")
    ap.add_argument(
        "--gpu-blocks",
        type=int,
        default=3072,
        help="KV blocks (16 tokens) per simulated server (default 3072 = 48k tokens)",
    )
    ap.add_argument(
        "--max-num-seqs",
        type=int,
        default=64,
        help="running-set capacity per simulated server, also given to the router (default 64)",
    )
    ap.add_argument("--no-sat", dest="sat", action="store_false", help="skip the oversubscribed GRPO step")
    ap.add_argument("--no-rollout", dest="rollout", action="store_false",
                    help="skip the rollout steps: the oversubscribed step (the README's table) alone")
    ap.add_argument("--sat-prompts", type=int, help="oversubscribed step: prompts (default 128, quick 16)")
    ap.add_argument("--sat-samples", type=int, help="oversubscribed step: samples per prompt (default 8)")
    ap.add_argument("--sat-workload", default="grpo_recur",
                    help="oversubscribed step: the arena workload whose prompt/response shape it takes (grpo_recur: "
                         "step 2 of a dataset of one step's prompts, i.e. epoch 2, lengths correlated at rho 0.6 "
                         "within a prompt and 0.8 between epochs, verl's order; grpo_rho05: one first-epoch step at "
                         "rho 0.5; grpo_sat: independent lengths)")
    ap.add_argument("--sat-max-num-seqs", type=int, help="oversubscribed step's fleet: running slots per server (64)")
    ap.add_argument("--sat-gpu-blocks", type=int, help="oversubscribed step's fleet: KV blocks per server (3072)")
    ap.add_argument("--sat-speed", type=float, help="oversubscribed step's fleet: vllm-sim --speed (default 6)")
    ap.add_argument("--sim-binary", default=DemoOptions.sim_binary)
    ap.add_argument("--servers-file", help="attach to running servers listed in FILE (JSON lines) instead")
    ap.add_argument("--out", default=DemoOptions.out, help="output directory")
    ap.add_argument("--plot", help="plot path (default OUT/demo.png)")
    ap.add_argument("--json", help="results path (default OUT/demo.json)")
    ap.add_argument("--num-cpus", type=int, default=2, help="ray.init(num_cpus=...)")
    ap.add_argument("--title", default="kvc-router demo")
    return DemoOptions(**vars(ap.parse_args(argv)))


def main(argv: Optional[List[str]] = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
