"""Seeded workloads: GRPO rollout steps (prompts x samples sharing a prompt),
multi-turn agent trajectories (a shared system prompt, growing turn by turn),
and the synthetic prompts of the soak, fault tests and balancer benchmarks.
Every draw comes from a seed, so two policies see the same requests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Callable, List, Optional, Sequence, Tuple

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
    # GRPO with the RL length structure (issue 26): None keeps independent
    # log-normal draws and a shuffled order; a value in [0, 1] is the
    # within-group correlation rho of the shared model below (stratified
    # lengths), sent in verl's order (a prompt's samples consecutive,
    # 8 agent-loop workers).
    length_corr: Optional[float] = None
    # Recurring prompts (with length_corr): a step's prompts come from a
    # dataset of this many, iterated in shuffled epochs, each prompt's
    # difficulty AR(1) over epochs with epoch_corr (Dataset below); 0 keeps
    # fresh prompts every step.
    dataset_prompts: int = 0
    epoch_corr: float = 0.8

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
    if spec.length_corr is not None:
        return _shaped_grpo_step(spec, step, rng)
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


def _shaped_grpo_step(spec: WorkloadSpec, step: int, rng: random.Random) -> List[dict]:
    """grpo_step with correlated lengths: prompt k's difficulty d_k, sample
    latents correlated(d_k, rho), lengths the response distribution's
    quantiles by rank (the same multiset for every seed and rho), in verl's
    submission order. With ``dataset_prompts`` the prompts (their tokens and
    difficulty) come from a dataset iterated in epochs, so step s of a
    dataset of one step's size is prompt for prompt epoch s + 1."""
    rho = float(spec.length_corr or 0.0)
    if not 0 <= rho <= 1:
        raise ValueError(f"length_corr {rho} outside [0, 1]")
    prompts: List[Tuple[List[int], float]] = []
    if spec.dataset_prompts:
        ds = Dataset(f"grpo/{spec.seed}", Shape(length_corr=rho, dataset_prompts=spec.dataset_prompts,
                                                epoch_corr=spec.epoch_corr), spec.prompts)
        ids, epoch = ds.step(step)
        for k in ids:
            prng = random.Random(f"grpo/{spec.seed}/prompt{k}")  # a prompt's tokens are the same every epoch
            prompts.append((random_tokens(prng, prng.randint(*spec.prompt_tokens)), ds.difficulty(k, epoch)))
    groups: List[List[dict]] = []
    latent: List[float] = []
    for p in range(spec.prompts):
        if spec.dataset_prompts:
            prompt, d = prompts[p]
        else:  # fresh prompts: the draws every earlier run of a seed made
            prompt = random_tokens(rng, rng.randint(*spec.prompt_tokens))
            d = rng.gauss(0.0, 1.0)
        group = []
        for k in range(spec.samples):
            latent.append(correlated(rng, d, rho))
            group.append({"rid": f"grpo-s{step}-p{p}-k{k}", "prompt": prompt, "seed": rng.randrange(1 << 31)})
        groups.append(group)
    lengths = rank_quantiles(latent, lambda q: lognormal_quantile(q, spec.response_median, spec.response_sigma,
                                                                  1, spec.response_max))
    for req, n in zip((r for g in groups for r in g), lengths):
        req["max_tokens"] = n
    return verl_order(groups)


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


# ---------------------------------------------------------------------------
# RL length structure (issue 26): the model of testbed/bench/rlshape.go, the
# same in kvbench and the arena. Its quantile functions are pinned in
# testbed/bench/testdata/rlshape_golden.json, which tests check this module
# against. Each prompt (task) k has a difficulty d_k ~ N(0, 1); sample j's
# latent is sqrt(rho) d_k + sqrt(1 - rho) e_kj, so the within-group
# correlation is rho and the marginal N(0, 1). A step's latents are ranked
# and the i-th smallest gets the length distribution's quantile at
# (i + 0.5) / n: every seed and every rho deal the same multiset (the
# stratified draw); correlation decides which samples get the long ones.
# Quantiles above 1 - truncate are max_tokens. Recurring prompts: a step's
# prompts come from a dataset of N in shuffled epochs (drop_last); a
# prompt's difficulty is AR(1) over epochs with coefficient epoch_corr.

_STD_NORMAL = NormalDist()


