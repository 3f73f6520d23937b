"""What a dataset can tell autoloader about itself without loading samples.

A dataset class may define, all optional:

``autoloader_sizes(self) -> numpy.ndarray``
    bytes per sample computed without loading samples (from shapes, file sizes...).
``autoloader_source(self) -> DataSource``
    where the data lives and a stamp that changes when it changes, so that measured sizes
    can be cached beside the data and invalidated.
``autoloader_refresh(self) -> bool``
    the dataset as its files are now: whether one changed since it was opened and is read
    anew (its events as many and as large as before); a ``DatasetError`` naming the file
    where its events differ. ``autoloader.DataLoader`` calls it as each epoch begins, so an
    epoch never serves a changed file's events from what the old one left in memory, and
    ends workers it keeps between epochs where it returns True.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def dataset_files(dataset: Any) -> list[tuple[Path, str]]:
    """The files a dataset reads or keeps beside it (its data and its size caches), each
    with what it is: outputs must never replace them. A dataset of several files names
    each (a plan beside them is no input); one that does not names its directory."""
    source = getattr(dataset, "autoloader_source", None)
    if not callable(source):
        return []
    try:
        found = source()
    except Exception:  # a dataset that cannot say where it lives has nothing to protect
        return []
    if found.url:  # nothing of it on this host but its size cache
        return [(Path(found.fallback_cache_path), "the dataset's size cache")]
    data = [(Path(f), "a file of the dataset") for f in found.files]
    return [
        *(data or [(Path(found.path), "the dataset")]),
        (Path(found.cache_path), "the dataset's size cache"),
        (Path(found.fallback_cache_path), "the dataset's size cache"),
    ]
