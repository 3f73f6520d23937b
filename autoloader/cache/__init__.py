"""The node cache of decoded storage blocks (``store``), its entries (``entry``), how long
it lives (``lifetime``) and what it served (``tally``): below the tuner, the loader and
the plugins."""

from __future__ import annotations

from autoloader.cache.entry import CachedBlock
from autoloader.cache.lifetime import hold, release
from autoloader.cache.store import NodeCache, cache_base
from autoloader.cache.tally import Counts

__all__ = ["CachedBlock", "Counts", "NodeCache", "cache_base", "hold", "release"]
