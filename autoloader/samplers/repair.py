"""Repair heavy batches by swapping samples with light ones; counts never change.

Heavy batches (above a cap) are paired with light ones, heaviest with lightest, and each
pair swaps the one sample of each whose size difference brings both closest to their
mean. All pairs swap at once, so a round is a handful of vectorised NumPy steps: sort the
light batches' sizes, then binary-search every heavy sample's ideal partner.
"""

from __future__ import annotations

import numpy as np


def lower_bound(sizes: np.ndarray, batch_size: int, num_batches: int | None = None) -> float:
    """No split of ``sizes`` into batches of ``batch_size`` has a lighter worst batch:
    max(total / number of batches, largest + the smallest ``batch_size - 1``)."""
    s = np.asarray(sizes, dtype=np.int64)
    k = num_batches if num_batches is not None else -(-len(s) // batch_size)
    smallest = (
        np.partition(s, batch_size - 2)[: batch_size - 1] if 1 < batch_size <= len(s) else s[:0]
    )
    return float(max(s.sum() / max(k, 1), int(s.max()) + int(smallest.sum())))


def repair(batches: np.ndarray, sizes: np.ndarray, cap: float, max_rounds: int) -> np.ndarray:
    """Swap samples between heavy and light rows of ``batches`` (in place) until every row
    is at most ``cap`` bytes, no swap helps, or ``max_rounds`` rounds have run."""
    k, g = batches.shape
    if k < 2 or g == 0:
        return batches
    w = sizes[batches]
    sums = w.sum(axis=1)
    for _ in range(max_rounds):
        by_sum = np.argsort(sums, kind="stable")
        heavy = by_sum[::-1][: k // 2]
        heavy = heavy[sums[heavy] > cap]
        m = len(heavy)
        if not m:
            break
        light = by_sum[:m]
        pick_h, pick_l, moved = _best_swaps(w[heavy], w[light], sums[heavy], sums[light])
        ok = np.isfinite(moved)
        if not ok.any():
            break
        h, lt, ih, il = heavy[ok], light[ok], pick_h[ok], pick_l[ok]
        batches[h, ih], batches[lt, il] = batches[lt, il], batches[h, ih].copy()
        w[h, ih], w[lt, il] = w[lt, il], w[h, ih].copy()
        d = moved[ok].astype(np.int64)
        sums[h] -= d
        sums[lt] += d
    return batches


def _best_swaps(
    wh: np.ndarray, wl: np.ndarray, sh: np.ndarray, sl: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each (heavy, light) row pair: the columns to swap and the bytes moved (inf when
    no swap lowers the pair's maximum)."""
    m, g = wh.shape
    rows = np.arange(m)
    want = (sh - sl) / 2.0
    order = np.argsort(wl, axis=1, kind="stable")
    wl_sorted = np.take_along_axis(wl, order, axis=1).astype(np.float64)
    # Offset each row so one global searchsorted serves every row at once.
    span = float(max(wh.max(), wl.max())) + float(np.abs(want).max()) + 1.0
    offset = (2.0 * span) * rows
    flat = (wl_sorted + offset[:, None]).ravel()
    target = wh - want[:, None]  # the ideal light sample for each heavy sample
    pos = np.searchsorted(flat, (target + offset[:, None]).ravel()).reshape(m, g)
    pos -= (rows * g)[:, None]
    best_score = np.full(m, np.inf)
    best_h = np.zeros(m, dtype=np.int64)
    best_l = np.zeros(m, dtype=np.int64)
    best_d = np.full(m, np.inf)
    for cand in (np.clip(pos - 1, 0, g - 1), np.clip(pos, 0, g - 1)):
        d = wh - wl_sorted[rows[:, None], cand]
        useful = (d > 0) & (np.maximum(sh[:, None] - d, sl[:, None] + d) < sh[:, None])
        score = np.where(useful, np.abs(d - want[:, None]), np.inf)
        col = np.argmin(score, axis=1)
        s = score[rows, col]
        better = s < best_score
        best_score[better] = s[better]
        best_h[better] = col[better]
        best_l[better] = order[rows, cand[rows, col]][better]
        best_d[better] = d[rows, col][better]
    return best_h, best_l, best_d
