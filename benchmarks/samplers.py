"""Benchmark the batch samplers: worst batch, spread, build time and randomness.

Two size distributions, each over 3 epochs at local batch 64 on one rank:
  (a) paper-like: 300,396 samples, log-normal with median 90 and sigma 0.75, clipped to
      12..2833 units (the shape of Lee et al.'s HEP graph sizes);
  (b) real molecules: the 5,000 NCI molecules that ship inside the rdkit wheel
      (rdkit/Data/NCI/first_5K.smi), each sized in bytes as the PyG graph that
      torch_geometric.utils.from_smiles builds (needs `pip install rdkit`).

Printed per strategy: worst batch / lower bound, worst / random's worst (same run, same
data), the std of full batches' bytes relative to the mean, the median epoch build time, the
share of batches that recur in the next epoch, and the share of samples that keep at
least one batch-mate into the next epoch. Run: `python benchmarks/samplers.py`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from autoloader.samplers import STRATEGIES, lower_bound, make_sampler
from autoloader.sizes import nbytes_of

EPOCHS = 3


def paper_like(n: int = 300_396, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(90), 0.75, n)), 12, 2833).astype(np.int64)


def nci_molecules() -> np.ndarray | None:
    try:
        import rdkit
        from rdkit import RDLogger
        from torch_geometric.utils import from_smiles
    except ImportError:
        return None
    RDLogger.DisableLog("rdApp.*")
    path = Path(rdkit.__file__).parent / "Data" / "NCI" / "first_5K.smi"
    sizes = []
    for line in path.read_text().splitlines():
        smiles = line.split()[0] if line.strip() else ""
        if not smiles:
            continue
        try:
            sizes.append(nbytes_of(from_smiles(smiles)))
        except Exception:  # a few NCI entries do not parse; they are not molecules we can size
            continue
    return np.asarray(sizes, dtype=np.int64)


def randomness(prev: list[np.ndarray], cur: list[np.ndarray], n: int) -> tuple[float, float]:
    """(share of batches recurring, share of samples keeping a batch-mate)."""
    seen = {tuple(sorted(b.tolist())) for b in prev}
    recur = sum(tuple(sorted(b.tolist())) in seen for b in cur) / len(cur)
    ids = []
    for batches in (prev, cur):
        owner = np.full(n, -1, dtype=np.int64)
        for i, b in enumerate(batches):
            owner[b] = i
        ids.append(owner)
    both = (ids[0] >= 0) & (ids[1] >= 0)
    key = ids[0][both] * (len(cur) + 1) + ids[1][both]
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    keeps = (counts[inverse] >= 2).mean()
    return recur, float(keeps)


def run(title: str, sizes: np.ndarray, batch: int) -> list[dict[str, float]]:
    lb = lower_bound(sizes, batch)
    rows = []
    for name in STRATEGIES:
        sampler = make_sampler(name, sizes, batch)
        worst, times, spreads, epochs = 0, [], [], []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            start = time.perf_counter()
            batches = sampler.local_batches()
            times.append(time.perf_counter() - start)
            totals = np.array([sizes[b].sum() for b in batches])
            worst = max(worst, int(totals.max()))
            full = np.array([len(b) == batch for b in batches])  # the short last one aside
            spreads.append(totals[full].std() / totals[full].mean())
            epochs.append(batches)
        pairs = [randomness(epochs[e], epochs[e + 1], len(sizes)) for e in range(EPOCHS - 1)]
        rows.append(
            {
                "strategy": name,
                "worst": worst,
                "worst_lb": worst / lb,
                "std": float(np.mean(spreads)),
                "build_ms": 1000 * float(np.median(times)),
                "recur": float(np.mean([p[0] for p in pairs])),
                "keep": float(np.mean([p[1] for p in pairs])),
            }
        )
    base = rows[0]["worst"]
    print(
        f"\n{title}: {len(sizes):,} samples, batch {batch}, {EPOCHS} epochs, lower bound {lb:,.0f}"
    )
    print(
        f"  {'strategy':<11}{'worst/LB':>9}{'worst/random':>14}{'std/mean':>10}"
        f"{'build ms':>10}{'recur %':>9}{'keep-mate %':>13}"
    )
    for r in rows:
        r["worst_random"] = r["worst"] / base
        print(
            f"  {r['strategy']:<11}{r['worst_lb']:>9.3f}{r['worst_random']:>14.3f}"
            f"{r['std']:>10.4f}{r['build_ms']:>10.1f}{100 * r['recur']:>9.2f}"
            f"{100 * r['keep']:>13.2f}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    run("(a) paper-like log-normal", paper_like(), args.batch)
    molecules = nci_molecules()
    if molecules is None:
        print("\n(b) real molecules: skipped, rdkit is not installed (pip install rdkit)")
    else:
        run("(b) NCI molecules from the rdkit wheel, sized as PyG graphs", molecules, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
