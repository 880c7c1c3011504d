"""Token-length distributions for synthetic traces; every sample is a whole number >= 1.

Build one through the ``LengthDist`` constructors (``LengthDist.fixed(512)``,
``LengthDist.lognormal(median=1000, sigma=1.0, max_tokens=8192)``, ...) or the classes
directly. Each validates its parameters when built and draws from a caller's Generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from traces.trace import Trace

TOKEN_COLUMNS = ("prompt_tokens", "output_tokens")


class LengthDist:
    """Base of the length distributions: ``sample(num, rng) -> int64 [num]``."""

    kind = "abstract"

    def sample(self, num: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    @staticmethod
    def fixed(value: int) -> FixedLength:
        return FixedLength(value)

    @staticmethod
    def uniform(low: int, high: int) -> UniformLength:
        return UniformLength(low, high)

    @staticmethod
    def lognormal(*, median: float | None = None, mean: float | None = None, sigma: float,
                  max_tokens: int | None = None) -> LognormalLength:
        """Give the median or the mean of the lengths; ``sigma`` is the std-dev of log length."""
        if (median is None) == (mean is None):
            raise ValueError("lognormal length needs exactly one of median= or mean=")
        if median is None:
            assert mean is not None
            if not mean > 0:
                raise ValueError(f"lognormal mean must be > 0, got {mean}")
            median = mean * float(np.exp(-(sigma**2) / 2))  # mean = median * e^(sigma^2 / 2)
        return LognormalLength(median, sigma, max_tokens)

    @staticmethod
    def empirical(trace: Trace, column: str) -> EmpiricalLength:
        """Resample a real trace's ``prompt_tokens`` or ``output_tokens`` column."""
        if column not in TOKEN_COLUMNS:
            raise ValueError(f"column must be one of {TOKEN_COLUMNS}, got '{column}'")
        return EmpiricalLength(np.asarray(getattr(trace, column), dtype=np.int64), column)


@dataclass(frozen=True)
class FixedLength(LengthDist):
    value: int
    kind = "fixed"

    def __post_init__(self) -> None:
        if self.value < 1:
            raise ValueError(f"fixed length needs value >= 1, got {self.value}")

    def sample(self, num: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(num, self.value, dtype=np.int64)


@dataclass(frozen=True)
class UniformLength(LengthDist):
    low: int  # inclusive
    high: int  # inclusive
    kind = "uniform"

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"uniform length needs 1 <= low <= high, got {self.low}, {self.high}")

    def sample(self, num: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high, size=num, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class LognormalLength(LengthDist):
    median: float
    sigma: float
    max_tokens: int | None = None  # upper clip; None clips only below, at 1
    kind = "lognormal"

    def __post_init__(self) -> None:
        if not self.median > 0 or self.sigma < 0:
            raise ValueError(f"lognormal needs median > 0 and sigma >= 0, got {self.median}, {self.sigma}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"lognormal max_tokens must be >= 1, got {self.max_tokens}")

    def sample(self, num: int, rng: np.random.Generator) -> np.ndarray:
        draws = np.rint(rng.lognormal(np.log(self.median), self.sigma, size=num))
        upper = np.inf if self.max_tokens is None else self.max_tokens
        return np.clip(draws, 1, upper).astype(np.int64)


@dataclass(frozen=True)
class EmpiricalLength(LengthDist):
    values: np.ndarray = field(compare=False, repr=False)  # int64 [M], all >= 1
    column: str = "prompt_tokens"
    kind = "empirical"

    def __post_init__(self) -> None:
        if self.values.size == 0 or self.values.min() < 1:
            raise ValueError("empirical length needs a non-empty column of lengths >= 1")

    def sample(self, num: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(self.values, size=num, replace=True)
