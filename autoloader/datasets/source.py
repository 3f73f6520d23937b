"""Where a dataset's data lives, and a stamp that changes when it does (``DataSource``).

A dataset says it through ``autoloader_source()``, one of the hooks declared, with what
each means, in ``autoloader.datasets.hooks``: its sizes are cached beside the data and
invalidated by the stamp.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from autoloader.redact import redact


@dataclass(frozen=True)
class DataSource:
    """A dataset's location on disk and a stamp that changes whenever its data does."""

    path: Path
    stamp: str
    part: str = ""  # which part of the data (a split of one file): its own cache
    # the files read where ``path`` is a directory (``for_files``): only these are inputs,
    # so a plan may be written beside them; empty: everything under ``path`` is
    files: tuple[Path, ...] = ()
    url: str = ""  # data behind a URL: ``path`` is not on this host, the cache is local

    @classmethod
    def for_url(cls, url: str, stamps: list[str]) -> DataSource:
        """Remote data: ``stamps`` are what its server says of each file (size and
        modification time, or an ETag or checksum), so a change on the server is seen.
        The URL is kept without its password (it names the size cache, which is written)."""
        digest = hashlib.sha256("\n".join(stamps).encode()).hexdigest()
        return cls(Path(user_cache_dir()), f"remote n={len(stamps)} {digest}", url=redact(url))

    @classmethod
    def for_file(cls, path: str | os.PathLike[str]) -> DataSource:
        p = Path(path).resolve()
        st = p.stat()
        return cls(p, f"file size={st.st_size} mtime_ns={st.st_mtime_ns} ino={st.st_ino}")

    @classmethod
    def for_files(cls, directory: str | os.PathLike[str], files: list[Path]) -> DataSource:
        digest = hashlib.sha256()
        for f in files:
            st = f.stat()
            digest.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return cls(
            Path(directory).resolve(),
            f"files n={len(files)} {digest.hexdigest()}",
            files=tuple(Path(f) for f in files),
        )

    @property
    def cache_path(self) -> Path:
        """The sizes cache beside the data: ``data.h5.autoloader-sizes.npz`` (for a
        part: ``data.h5.PART.autoloader-sizes.npz``) or ``DIR/.autoloader-sizes.npz``."""
        suffix = f".{self.part}" if self.part else ""
        if self.url:
            return self.fallback_cache_path
        if self.path.is_dir():
            return self.path / f".autoloader-sizes{suffix}.npz"
        return self.path.with_name(f"{self.path.name}{suffix}.autoloader-sizes.npz")

    @property
    def fallback_cache_path(self) -> Path:
        """Where the cache goes when the data's directory is read-only."""
        base = user_cache_dir() / "autoloader"
        where = self.url or str(self.path)
        key = hashlib.sha256(os.fsencode(f"{where}#{self.part}")).hexdigest()[:24]
        return base / f"sizes-{key}.npz"


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``; with no home at all (``HOME`` unset and a
    uid without a passwd entry, as OpenShift and Kubernetes run containers), a directory
    of this uid under the system's temporary directory."""
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"])
    try:
        return Path.home() / ".cache"
    except (RuntimeError, KeyError):
        import tempfile

        return Path(tempfile.gettempdir()) / f"autoloader-cache-{os.getuid()}"
