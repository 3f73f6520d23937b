"""The plan: schema 1, validation, atomic TOML persistence."""

from autoloader.plan.model import BatchingPlan, LoaderPlan, Plan
from autoloader.plan.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "BatchingPlan", "LoaderPlan", "Plan"]
