"""Mean ± 95% confidence intervals (Student's t) and the one rule every
rendered table uses to name a winner: a policy is "best" on a metric only
when its interval does not overlap any other policy's; otherwise the
policies whose intervals overlap the best mean's interval "tie"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

# t_{0.975, df} for df = 1..30; beyond, 1.96 is within 2%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df <= 0:
        return math.nan
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class MeanCI:
    mean: float
    ci95: float  # half-width; nan for a single value
    n: int
    sd: float

    @property
    def lo(self) -> float:
        return self.mean - (0.0 if math.isnan(self.ci95) else self.ci95)

    @property
    def hi(self) -> float:
        return self.mean + (0.0 if math.isnan(self.ci95) else self.ci95)

    def fmt(self, digits: int = 3, scale: float = 1.0) -> str:
        if self.n == 0 or math.isnan(self.mean):
            return "n/a"
        if self.n == 1 or math.isnan(self.ci95):
            return f"{self.mean * scale:.{digits}f}"
        return f"{self.mean * scale:.{digits}f} ± {self.ci95 * scale:.{digits}f}"

    def as_dict(self) -> Dict[str, float]:
        return {"mean": self.mean, "ci95": self.ci95, "n": self.n, "sd": self.sd}


def mean_ci(xs: Sequence[float]) -> MeanCI:
    v = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    n = len(v)
    if n == 0:
        return MeanCI(math.nan, math.nan, 0, math.nan)
    m = sum(v) / n
    if n == 1:
        return MeanCI(m, math.nan, 1, math.nan)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (n - 1))
    return MeanCI(m, t975(n - 1) * sd / math.sqrt(n), n, sd)


def overlap(a: MeanCI, b: MeanCI) -> bool:
    return not (a.hi < b.lo or b.hi < a.lo)


@dataclass(frozen=True)
class Verdict:
    metric: str
    winner: Optional[str]  # set only when its interval overlaps no other
    tied: List[str]  # the best-mean policy and every policy whose interval overlaps it
    best: str  # the best mean

    def text(self, stats: Dict[str, MeanCI], digits: int = 3, scale: float = 1.0, unit: str = "") -> str:
        b = stats[self.best]
        if not self.winner and len(self.tied) == 1:
            return f"{self.best} best by mean ({b.fmt(digits, scale)}{unit}; one seed, no interval)"
        if self.winner:
            return f"**{self.winner}** best ({b.fmt(digits, scale)}{unit}; intervals do not overlap)"
        return "tie: " + ", ".join(f"{p} {stats[p].fmt(digits, scale)}{unit}" for p in self.tied)


def verdict(metric: str, stats: Dict[str, MeanCI], lower_is_better: bool = True) -> Optional[Verdict]:
    """Best-by-mean policy; "best" only without overlap, else a tie."""
    have = {p: s for p, s in stats.items() if s.n > 0 and not math.isnan(s.mean)}
    if not have:
        return None
    best = (min if lower_is_better else max)(have, key=lambda p: have[p].mean)
    tied = [best] + [p for p, s in have.items() if p != best and overlap(s, have[best])]
    single = have[best].n < 2  # no interval: never a winner
    return Verdict(metric, None if (len(tied) > 1 or single) else best, tied if len(tied) > 1 or single else [best],
                   best)
