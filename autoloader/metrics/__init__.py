"""Prometheus metrics: the loader family and the HTTP endpoint."""

from autoloader.metrics.loader import BatchRecorder, LoaderMetrics, loader_metrics
from autoloader.metrics.server import serve_metrics

__all__ = ["BatchRecorder", "LoaderMetrics", "loader_metrics", "serve_metrics"]
