"""Device metrics from NVML, read at scrape time, for every GPU of the node.

``autoloader_device_memory_total_bytes``, ``autoloader_device_memory_used_bytes``,
``autoloader_device_memory_peak_bytes`` (the most used seen by this process since it
started) and ``autoloader_device_utilization_ratio`` (GPU busy time over NVML's last
sample period, 0..1), each labelled by ``device`` (the NVML index) and ``uuid``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from autoloader.accelerator import nvml

log = logging.getLogger("autoloader")


class DeviceCollector(Collector):
    """A Prometheus collector that asks NVML on every scrape."""

    def __init__(self) -> None:
        self._peaks: dict[str, int] = {}
        self._lock = threading.Lock()
        self._warned = False

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["device", "uuid"]
        total = GaugeMetricFamily(
            "autoloader_device_memory_total_bytes", "Device memory in total (NVML).", labels=labels
        )
        used = GaugeMetricFamily(
            "autoloader_device_memory_used_bytes", "Device memory in use (NVML).", labels=labels
        )
        peak = GaugeMetricFamily(
            "autoloader_device_memory_peak_bytes",
            "Most device memory in use seen since the agent started.",
            labels=labels,
        )
        util = GaugeMetricFamily(
            "autoloader_device_utilization_ratio",
            "GPU busy share over NVML's last sample period.",
            labels=labels,
        )
        for index, uuid, mem_total, mem_used, busy in self._read():
            key = [str(index), uuid]
            total.add_metric(key, mem_total)
            used.add_metric(key, mem_used)
            with self._lock:
                self._peaks[uuid] = max(self._peaks.get(uuid, 0), mem_used)
                peak.add_metric(key, self._peaks[uuid])
            if busy is not None:
                util.add_metric(key, busy)
        yield from (total, used, peak, util)

    def _read(self) -> list[tuple[int, str, int, int, float | None]]:
        with nvml("no device metrics", quiet=self._warned) as pynvml:
            self._warned = True
            if pynvml is None:
                return []
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                out.append(
                    (
                        i,
                        _text(pynvml.nvmlDeviceGetUUID(handle)),
                        int(mem.total),
                        int(mem.used),
                        _utilization(pynvml, handle),
                    )
                )
            return out


def _utilization(pynvml: Any, handle: Any) -> float | None:
    try:
        return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
    except Exception:  # MIG instances and some drivers do not report it
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
