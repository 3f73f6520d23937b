"""The source's round trip and throughput, for data read from a server (``[tuning.source]``).

Over a network every request pays a round trip; a read of ``B`` bytes takes
``round_trip + B / throughput``. The probe times a few one-byte reads (the round trip) and
one large read (the throughput) of the dataset's first remote file, and plans from them:
the block a request should fetch so that transfer, not waiting, dominates it (at least
``_TRANSFER_SHARE`` of its time), and how many such blocks must be in flight to keep the
link full (the bandwidth-delay product in blocks): what each reading process fetches
ahead of need (``read_ahead_blocks``, applied by ``autoloader.datasets.read_ahead``),
besides the worker search's reach past the CPUs (workers whose reads wait) and the
prefetch.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

from autoloader.datasets import hooks, location
from autoloader.datasets.failures import retrying
from autoloader.plan.schema import MAX_READ_AHEAD

log = logging.getLogger(__name__)

_PINGS = 5  # one-byte reads timed: the median is the round trip
_PROBE_BYTES = 8 * 2**20  # one read timed for the throughput (the file's size at most)
_TRANSFER_SHARE = 0.8  # a block's request should spend this share transferring


def remote_files(dataset: Any) -> list[location.Location]:
    """The remote files a dataset reads (its readers' locations), in order."""
    return [p for p in hooks.reader_paths(dataset) or [] if isinstance(p, location.Location)]


def probe(source: location.Location) -> dict[str, Any]:
    """``[tuning.source]`` for one remote file: round trip, throughput, and the plan."""
    fs = location.filesystem(source)
    size = int(location.info(source)["size"])
    path = source.path

    def timed(start: int, stop: int) -> float:
        began = time.perf_counter()
        retrying(source, "timing a read", lambda: fs.cat_file(path, start=start, end=stop))
        return time.perf_counter() - began

    pings = [timed(i, i + 1) for i in range(_PINGS)]
    round_trip = statistics.median(pings)
    length = max(1, min(size, _PROBE_BYTES))
    took = timed(0, length)
    throughput = length / max(took - round_trip, 1e-6)
    block = block_bytes(round_trip, throughput)
    ahead = read_ahead(round_trip, throughput, block)
    log.info(
        "source %s: round trip %.1f ms, %.1f MB/s: blocks of %d bytes, %d ahead",
        source.server,
        round_trip * 1e3,
        throughput / 1e6,
        block,
        ahead,
    )
    return {
        "url": str(source),
        "server": source.server,
        "round_trip_seconds": round_trip,
        "bytes_per_second": throughput,
        "probe_bytes": length,
        "block_bytes": block,
        "read_ahead_blocks": ahead,
    }


def block_bytes(round_trip: float, throughput: float) -> int:
    """The bytes one request should fetch so that the round trip is at most
    ``1 - _TRANSFER_SHARE`` of its time, and never less than the default block."""
    need = round_trip * throughput * _TRANSFER_SHARE / (1 - _TRANSFER_SHARE)
    return int(max(location.BLOCK_BYTES, need))


def read_ahead(round_trip: float, throughput: float, block: int) -> int:
    """Blocks in flight that keep the link busy through a round trip: one being
    transferred, plus the bandwidth-delay product in blocks."""
    return int(min(MAX_READ_AHEAD, 1 + math.ceil(round_trip * throughput / max(1, block))))
