"""Which raise the policy may try now, and why not (``autoloader.loader.policy``'s
``Adapter`` is one): the next worker count on the grid, sized by the loading measured,
else a deeper queue, else a deeper device feed, each only where it is not the user's, not
settled, not ruled out by the tune's timings, the cores, the host or a queue that cannot
help. A raise declined is kept as data (``Declined``, with its ``Because``), said once.
"""

from __future__ import annotations

import logging
import math

import psutil

from autoloader.host import doubling_grid
from autoloader.loader.caps import MAX_PREFETCH_FACTOR, Limits
from autoloader.loader.decisions import Adaptation, Because, Declined
from autoloader.loader.loading import SPAN, Loading
from autoloader.loader.measures import EpochMeasure, others_moved
from autoloader.loader.settings import SETTINGS, Settings
from autoloader.loop_model import Evidence

SIZED_MARGIN = 1.1  # a sized raise asks for 10% more workers than the loop's step needs
# the workers' memory is measured where the most a raise may start comes within this factor
# of the host-memory budget, at what a worker is known to hold (workers grow: caches)
MEMORY_MARGIN = 4
# The bound on oscillation whatever conditions do: after ``MAX_UNDONE`` raises of a
# setting were undone within ``CHANGE_EPOCHS`` epochs, it is not raised again until one of
# them is that far behind. Under steady conditions one raise in vain settles it.
MAX_UNDONE, CHANGE_EPOCHS = 2, 10

log = logging.getLogger("autoloader")


