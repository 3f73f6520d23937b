"""Prometheus metrics: the loader family, devices, and the ways out (HTTP, files, push)."""

from autoloader.metrics.device import DeviceCollector
from autoloader.metrics.export import TextfileWriter, push_metrics, write_textfile
from autoloader.metrics.loader import BatchRecorder, LoaderMetrics, LoaderStats, loader_metrics
from autoloader.metrics.server import serve_metrics

__all__ = [
    "BatchRecorder",
    "DeviceCollector",
    "LoaderMetrics",
    "LoaderStats",
    "TextfileWriter",
    "loader_metrics",
    "push_metrics",
    "serve_metrics",
    "write_textfile",
]
