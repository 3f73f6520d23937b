"""The pre-job tuner: sizes -> worker search -> headroom -> sampler replay -> plan."""

from autoloader.tuning.tuner import tune

__all__ = ["tune"]
