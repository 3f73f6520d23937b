"""The plan: schema 1, validation, atomic TOML persistence."""

from autoloader.plan.model import BatchingPlan, CachePlan, LoaderPlan, Plan
from autoloader.plan.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "BatchingPlan", "CachePlan", "LoaderPlan", "Plan"]