class RaiseSearch:
    """The raise search over the policy's state (the ``Adapter`` sets every field)."""

    settings: Settings
    limits: Limits
    threshold: float
    min_gain: float
    evidence: Evidence | None
    history: list[Adaptation]
    declined: list[Declined]
    batch_tensors: int
    _fixed: set[str]
    _settled: dict[str, Loading]
    _loading: Loading
    _per_worker_bytes: float | None

    def _cores_gain(self, m: EpochMeasure, workers: int) -> float | None:
        """How much faster ``workers`` could load than ``m``'s on the cores this host
        gives (``autoloader.loader.cores``; None: not measured, or no workers)."""
        if m.cores is None or not m.workers:
            return None
        return m.cores.gain(m.workers, workers)

    def _cores_allow(self, m: EpochMeasure, workers: int) -> bool:
        """Whether ``workers`` could load ``min_gain`` faster on this host's cores than
        ``m``'s did (declined, with why, where they could not)."""
        gain = self._cores_gain(m, workers)
        if gain is None or gain >= self.min_gain:
            return True
        assert m.cores is not None
        self._decline(
            m,
            "num_workers",
            Because.CORES_FULL,
            (
                f"{m.cores.describe()}: {workers} workers could load at most {gain:+.1%} "
                f"faster on them, not the {self.min_gain:+.0%} a raise must bring"
            ),
        )
        return False

    def _decline(self, m: EpochMeasure, setting: str, because: Because, reason: str) -> None:
        """Keep (and log) a raise not tried, unless one of the last few said the same:
        the same cause (``REPEATS``, whose figures move each time) or the same text."""
        declined = Declined(m.epoch, setting, because, reason)
        if any(d.repeats(declined) for d in self.declined[-8:]):
            return
        self.declined.append(declined)
        what = "any setting" if setting == "all" else setting
        log.info("autoloader: after epoch %d, not raising %s: %s", m.epoch, what, reason)

    def _unsettled(self, setting: str, m: EpochMeasure) -> str | None:
        """Whether ``setting`` may be raised: None if not, else "" or why it may again."""
        if setting in self._fixed:
            return None
        if (bound := self._changed_often(setting, m)) is not None:
            self._decline(m, setting, Because.CHANGED_OFTEN, bound)
            return None
        if setting not in self._settled:
            return ""
        before, now = self._settled[setting], self._loading
        if before.workers != self.settings.num_workers or before.workers != m.workers:
            return None
        ratio = now.moved_from(before)
        if ratio is None:
            moved = others_moved(before.others, now.others)
            return None if moved is None else f"; {moved} since the raise in vain: trying again"
        return (
            f"; loading per batch moved {ratio:.2f}x since the raise in vain "
            f"({before.seconds:.4f} s -> {now.seconds:.4f} s over the last "
            f"{now.batches} batches): trying again"
        )

    def _changed_often(self, setting: str, m: EpochMeasure) -> str | None:
        """Why ``setting`` is not raised now: it was lowered (a raise undone, or workers
        held down) ``MAX_UNDONE`` times in the last ``CHANGE_EPOCHS`` epochs. Conditions
        that keep moving, such as reads alternating between a cache and storage, lift the
        settle each time and would otherwise have it follow them every epoch."""
        since = m.epoch - CHANGE_EPOCHS
        downs = [
            c.epoch
            for c in self.history
            if c.setting == setting and c.direction == "down" and c.epoch > since
        ]
        if len(downs) < MAX_UNDONE:
            return None
        until = downs[len(downs) - MAX_UNDONE] + CHANGE_EPOCHS  # one leaves the window
        return (
            f"it came back down {len(downs)} times since epoch {downs[0]}: at most "
            f"{MAX_UNDONE} raises undone in {CHANGE_EPOCHS} epochs, so no raise before "
            f"epoch {until}"
        )

    def _worker_raise(self, m: EpochMeasure, nxt: int, waited: str) -> str | None:
        """Why the workers may be raised to ``nxt`` (None: the evidence rules it out)."""
        current, evidence = self.settings.num_workers, self.evidence
        ruled = (
            evidence.rules_out(current, nxt, self.min_gain, m.compute_seconds) if evidence else None
        )
        return self._unless_ruled(
            m,
            "num_workers",
            waited,
            ruled,
            ", and loading is no slower than the tune measured it",
            f": trying {nxt}",
        )

    def _prefetch_raise(self, m: EpochMeasure, waited: str) -> str | None:
        """Why a deeper queue may help (None: the evidence says the workers' speed, not
        their jitter, is the limit, or that they feed the step already, and loading has
        not moved since the tune)."""
        evidence, workers = self.evidence, self.settings.num_workers
        ruled = None
        if evidence is not None:  # too slow on average, or fast enough: no queue helps
            depth = self.settings.depth
            ruled = evidence.queue_cannot_help(workers) or evidence.feeds_step(
                workers, m.compute_seconds, depth
            )
        return self._unless_ruled(m, "prefetch_factor", waited, ruled, "", "")

    def _unless_ruled(
        self,
        m: EpochMeasure,
        setting: str,
        waited: str,
        ruled: str | None,
        declined: str,
        trying: str,
    ) -> str | None:
        """Why ``setting`` may be raised, or None: settled after a raise in vain while
        loading stays as it was, or ``ruled`` out by the tune's timings while the loop is
        no slower than the tune measured it (then declined: ``ruled`` and ``declined`` say why)."""
        again = self._unsettled(setting, m)
        if again is None:
            return None
        if ruled is None or self.evidence is None:
            return waited + again
        current = self.settings.num_workers
        changed = None
        if m.workers == current:
            now = self._loading
            changed = self.evidence.changed(current, now.seconds, m.compute_seconds, now.batches)
        if changed is None:
            self._decline(m, setting, Because.RULED_OUT, ruled + declined)
            return None
        return f"{waited}; {ruled}, but {changed}{trying}"

    def _raises(self, m: EpochMeasure) -> list[tuple[str, int, str]]:
        """The raise to try, first possible first: (setting, new value, reason)."""
        s, lim = self.settings, self.limits
        waited = f"the loop waited {m.steady_wait_fraction:.0%} of its time for data"
        out = []
        grid = doubling_grid(lim.max_workers)
        per_worker = self._worker_bytes()  # read once: it may read this process's memory
        following = next((w for w in grid if w > s.num_workers), None)  # the grid's next
        capped = following is None or self._workers_refused(m, following, per_worker) is not None
        if following is not None and not capped:
            count = following
            sized = self._sized(m, grid, following, per_worker)
            if sized > following and not self._workers_refused(m, sized, per_worker, quiet=True):
                count = sized
            why = self._worker_raise(m, count, waited)
            if why is None and count > following:  # the sized count ruled out: the next may
                count, why = following, self._worker_raise(m, following, waited)  # not be
            if why is not None and self._cores_allow(m, count):
                out.append(("num_workers", count, why))
        depth = s.depth
        deeper = min(2 * depth, MAX_PREFETCH_FACTOR)
        if (
            s.num_workers > 0
            and self._queue_may_help(m, "prefetch_factor")
            and depth < MAX_PREFETCH_FACTOR
            and lim.shm_refuses(s.num_workers, deeper) is None
            and (
                lim.process is None
                or lim.process.refuses(s.num_workers, deeper, self.batch_tensors) is None
            )
        ):
            held = "at their cap" if capped else "not to be raised"
            why = self._prefetch_raise(m, f"{waited}, with workers {held}")
            if why is not None:
                out.append(("prefetch_factor", deeper, why))
        if (
            s.device_prefetch is not None
            and self._unsettled("device_prefetch", m) is not None
            and self._queue_may_help(m, "device_prefetch")
        ):
            if s.device_prefetch < lim.device_prefetch_max:
                out.append(
                    (
                        "device_prefetch",
                        s.device_prefetch + 1,
                        f"{waited}, with workers and prefetch at their caps",
                    )
                )
        return out

    def _queue_may_help(self, m: EpochMeasure, setting: str) -> bool:
        """Whether a deeper queue has waits to absorb: it smooths bursts of slow batches
        among fast ones, so waits come and go; where the loop was starved over the last
        ``SPAN`` batches at these settings, the workers are behind the step on average,
        and the raise would only restart them (declined, with why). Measured in windows,
        that takes ``SPAN`` batches to tell; whole epochs cannot tell (tried), but workers
        that ran or were ready to run nearly all of one (``Cores.always_ready``) never
        waited on a full queue: they are behind on average."""
        whole = m.batch is None  # a window may be one burst: windows are told apart below
        if whole and m.cores is not None and m.workers and m.cores.always_ready(m.workers):
            self._decline(
                m,
                setting,
                Because.QUEUE_NEVER_FULL,
                f"the workers ran or were ready to run {m.cores.ready(m.workers):.0%} of the "
                "time, never waiting on a full queue: they are behind the step on average, "
                "which a deeper queue cannot change",
            )
            return False
        loading = self._loading
        if not loading.windows:
            return True
        if loading.batches < SPAN:
            return False
        if not loading.starved(self.threshold):
            return True
        self._decline(
            m,
            setting,
            Because.WORKERS_BEHIND,
            f"the loop waited past {self.threshold:.0%} of its time over its last "
            f"{loading.batches} batches, not in a burst: the workers are behind the "
            "step on average, which a deeper queue cannot change",
        )
        return False

    def _workers_refused(
        self, m: EpochMeasure, workers: int, per_worker: float | None, quiet: bool = False
    ) -> str | None:
        """Why ``workers`` cannot run here: the host-memory budget (``per_worker`` bytes
        each, where known), or the host (``_host_refuses``; declined, unless ``quiet``);
        None where nothing refuses them."""
        if per_worker is not None and per_worker * workers > self.limits.memory_budget_bytes:
            return "over the host-memory budget"
        refused = self._host_refuses(workers)
        if refused is not None and not quiet:
            self._decline(m, "num_workers", Because.HOST_REFUSES, refused)
        return refused

    def _host_refuses(self, workers: int) -> str | None:
        """Why ``workers`` cannot start here: forked from a process whose reads they would
        share, their batches in flight past /dev/shm, or past what this process may start."""
        s, lim = self.settings, self.limits
        if s.num_workers == 0 and lim.fork_refuses is not None:
            refused = lim.fork_refuses()
            if refused is not None:
                return refused
        return lim.shm_refuses(workers, s.prefetch_factor) or lim.start_refuses(
            workers, s.prefetch_factor, self.batch_tensors
        )

    def _worker_bytes(self) -> float | None:
        """Memory one worker holds: as measured here, else as the tune's trace measured,
        else at most this process's resident memory (a forked worker shares its pages)."""
        if self._per_worker_bytes is not None:
            return self._per_worker_bytes
        if self.evidence is not None and self.evidence.worker_bytes is not None:
            return self.evidence.worker_bytes
        try:
            return float(psutil.Process().memory_info().rss)
        except (psutil.Error, OSError):
            return None

    def weighs_memory(self) -> bool:
        """Whether measuring the workers' memory could change a decision: a raise of
        workers is possible, and the most workers it may reach, at what one is known to
        hold (as last measured here, else the tune's trace, else this process's resident
        memory, which a forked worker shares), come within ``MEMORY_MARGIN`` of the
        host-memory budget (a reading costs about 14 ms of CPU a worker). Workers that grow
        past that margin after a reading are the survival watch's to recycle."""
        if "num_workers" in self._fixed or self.settings.num_workers >= self.limits.max_workers:
            return False  # no raise of workers to bound
        per_worker = self._worker_bytes()
        if per_worker is None:
            return True
        most = per_worker * self.limits.max_workers
        return most * MEMORY_MARGIN > self.limits.memory_budget_bytes

    def _sized(self, m: EpochMeasure, grid: list[int], nxt: int, per_worker: float | None) -> int:
        """The count this epoch's loading asks for, on the grid and at least ``nxt``: a
        starved loop's workers hand over a batch every ``loading_seconds`` (the main
        process, without workers, takes that per batch itself), so one worker takes
        ``workers`` times that per batch, and feeding the loop's own ``compute_seconds``
        per batch takes that many workers over it, with 10% to spare. One raise sized by
        the measurement, not one doubling per epoch: a dataset whose reads turned 10x
        slower is fed again after one restart."""
        workers, compute = m.workers, m.compute_seconds
        if workers != self.settings.num_workers or compute <= 0 or m.loading_seconds <= 0:
            return nxt
        if per_worker is None:  # no bound on a worker's memory: no jump past the next count
            return nxt
        per_worker = m.loading_seconds * max(1, workers or 0)
        want = math.ceil(SIZED_MARGIN * per_worker / compute)
        return max(nxt, next((w for w in grid if w >= want), grid[-1]))

    def at_cap(self) -> bool:
        """No further raise is possible, whatever the loop measures next: each setting is
        the user's, settled after a raise in vain, or at its cap (the worker grid's last
        count or one the host refuses, the deepest queue, the deepest device feed)."""
        s, lim = self.settings, self.limits
        open_ = [k for k in SETTINGS if k not in self._fixed and k not in self._settled]
        following = next((w for w in doubling_grid(lim.max_workers) if w > s.num_workers), None)
        workers = "num_workers" in open_ and following is not None
        if workers and following is not None:
            per_worker = self._worker_bytes()
            memory = per_worker is not None and per_worker * following > lim.memory_budget_bytes
            workers = not memory and not self._host_refuses(following)
        deeper = min(2 * s.depth, MAX_PREFETCH_FACTOR)
        prefetch = (
            "prefetch_factor" in open_
            and s.num_workers > 0
            and s.depth < MAX_PREFETCH_FACTOR
            and lim.shm_refuses(s.num_workers, deeper) is None
            and (
                lim.process is None
                or lim.process.refuses(s.num_workers, deeper, self.batch_tensors) is None
            )
        )
        feed = (
            "device_prefetch" in open_
            and s.device_prefetch is not None
            and s.device_prefetch < lim.device_prefetch_max
        )
        return not (workers or prefetch or feed)
