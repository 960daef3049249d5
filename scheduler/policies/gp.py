"""A small exact Gaussian process regressor (numpy): RBF kernel, fixed hyperparameters.

Enough for FASER's GP-LCB (faser.py) over a sliding window of N observations:
one fit is a Cholesky of an N x N matrix, O(N^3) (N = 64: tens of
microseconds); a prediction at M points is O(N^2 M). Hyperparameters are
fixed by the caller (inputs pre-scaled to unit ranges), not optimised: the
window is small and refitting every iteration must stay cheap.

    k(x, x') = signal_var * exp(-0.5 * sum_d ((x_d - x'_d) / lengthscale_d)^2)
    mu(x*)   = k*^T (K + noise_var I)^-1 y
    var(x*)  = signal_var - k*^T (K + noise_var I)^-1 k*
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class ExactGP:
    def __init__(self, lengthscales: Sequence[float], signal_var: float, noise_var: float) -> None:
        self.lengthscales = np.asarray(lengthscales, dtype=float)
        self.signal_var = float(signal_var)
        self.noise_var = float(noise_var)
        self._x = np.zeros((0, len(self.lengthscales)))  # [n, d]
        self._chol: np.ndarray | None = None  # [n, n], lower
        self._weights = np.zeros(0)  # (K + noise I)^-1 y, [n]

    def kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """RBF between rows of ``a`` [n, d] and ``b`` [m, d] -> [n, m]."""
        diff = (a[:, None, :] - b[None, :, :]) / self.lengthscales  # [n, m, d]
        return self.signal_var * np.exp(-0.5 * (diff**2).sum(-1))

    def fit(self, x: np.ndarray, y: np.ndarray) -> ExactGP:
        """Condition on observations ``x`` [n, d], ``y`` [n] (zero prior mean: subtract yours first)."""
        x = np.asarray(x, dtype=float).reshape(len(y), -1)
        self._x = x
        if len(y) == 0:
            self._chol, self._weights = None, np.zeros(0)
            return self
        k = self.kernel(x, x) + (self.noise_var + 1e-10 * self.signal_var) * np.eye(len(y))
        self._chol = np.linalg.cholesky(k)
        self._weights = np.linalg.solve(self._chol.T, np.linalg.solve(self._chol, np.asarray(y, dtype=float)))
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at ``x`` [m, d]."""
        x = np.asarray(x, dtype=float).reshape(-1, len(self.lengthscales))
        if self._chol is None:
            return np.zeros(len(x)), np.full(len(x), np.sqrt(self.signal_var))
        ks = self.kernel(self._x, x)  # [n, m]
        mean = ks.T @ self._weights
        v = np.linalg.solve(self._chol, ks)  # [n, m]
        var = np.maximum(self.signal_var - (v**2).sum(0), 1e-12 * self.signal_var)
        return mean, np.sqrt(var)