def _round_half_away(x: float) -> int:
    # Go's math.Round (the golden file's reference), not Python's banker's round.
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def lognormal_quantile(q: float, median: float, sigma: float, lo: int, hi: int, truncate: float = 0.0) -> int:
    """The length at quantile q of exp(N(ln median, sigma)) clamped to
    [lo, hi]; q above 1 - truncate is hi (responses cut off at max_tokens)."""
    if hi > 0 and truncate > 0 and q > 1 - truncate:
        return hi
    n = _round_half_away(median * math.exp(sigma * _STD_NORMAL.inv_cdf(q)))
    if lo > 0 and n < lo:
        n = lo
    n = max(1, n)
    if hi > 0 and n > hi:
        n = hi
    return n


def pareto_quantile(q: float, lo: float, hi: float, alpha: float) -> float:
    """A bounded Pareto on [lo, hi] with tail index alpha at quantile q
    (sandboxed tool latency: mostly a second or two, a few most of a minute)."""
    k = 1 - (lo / hi) ** alpha
    return lo * (1 - q * k) ** (-1 / alpha)


def turns_quantile(q: float, lo: int, hi: int) -> int:
    span = hi - lo + 1
    return lo + min(span - 1, int(q * span))


def rank_quantiles(latent: Sequence[float], quantile: Callable[[float], Any]) -> List[Any]:
    """The element of rank i (by latent; ties by position) gets quantile((i + 0.5) / n)."""
    n = len(latent)
    order = sorted(range(n), key=lambda i: (latent[i], i))
    out: List[Any] = [None] * n
    for rank, i in enumerate(order):
        out[i] = quantile((rank + 0.5) / n)
    return out


def correlated(rng: random.Random, d: float, rho: float) -> float:
    return math.sqrt(rho) * d + math.sqrt(1 - rho) * rng.gauss(0.0, 1.0)


@dataclass
class Shape:
    """The RL shape of a workload (kvbench's --length-corr, --truncate,
    --dataset-prompts, --epoch-corr)."""

    length_corr: float = 0.0
    truncate: float = 0.0
    dataset_prompts: int = 0  # 0 = fresh prompts every step
    epoch_corr: float = 0.8

    def validate(self, batch: int) -> None:
        if not 0 <= self.length_corr <= 1:
            raise ValueError(f"length_corr {self.length_corr} outside [0, 1]")
        if not 0 <= self.epoch_corr <= 1:
            raise ValueError(f"epoch_corr {self.epoch_corr} outside [0, 1]")
        if not 0 <= self.truncate < 1:
            raise ValueError(f"truncate {self.truncate} outside [0, 1)")
        if self.dataset_prompts < 0 or 0 < self.dataset_prompts < batch:
            raise ValueError(f"dataset_prompts {self.dataset_prompts}: want 0 (fresh) or >= a step's {batch} prompts")


class Dataset:
    """verl's dataloader over a dataset of ``shape.dataset_prompts`` prompts
    (shuffled epochs, drop_last), with each prompt's difficulty per epoch."""

    def __init__(self, seed: Any, shape: Shape, batch: int) -> None:
        shape.validate(batch)
        self.seed, self.shape, self.batch = seed, shape, batch
        self._perms: dict = {}

    def step(self, p: int) -> Tuple[List[int], int]:
        n = self.shape.dataset_prompts
        if n == 0:
            return [p * self.batch + b for b in range(self.batch)], 0
        per_epoch = n // self.batch
        epoch = p // per_epoch
        if epoch not in self._perms:
            perm = list(range(n))
            random.Random(f"epoch/{self.seed}/{epoch}").shuffle(perm)
            self._perms[epoch] = perm
        off = (p % per_epoch) * self.batch
        return self._perms[epoch][off:off + self.batch], epoch

    def difficulty(self, k: int, epoch: int) -> float:
        rng = random.Random(f"difficulty/{self.seed}/{k}")
        d = rng.gauss(0.0, 1.0)
        r = self.shape.epoch_corr
        for _ in range(epoch):
            d = r * d + math.sqrt(1 - r * r) * rng.gauss(0.0, 1.0)
        return d


def verl_order(groups: Sequence[Sequence[Any]], workers: int = 8) -> List[Any]:
    """Submission order of a verl step: the batch in order (a prompt's samples
    consecutive), split into ``workers`` contiguous chunks (agent-loop
    workers), whose calls reach the balancer interleaved, one per worker in
    turn (kvbench's VerlArrivals)."""
    flat = [x for g in groups for x in g]
    if not flat:
        return []
    chunk = -(-len(flat) // max(1, workers))
    chunks = [flat[i:i + chunk] for i in range(0, len(flat), chunk)]
    out = []
    for i in range(chunk):
        for c in chunks:
            if i < len(c):
                out.append(c[i])
    return out
