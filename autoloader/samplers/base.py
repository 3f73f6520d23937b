"""The batch-sampler base: argument checks, epochs, rank splitting, lengths.

A strategy only decides which samples share a *global* batch (``batch_size x
num_replicas`` samples): it implements ``_arrange(pool, num_batches, rng)``. This base
picks the short last batch, orders the batches, and splits every global batch across
ranks so that each rank's share has nearly equal bytes (largest first, each to the
lightest rank with room: no rank carries the big samples while the others wait).

An epoch served in part by one number of ranks can be finished by another (an elastic
resume, ``resume_from``): the events of the epoch, in the order its global batches serve
them (``epoch_order``), are a sequence that depends on the world size the epoch was begun
with; the part served is a prefix of it, counted in local batches over all ranks
(``Served.steps``), and the rest is cut anew into global batches of this world size.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from autoloader.plan.strategies import STRATEGY_OPTIONS
from autoloader.samplers.checks import check_bool, check_int, check_sizes
from autoloader.samplers.hints import hint_batches, hinted
from autoloader.samplers.order import Windows


@dataclass(frozen=True)
class Served:
    """How far an epoch is served, whatever the world size: ``world`` ranks began it (its
    order is theirs: ``epoch_order``), and ``steps`` local batches of it were handed out
    over all ranks, its first ``steps x batch_size`` events in that order (the last short
    batch counted whole)."""

    world: int
    steps: int
    nodes: int = 1  # the nodes whose block shares laid out its global batches (1: none)


class SizeBatchSampler(Sampler[list[int]]):
    """Base class of the size-aware batch samplers in ``autoloader.samplers.STRATEGIES``.

    Args:
        sizes: bytes per sample (any non-negative integers).
        batch_size: samples per batch on this rank (the local batch size).
        shuffle: new batches every epoch; with ``False`` every epoch is the same.
        seed: the seed of every random choice; with the epoch it fixes the batches.
        drop_last: drop the last, incomplete global batch instead of padding it.
        num_replicas: the number of ranks sharing the epoch.
        rank: this rank, in ``[0, num_replicas - 1]``.
        read_order: None for a global shuffle, or ``Windows(block, window)``: the epoch's
            batches come from shuffled windows of storage-contiguous blocks (see
            ``autoloader.samplers.order``); every invariant holds in either order.
        num_nodes: the nodes the ranks run on (``num_replicas / num_nodes`` ranks each,
            rank ``r`` on node ``r // (num_replicas / num_nodes)``, as torchrun numbers
            them). Where ``read_order`` gives nodes shares (``Windows(node_shares=True)``),
            each node's ranks draw their batches from its share of the blocks, each global
            batch holding a part of every node's share (see ``_node_windowed``).
        sampler: ignored. Lightning passes its own (distributed) sampler when it
            re-creates a batch sampler; these are rank-aware already.
    """

    name = "base"
    # global batches the strategy arranges together in a windowed read order (see
    # ``autoloader.samplers.order``)
    pool_batches = 16
    # a strategy that evens out every batch's bytes also needs pools of even bytes
    even_pools = False

    def __init__(
        self,
        sizes: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
        read_order: Windows | None = None,
        sampler: Any = None,
        num_nodes: int = 1,
    ) -> None:
        self.sizes = check_sizes(sizes)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.num_replicas = check_int("num_replicas", num_replicas, minimum=1)
        check_int("rank", rank, minimum=0)
        if rank >= num_replicas:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.rank = rank
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self.seed = check_int("seed", seed, minimum=0)
        if read_order is not None and not isinstance(read_order, Windows):
            raise TypeError(
                f"read_order should be None or a Windows, but got {type(read_order).__name__}"
            )
        self.read_order = read_order
        self.num_nodes = check_int("num_nodes", num_nodes, minimum=1)
        if num_replicas % num_nodes:
            raise ValueError(
                f"num_replicas={num_replicas} ranks do not split evenly over "
                f"num_nodes={num_nodes} nodes"
            )
        self.epoch = 0
        self.epoch_set = False  # set_epoch called: the loop chooses its epochs
        self.resume = 0  # batches of this epoch the next iteration skips (a resumed position)
        # the current epoch begun by another world size (``resume_from``): its batches are
        # the events not served, cut anew for this one; None: the epoch's own batches
        self.carry: Served | None = None
        self._read_ahead: tuple[Any, list[np.ndarray]] | None = None  # see batches_for
        # set by the loader that reads remote storage: each batch is handed with a hint of
        # its reader's next batches (``autoloader.samplers.hints``); 0: plain lists
        self.read_ahead_blocks = 0
        self.readers = 1  # the processes reading batches in turn (the loader's workers)

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.num_replicas

    @property
    def node_parts(self) -> int:
        """The nodes whose shares of the blocks make up each global batch (1: none)."""
        order = self.read_order
        shared = self.shuffle and order is not None and order.node_shares
        return self.num_nodes if shared else 1

    def options(self) -> dict[str, Any]:
        """The strategy's options, as recorded in a plan's ``[batching.options]``."""
        return {}

    def _option(self, key: str, value: Any) -> Any:
        """``value`` for this strategy's option ``key``, checked against its one
        declaration (``autoloader.plan.strategies``), which a plan's is checked against."""
        return STRATEGY_OPTIONS[self.name][key].check(key, value)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch; with ``shuffle=True`` each epoch has its own batches. Another
        epoch than the current one drops a position set by ``resume_at``."""
        epoch = check_int("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self.resume, self.carry = 0, None
        self.epoch, self.epoch_set = epoch, True

    def resume_at(self, batches: int) -> None:
        """The next iteration of this epoch starts after its first ``batches`` batches
        (arithmetic on the epoch's arrangement: the skipped batches are never read). Later
        iterations start at the beginning again."""
        self.resume = check_int("batches", batches, minimum=0)

    def resume_from(self, served: Served) -> None:
        """The current epoch goes on after ``served``, however many ranks served it: with
        this world size and a whole number of its global batches served, from the next
        of them (``resume_at``: exactly what an uninterrupted run yields); else its events
        not served, each once over this world's ranks, cut into global batches of this
        world size in the order the epoch was begun with (``carry``, kept for the epoch:
        ``resume_at`` then counts its batches, and ``set_epoch`` with another epoch drops
        it, the next epochs being this world size's own)."""
        world = check_int("world", served.world, minimum=1)
        steps = check_int("steps", served.steps, minimum=0)
        same = world == self.num_replicas and served.nodes == self.node_parts
        if same and steps % world == 0:
            self.carry = None
            self.resume_at(steps // world)
        else:
            self.carry = Served(world, steps, served.nodes)
            self.resume_at(0)

    def served(self, batches: int, carry: Served | None = None) -> Served:
        """How far the epoch is served once ``batches`` of this rank's batches were handed
        out, from its start or after ``carry`` (the ``carry`` the batches were cut after):
        the position a state saves, whatever world size resumes it."""
        if carry is None:
            return Served(self.num_replicas, batches * self.num_replicas, self.node_parts)
        steps = carry.steps + batches * self.num_replicas
        return Served(carry.world, min(steps, self.steps_in_epoch(carry.world)), carry.nodes)

    def steps_in_epoch(self, world: int) -> int:
        """Local batches an epoch of ``world`` ranks hands out over all of them."""
        return self._batches_in_epoch(world) * world

    def _batches_in_epoch(self, world: int) -> int:
        n, g = len(self.sizes), self.batch_size * world
        return n // g if self.drop_last else -(-n // g)

    def __len__(self) -> int:
        if self.carry is not None:
            rest = len(self.sizes) - self._carried_from(self.carry)
            g = self.global_batch_size
            return rest // g if self.drop_last else -(-rest // g)
        return self._batches_in_epoch(self.num_replicas)

    def _carried_from(self, carry: Served) -> int:
        """The events of the epoch's order (``epoch_order``) that ``carry`` served: all of
        them once its world's epoch was served to the end (with ``drop_last``, the short
        last global batch it left out stays out)."""
        if carry.steps >= self.steps_in_epoch(carry.world):
            return len(self.sizes)
        return min(carry.steps * self.batch_size, len(self.sizes))

    def epoch_order(self, epoch: int, world: int, nodes: int = 1) -> np.ndarray:
        """The events of ``epoch`` for ``world`` ranks, in the order its global batches
        serve them: each global batch as its ranks' shares, rank 0's first, then the
        short last one unpadded, even where ``drop_last`` leaves it out (so any ``world x
        k`` local batches of it are balanced global batches). A pure function of (sizes,
        options, seed, epoch, world, and the ``nodes`` that shared its blocks)."""
        other = copy.copy(self)
        other.num_replicas, other.rank, other.carry, other._read_ahead = world, 0, None, None
        other.drop_last, other.num_nodes = False, nodes
        full, tail = other.global_batches(epoch)
        shares = node_rank_order(full, self.sizes, world, other.node_parts).reshape(-1)
        return np.concatenate([shares, tail]).astype(np.int64, copy=False)

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.resume = self.resume, 0
        batches = self.local_batches()
        self._read_ahead = None  # the epoch has come: this iteration holds its batches
        blocks, stride = self.read_ahead_blocks, max(1, self.readers)
        block = self.read_order.block if self.read_order is not None else None
        count = hint_batches(blocks, block, self.batch_size, stride)
        yield from hinted(batches[skip:], stride, count, blocks)

    def local_batches(self) -> list[np.ndarray]:
        """This rank's batches for the current epoch, as index arrays."""
        return self.batches_for(self.epoch)

    def batches_for(self, epoch: int, *, keep: bool = False) -> list[np.ndarray]:
        """This rank's batches for ``epoch``, as index arrays, without changing the
        sampler: the loader reads the next epoch's first batches ahead, before the loop
        asks for them (``autoloader.loader.lookahead``). The arrangement of the last epoch
        asked for ahead (``keep``) is kept until an epoch is iterated, so it is not
        computed twice."""
        carry = self.carry if epoch == self.epoch else None
        key = (epoch, carry, self._arrangement())
        kept = self._read_ahead
        if kept is not None and kept[0] == key:
            return kept[1]
        if carry is not None:
            rest = self.epoch_order(epoch, carry.world, carry.nodes)
            rest = rest[self._carried_from(carry) :]
            g = self.global_batch_size
            whole = len(rest) // g * g
            full, tail = rest[:whole].reshape(-1, g), rest[whole:]
            if self.drop_last:
                tail = tail[:0]
            parts = 1
        else:
            full, tail = self.global_batches(epoch)
            parts = self.node_parts
        out = list(node_rank_share(full, self.sizes, self.num_replicas, parts, self.rank))
        if len(tail) and parts > 1:  # each node's spare samples to its own ranks
            assert self.read_order is not None
            node_of = self.read_order.owners(self.sizes, parts, epoch)[
                tail // self.read_order.block
            ]
            laid = node_tail(tail, node_of, parts, self.num_replicas)
            out.extend(
                node_rank_share(laid[None, :], self.sizes, self.num_replicas, parts, self.rank)
            )
        elif len(tail):
            padded = pad_last_batch(tail, self.num_replicas)
            out.extend(rank_share(padded[None, :], self.sizes, self.num_replicas, self.rank))
        assert carry is not None or len(out) == self._batches_in_epoch(self.num_replicas)
        if keep:
            self._read_ahead = (key, out)
        return out

    def _arrangement(self) -> tuple[Any, ...]:
        """Everything but the epoch that an epoch's batches depend on."""
        order = (self.read_order.block, self.read_order.window) if self.read_order else None
        return (
            id(self.sizes),
            len(self.sizes),
            self.batch_size,
            self.num_replicas,
            self.rank,
            self.shuffle,
            self.drop_last,
            self.seed,
            order,
            self.node_parts,
            tuple(sorted(self.read_order.options().items())) if self.read_order else None,
            tuple(sorted(self.options().items())),
        )

    def global_batches(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The full global batches ``(k, batch_size x num_replicas)`` of ``epoch`` (None:
        the current one) and the short last one (empty when the count divides, or with
        ``drop_last``)."""
        n, g = len(self.sizes), self.global_batch_size
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng([self.seed, epoch if self.shuffle else 0])
        if self.node_parts > 1:
            assert self.read_order is not None
            full, tail = self._node_windowed(self.read_order, n, rng, epoch)
        elif self.shuffle and self.read_order is not None:
            full, tail = self._windowed(self.read_order, n, rng)
        else:
            k = n // g
            order = rng.permutation(n) if self.shuffle else np.arange(n)
            pool, tail = order[: k * g], order[k * g :]
            full = self._shuffled(self._arrange(pool, k, rng) if k else pool.reshape(0, g), rng)
        if self.drop_last:
            tail = tail[:0]
        return full, tail

    def _windowed(
        self, windows: Windows, n: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The windowed read sequence arranged a pool at a time, pools in read order; the
        rest after the last whole global batch is the tail."""
        g = self.global_batch_size
        sequence = windows.sequence(n, rng)
        return self._pooled(windows, sequence, n // g * g, rng), sequence[n // g * g :]

    def _pooled(
        self, windows: Windows, sequence: np.ndarray, whole: int, rng: np.random.Generator
    ) -> np.ndarray:
        """The first ``whole`` samples of ``sequence`` arranged into global batches a pool
        at a time, pools in read order."""
        g = self.global_batch_size
        step = windows.pool(g, self.pool_batches)
        if self.even_pools:
            sequence = even_pools(sequence, self.sizes, whole, step)
        parts = [np.empty((0, g), dtype=np.int64)]
        for start in range(0, whole, step):
            pool = sequence[start : min(start + step, whole)]
            parts.append(self._shuffled(self._arrange(pool, len(pool) // g, rng), rng))
        return np.concatenate(parts)

    def _node_windowed(
        self, windows: Windows, n: int, rng: np.random.Generator, epoch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Global batches laid out by node, node 0's part first: node ``k``'s part of each
        is a batch of its ranks arranged from its share of the blocks (``Windows.shares``)
        in a windowed order of its own. Every node serves the same number of events: a
        share of more than that gives its last samples in read order to the shares of
        fewer (a block's worth or a global batch's at most: the shares are balanced), and
        what is left, less than a global batch, is the tail. The samples a share gives are
        its highest indices, not its last in read order: with fixed shares the same blocks
        every epoch, so a node fetches another's blocks for them once per job, not anew
        each epoch."""
        nodes = self.num_nodes
        g = self.global_batch_size
        quota = n // g * (g // nodes)
        shares = windows.shares(self.sizes, nodes, epoch)
        sequences = [windows.share_sequence(b, n, rng) for b in shares]
        cuts = [beyond(s, quota) for s in sequences]
        sequences = [s for s, _ in cuts]
        spare = np.concatenate([np.empty(0, dtype=np.int64)] + [extra for _, extra in cuts])
        view = copy.copy(self)
        view.num_replicas, view.num_nodes, view._read_ahead = self.num_replicas // nodes, 1, None
        parts = []
        for sequence in sequences:
            own = sequence[:quota]
            need = quota - len(own)
            own, spare = np.concatenate([own, spare[:need]]), spare[need:]
            parts.append(view._pooled(windows, own, quota, rng))
        return np.concatenate(parts, axis=1), spare

    def _shuffled(self, batches: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        k = len(batches)
        return batches[rng.permutation(k)] if self.shuffle and k > 1 else batches

    def _arrange(self, pool: np.ndarray, num_batches: int, rng: np.random.Generator) -> np.ndarray:
        """Arrange ``pool`` (``num_batches x global batch`` indices, in random order when
        shuffling) into a ``(num_batches, global batch)`` array."""
        raise NotImplementedError


def even_pools(sequence: np.ndarray, sizes: np.ndarray, whole: int, step: int) -> np.ndarray:
    """``sequence`` with samples swapped between neighbouring pools (of ``step`` samples,
    over its first ``whole``) until each pool weighs about the mean: a strategy that evens
    out batches within a pool can then reach the global mean in every pool. A sample moves
    one pool at most, so the reads keep their order."""
    out = sequence.copy()
    pools = list(range(0, whole, step))
    target = sizes[out[:whole]].sum() / max(1, whole)
    for a in pools[:-1]:
        b, end = a + step, min(a + 2 * step, whole)
        here, there = out[a:b], out[b:end]
        excess = sizes[here].sum() - target * len(here)
        mine = np.argsort(sizes[here], kind="stable")
        theirs = np.argsort(sizes[there], kind="stable")
        if excess > 0:  # give the heaviest, take the lightest
            mine = mine[::-1]
        else:  # give the lightest, take the heaviest
            theirs = theirs[::-1]
        k = min(len(mine), len(theirs))
        diff = sizes[here[mine[:k]]] - sizes[there[theirs[:k]]]
        useful = np.sign(diff) == np.sign(excess)
        gained = np.cumsum(np.where(useful, np.abs(diff), 0))
        swaps = min(int(np.searchsorted(gained, abs(excess))), int(useful.sum()))
        if swaps:
            i, j = mine[:swaps], theirs[:swaps]
            here[i], there[j] = there[j].copy(), here[i].copy()
    return out


def beyond(sequence: np.ndarray, quota: int) -> tuple[np.ndarray, np.ndarray]:
    """``sequence`` less its samples beyond the first ``quota``, those being its highest
    indices (ascending); the rest keeps its order."""
    if len(sequence) <= quota:
        return sequence, sequence[:0]
    cut = np.sort(sequence)[quota]
    return sequence[sequence < cut], np.sort(sequence[sequence >= cut])


def node_tail(tail: np.ndarray, node_of: np.ndarray, nodes: int, world: int) -> np.ndarray:
    """The short last global batch laid out by node (``nodes`` equal parts, node 0's
    first, padded so that it splits evenly over ``world`` ranks): each node's part holds
    the samples of its own share first (``node_of``: each sample's node), those a part
    has no room for fill the parts short of their own, and a part still short repeats its
    first samples (the tail's, where it has none)."""
    per = -(-len(tail) // world) * (world // nodes)
    own = [tail[node_of == k] for k in range(nodes)]
    parts = [o[:per] for o in own]
    extra = np.concatenate([o[per:] for o in own])
    for k in range(nodes):
        need = per - len(parts[k])
        parts[k], extra = np.concatenate([parts[k], extra[:need]]), extra[need:]
        if len(parts[k]) < per:
            parts[k] = np.resize(parts[k] if len(parts[k]) else tail, per)
    return np.concatenate(parts)


def pad_last_batch(tail: np.ndarray, num_replicas: int) -> np.ndarray:
    """Repeat the first indices so the last global batch splits evenly over the ranks."""
    missing = -len(tail) % num_replicas
    return np.concatenate([tail, np.resize(tail, missing)]) if missing else tail


def rank_share(batches: np.ndarray, sizes: np.ndarray, num_replicas: int, rank: int) -> np.ndarray:
    """Split each row of ``batches`` over the ranks with nearly equal bytes per rank.

    Greedy with equal counts, for all rows at once: samples in decreasing size each go to
    the lightest rank that still has room. Every rank computes the same split.
    """
    if num_replicas == 1:
        return batches
    per = batches.shape[1] // num_replicas
    return rank_order(batches, sizes, num_replicas)[:, rank * per : (rank + 1) * per]


def node_rank_share(
    batches: np.ndarray, sizes: np.ndarray, num_replicas: int, nodes: int, rank: int
) -> np.ndarray:
    """``rank_share`` of rows laid out by node (``nodes`` equal parts, node 0's first):
    a rank's share comes from its node's part, split over that node's ranks."""
    if nodes == 1:
        return rank_share(batches, sizes, num_replicas, rank)
    per_node, part = num_replicas // nodes, batches.shape[1] // nodes
    node, local = divmod(rank, per_node)
    return rank_share(batches[:, node * part : (node + 1) * part], sizes, per_node, local)


def node_rank_order(
    batches: np.ndarray, sizes: np.ndarray, num_replicas: int, nodes: int
) -> np.ndarray:
    """``rank_order`` of rows laid out by node: every rank's share, rank 0's first."""
    if nodes == 1:
        return rank_order(batches, sizes, num_replicas)
    part = batches.shape[1] // nodes
    return np.concatenate(
        [
            rank_order(batches[:, k * part : (k + 1) * part], sizes, num_replicas // nodes)
            for k in range(nodes)
        ],
        axis=1,
    )


def rank_order(batches: np.ndarray, sizes: np.ndarray, num_replicas: int) -> np.ndarray:
    """Each row of ``batches`` as its ranks' shares (``rank_share``), rank 0's first."""
    if num_replicas == 1 or not len(batches):
        return batches
    rows, g = batches.shape
    per = g // num_replicas
    by_size = np.argsort(-sizes[batches], axis=1, kind="stable")
    ordered = np.take_along_axis(batches, by_size, axis=1)
    weights = sizes[ordered]
    totals = np.zeros((rows, num_replicas), dtype=np.int64)
    counts = np.zeros((rows, num_replicas), dtype=np.int64)
    owner = np.empty((rows, g), dtype=np.int64)
    r = np.arange(rows)
    for col in range(g):
        # a full rank is never the lightest: push it past every real total
        masked = np.where(counts < per, totals, np.iinfo(np.int64).max)
        choice = np.argmin(masked, axis=1)
        owner[:, col] = choice
        totals[r, choice] += weights[:, col]
        counts[r, choice] += 1
    by_rank = np.argsort(owner, axis=1, kind="stable")
    return np.take_along_axis(ordered, by_rank, axis=1)
