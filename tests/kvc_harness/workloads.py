"""Seeded workloads: GRPO rollout steps (prompts x samples sharing a prompt),
multi-turn agent trajectories (a shared system prompt, growing turn by turn),
and the synthetic prompts of the soak, fault tests and balancer benchmarks.
Every draw comes from a seed, so two policies see the same requests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import List, Sequence

# Token ids stay inside every common vocabulary (Llama-2's is 32000) and above
# the low special-token range.
TOKEN_LO, TOKEN_HI = 100, 30000


@dataclass
class WorkloadSpec:
    """Sizes of the two workloads; every draw comes from ``seed``."""

    seed: int = 0
    # GRPO: `prompts` prompts x `samples` samples per rollout step, `steps`
    # steps with a weight update (prefix-cache reset) between them.
    steps: int = 3
    prompts: int = 8
    samples: int = 8
    prompt_tokens: Sequence[int] = (1024, 3072)  # uniform range
    response_median: int = 96  # log-normal, long-tailed
    response_sigma: float = 0.8
    response_max: int = 512
    # Agent: `tasks` tasks x `agent_samples` trajectories, `turns` turns each,
    # run as one more rollout step after the GRPO steps.
    tasks: int = 4
    agent_samples: int = 4
    turns: int = 4
    system_tokens: int = 1024  # tool descriptions shared by every trajectory
    task_tokens: Sequence[int] = (256, 768)
    turn_response_median: int = 48
    turn_response_max: int = 192
    tool_tokens: Sequence[int] = (64, 384)

    def describe(self) -> str:
        lo, hi = self.prompt_tokens
        return (
            f"grpo: {self.steps} steps x {self.prompts} prompts x {self.samples} samples "
            f"(prompt {lo}-{hi} tok, response median {self.response_median} max {self.response_max}); "
            f"agent: {self.tasks} tasks x {self.agent_samples} trajectories x {self.turns} turns "
            f"(shared {self.system_tokens}-tok system prompt, tool outputs "
            f"{self.tool_tokens[0]}-{self.tool_tokens[1]} tok)"
        )


def random_tokens(rng: random.Random, n: int) -> List[int]:
    """n token ids in [TOKEN_LO, TOKEN_HI)."""
    return [rng.randrange(TOKEN_LO, TOKEN_HI) for _ in range(n)]


def _lognormal(rng: random.Random, median: int, sigma: float, cap: int) -> int:
    return max(1, min(cap, int(round(median * math.exp(rng.gauss(0.0, sigma))))))


def grpo_step(spec: WorkloadSpec, step: int) -> List[dict]:
    """One GRPO rollout step: every sample is its own request (own request_id);
    the samples of a prompt share the whole prompt."""
    rng = random.Random(f"grpo/{spec.seed}/{step}")
    reqs = []
    for p in range(spec.prompts):
        prompt = random_tokens(rng, rng.randint(*spec.prompt_tokens))
        for k in range(spec.samples):
            reqs.append(
                {
                    "rid": f"grpo-s{step}-p{p}-k{k}",
                    "prompt": prompt,
                    "max_tokens": _lognormal(rng, spec.response_median, spec.response_sigma, spec.response_max),
                    "seed": rng.randrange(1 << 31),
                }
            )
    # Submission order interleaves prompts, as a shuffled dataloader batch does.
    rng.shuffle(reqs)
    return reqs


def agent_step(spec: WorkloadSpec, step: int) -> List[dict]:
    """Multi-turn trajectories: one request_id per trajectory; turn t+1's prompt is
    turn t's prompt + its response tokens + a tool output."""
    rng = random.Random(f"agent/{spec.seed}/{step}")
    system = random_tokens(rng, spec.system_tokens)
    trajs = []
    for t in range(spec.tasks):
        task = random_tokens(rng, rng.randint(*spec.task_tokens))
        for k in range(spec.agent_samples):
            turns = [
                {
                    "max_tokens": _lognormal(rng, spec.turn_response_median, 0.6, spec.turn_response_max),
                    "seed": rng.randrange(1 << 31),
                    "tool": random_tokens(rng, rng.randint(*spec.tool_tokens)),
                }
                for _ in range(spec.turns)
            ]
            trajs.append({"rid": f"agent-s{step}-t{t}-k{k}", "prompt": system + task, "turns": turns})
    rng.shuffle(trajs)
    return trajs


def seeded_prompt(seed: int, n: int = 256) -> List[int]:
    """A cheap deterministic prompt: distinct seeds give distinct prompts
    (no shared prefix), the same seed the same one."""
    return [(seed * 7919 + j * 31) % 30000 + 1 for j in range(n)]


def shared_prefix_prompts(n: int, rng: random.Random, length: int = 8192, tail: int = 512) -> List[List[int]]:
    """n GRPO-like prompts of `length` tokens sharing all but the last `tail`."""
    base = [rng.randrange(1, 150_000) for _ in range(length)]
    out = []
    for _ in range(n):
        p = list(base)
        p[-tail:] = [rng.randrange(1, 150_000) for _ in range(tail)]
        out.append(p)
    return out
