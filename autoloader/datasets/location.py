"""Where a dataset's file lives: a local path or a URL read through fsspec.

``root://HOST[:PORT]//PATH`` (XRootD, extra ``[xrootd]``), ``http(s)://HOST/PATH`` (extra
``[http]``) and any other protocol fsspec has installed (``s3://`` with s3fs) are a
``Location``; a plain path stays a path. This module owns everything a remote file needs:
the filesystem with its timeouts, opening a file object that reads in blocks, a stamp
from what the protocol says cheaply (size, modification time, a checksum where the
server has one), globbing where the protocol lists directories, and refusing a URL
where only a local file will do (``require_local``). Every request goes through
``autoloader.datasets.failures.retrying``: its bounds, retries and one-line errors.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import logging
import os
import re
import time
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from autoloader.compat import fsspec_xrootd as compat_fsspec_xrootd
from autoloader.datasets.failures import (  # noqa: F401 - also named here
    RETRIES,
    SourceError,
    SourceOptions,
    failure,
    retrying,
    transient,
)
from autoloader.datasets.remote_file import KNOWN, RemoteFile  # noqa: F401 - also named here
from autoloader.errors import DatasetError
from autoloader.redact import redact

log = logging.getLogger("autoloader")

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_GLOB = re.compile(r"[*?\[]")
# protocol -> (extra, modules it needs)
_EXTRAS = {
    "root": ("xrootd", ("fsspec", "fsspec_xrootd", "XRootD")),
    "http": ("http", ("fsspec", "aiohttp")),
    "https": ("http", ("fsspec", "aiohttp")),
}
_DEFAULT_PORTS = {"root": 1094, "http": 80, "https": 443}


@dataclass(frozen=True)
class Location:
    """A file or directory behind a URL: ``url`` as given (without ``#``/``?`` parts), for
    the connection; its text (``str``, ``repr``, ``shown``) never holds the user-info's
    password (``autoloader.redact``): a message or a key made of it can be written."""

    url: str
    protocol: str
    host: str  # without the user-info
    port: int | None
    path: str  # what the protocol's filesystem calls it
    userinfo: str = field(default="", repr=False, compare=False)

    def __str__(self) -> str:
        return self.shown

    def __repr__(self) -> str:
        return f"Location({self.shown!r})"

    @property
    def shown(self) -> str:
        """The URL as it is written and printed: ``user:****@`` for its user-info."""
        return redact(self.url)

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        name = self.name
        return name[name.rfind(".") :].lower() if "." in name else ""

    @property
    def server(self) -> str:
        """``host:port`` as the messages name it."""
        port = self.port or _DEFAULT_PORTS.get(self.protocol)
        return f"{self.host}:{port}" if port else self.host or self.protocol

    def has_glob(self) -> bool:
        return bool(_GLOB.search(self.path))


def is_url(text: str | os.PathLike[str] | Location) -> bool:
    """Whether ``text`` is a URL (``PROTOCOL://...``) rather than a local path."""
    if isinstance(text, Location):
        return True
    return isinstance(text, str) and bool(_URL.match(text)) and not text.startswith("file://")


def parse_url(text: str) -> Location:
    """The location a URL names.

    Raises:
        DatasetError: a protocol fsspec does not know, or a URL without a path.
    """
    protocol = _URL.match(text).group(1).lower()  # type: ignore[union-attr]
    parts = urlsplit(text)
    if protocol == "root":
        # root://HOST[:PORT]//PATH: the path after the host keeps its leading slash
        rest = text[len("root://") :]
        host_port, _, path = rest.partition("/")
        path = "/" + path.lstrip("/") if path else ""
    else:
        host_port, path = parts.netloc, parts.path
    userinfo, _, host_port = host_port.rpartition("@")
    host, _, port_text = host_port.rpartition(":") if ":" in host_port else (host_port, "", "")
    try:
        port = int(port_text) if port_text else None
    except ValueError:
        raise DatasetError(f"DATASET '{text}': port {port_text!r} is not a number") from None
    if not path or path == "/":
        raise DatasetError(f"DATASET '{text}': the URL names no file")
    _require_protocol(protocol, text)
    if protocol in ("http", "https"):
        path = text  # fsspec's HTTP filesystem names files by their whole URL
    return Location(text, protocol, host, port, path, userinfo)


def require_local(spec: str, what: str, why: str) -> None:
    """Refuse a URL where only a local file will do.

    Raises:
        DatasetError: naming the spec, ``what`` cannot be read remotely and ``why``.
    """
    if is_url(spec):
        raise DatasetError(
            f"DATASET '{spec}': {what} cannot be read from a server ({why}): copy it to "
            "local disk and name the copy"
        )


def _require_protocol(protocol: str, text: str) -> None:
    extra, modules = _EXTRAS.get(protocol, ("", ("fsspec",)))
    if protocol == "root":
        os.environ.setdefault("XRD_RUNFORKHANDLER", "1")  # before the client first starts
    for module in modules:
        try:
            __import__(module)
        except ImportError:
            how = f"pip install 'torch-autoloader[{extra}]'" if extra else "install fsspec"
            raise DatasetError(
                f"DATASET '{text}': reading {protocol}:// needs {module} "
                f"(the [{extra or 'http'}] extra): {how}"
            ) from None
    import fsspec

    if protocol not in fsspec.available_protocols():
        raise DatasetError(
            f"DATASET '{text}': unknown protocol {protocol!r}: expected root://, http(s):// "
            "or another installed fsspec protocol"
        )


_FILESYSTEMS: dict[tuple[int, str, str, str, int | None, SourceOptions], Any] = {}


def filesystem(location: Location, options: SourceOptions | None = None) -> Any:
    """The fsspec filesystem of ``location``'s server, with the timeouts of ``options``;
    one per process and server (a forked worker makes its own)."""
    options = options or SourceOptions.from_environment()
    key = (os.getpid(), location.protocol, location.userinfo, location.host, location.port, options)
    found = _FILESYSTEMS.get(key)
    if found is not None:
        return found
    import fsspec

    kwargs: dict[str, Any] = {"skip_instance_cache": True}
    if location.protocol == "root":
        _xrootd_environment(options)
        kwargs["hostid"] = location.url[len("root://") :].partition("/")[0]
        # the server named (or its redirector) chooses the data server, as XRootD's own
        # client does; locating every source first costs requests and hid errors
        kwargs["locate_all_sources"] = False
        kwargs["timeout"] = max(1, round(options.read_timeout))
    elif location.protocol in ("http", "https"):
        import aiohttp

        kwargs["client_kwargs"] = {
            "timeout": aiohttp.ClientTimeout(
                total=None, sock_connect=options.connect_timeout, sock_read=options.read_timeout
            )
        }
    fs = fsspec.filesystem(location.protocol, **kwargs)
    if location.protocol == "root":
        _pruned_quietly(fs)
    _FILESYSTEMS[key] = fs
    return fs


def _pruned_quietly(fs: Any) -> None:
    """Let fsspec-xrootd's pruner (a task on fsspec's loop that closes the file handles it
    kept and nobody used for 30 s) survive a close the server or client refuses
    ("Invalid operation"): the handle leaves its cache before the close is sent, so
    nothing is lost, but the exception ended the task, and asyncio printed it at exit."""
    cache = compat_fsspec_xrootd.handle_cache(fs)
    close = compat_fsspec_xrootd.cache_close(cache)
    if close is None:
        return
    owner = weakref.ref(cache)  # no cycle through the cache: it goes as it went before

    async def close_or_drop(url: str, timeout: int) -> None:
        kept = owner()
        if kept is None:
            return
        try:
            await close(kept, url, timeout)
        except OSError as exc:
            log.debug("a kept XRootD handle did not close: %s", redact(str(exc)))

    compat_fsspec_xrootd.set_cache_close(cache, close_or_drop)


_QUIET_EXIT: list[bool] = []


def _xrootd_environment(options: SourceOptions) -> None:
    """Give XRootD's client the bounds of ``options``: a server that is down costs
    ``connect_timeout`` per try, not its default of minutes of reconnection attempts.
    ``XRD_RUNFORKHANDLER`` (read when the client starts) lets forked workers use it."""
    os.environ.setdefault("XRD_RUNFORKHANDLER", "1")
    from XRootD import client

    if not _QUIET_EXIT:
        # XRootD's exit hook (registered as it was imported) tests the type of every live
        # object, torch's deprecated reduce_op among them, which then warns on stderr as
        # the command ends; exit hooks run last-registered first, so these run before
        atexit.register(
            warnings.filterwarnings, "ignore", category=FutureWarning, module=r"XRootD\."
        )
        atexit.register(_close_files_at_exit)
        _QUIET_EXIT.append(True)
    client.EnvPutInt("ConnectionWindow", max(1, round(options.connect_timeout)))
    client.EnvPutInt("ConnectionRetry", 1)
    client.EnvPutInt("RequestTimeout", max(1, round(options.read_timeout)))
    client.EnvPutInt("StreamTimeout", max(1, round(options.read_timeout)))
    client.EnvPutInt("TimeoutResolution", 1)  # its default checks every 15 s
    # its default (1800 s) fails every request to a server whose connection dropped with
    # that error, without connecting again: a retry could never see the server come back
    client.EnvPutInt("StreamErrorWindow", 0)


CLOSE_AT_EXIT_SECONDS = 1.0  # the most an exit waits for servers to answer its closes


def _close_files_at_exit() -> None:
    """Send every open XRootD file's close, and wait for the answers
    ``CLOSE_AT_EXIT_SECONDS`` at most in all. XRootD's own exit hook, which runs after
    this one, closes each file still open and waits for its answer up to the request
    timeout: a stalled server would hold the process's exit (a Ctrl-C's too) that long
    for each file the process had open. A close sent is not open any more to it; nor
    to fsspec-xrootd's handle cache, whose own exit hook would close it again and print
    the error of a close in progress."""
    import gc
    import threading

    from XRootD.client import File

    caches: tuple[type, ...] = ()  # fsspec-xrootd's handle caches close their files again
    with contextlib.suppress(ImportError):
        from fsspec_xrootd.xrootd import ReadonlyFileHandleCache

        caches = (ReadonlyFileHandleCache,)
    answered = threading.Semaphore(0)
    sent = 0
    with warnings.catch_warnings():  # isinstance on torch's deprecated reduce_op warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            with contextlib.suppress(Exception):
                if isinstance(obj, caches):
                    # its handles are Files: closed here
                    compat_fsspec_xrootd.drop_kept_handles(obj)
                    _stop_pruner(obj)
                elif isinstance(obj, File) and obj.is_open():
                    obj.close(callback=lambda *_: answered.release())
                    sent += 1
    deadline = time.monotonic() + CLOSE_AT_EXIT_SECONDS
    for _ in range(sent):
        if not answered.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break


def _stop_pruner(cache: Any) -> None:
    """Cancel fsspec-xrootd's pruner task of ``cache`` on its loop (fsspec's thread, which
    outlives this hook): it never calls XRootD's client after the client's threads stop,
    and an exception it ended with is taken, not printed as the interpreter ends."""
    task = compat_fsspec_xrootd.pruner(cache)
    if task is None:
        return
    if task.done():
        if not task.cancelled():
            task.exception()
        return
    with contextlib.suppress(RuntimeError):  # its loop closed: nothing runs it again
        cache.loop.call_soon_threadsafe(task.cancel)


def fsspec_options(location: Location) -> dict[str, Any]:
    """Keyword arguments for ``fsspec.open`` (what uproot passes through) that give a
    library's own opening the timeouts of this module."""
    options = SourceOptions.from_environment()
    if location.protocol == "root":
        _xrootd_environment(options)
        return {"timeout": max(1, round(options.read_timeout))}
    if location.protocol in ("http", "https"):
        import aiohttp

        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=options.connect_timeout, sock_read=options.read_timeout
        )
        return {"client_kwargs": {"timeout": timeout}}
    return {}


def info(location: Location, doing: str = "asking for its size") -> dict[str, Any]:
    """What the server says of the file: size, and a modification time or checksum where
    it has one (one metadata request); ``doing``: what a failure says was being done."""
    fs = filesystem(location)
    # the server's answer now, not a listing a glob left in fsspec's directory cache (its
    # names need not match the path, and it would not see the file change)
    with contextlib.suppress(Exception):
        fs.dircache.clear()
    return retrying(location, doing, lambda: fs.info(location.path))


def forget(location: Location) -> None:
    """Drop what this process's filesystem keeps of the file: fsspec-xrootd's open handle
    (which reads the file the server opened, replaced or not) and listings. For a file
    that changed on the server: the next read opens it anew."""
    with contextlib.suppress(Exception):
        filesystem(location).invalidate_cache(location.path)


def stamp(location: Location) -> str:
    """A stamp that changes when the remote file does: its size with its modification
    time, its ETag or a checksum, whichever the server gives."""
    found = info(location)
    size = found.get("size")
    parts = [f"url {location.shown}", f"size={size}"]
    for key in ("mtime", "modified", "LastModified", "last_modified", "ETag", "etag", "checksum"):
        value = found.get(key)
        if value is not None:
            parts.append(f"{key}={value}")
    if size is None:
        raise SourceError(
            f"DATASET '{location.url}': {location.server} does not say the file's size: "
            "expected a server that answers size requests (HEAD or stat)"
        )
    return " ".join(parts)


def glob(location: Location) -> list[Location]:
    """The files a URL whose file name has ``*``/``?``/``[`` matches, sorted, where the
    protocol lists directories (a pattern in the name, not in a directory above it);
    ``[location]`` for a URL without.

    Raises:
        DatasetError: the protocol cannot list, or nothing matches.
    """
    if not location.has_glob():
        return [location]
    head, _, pattern = location.url.rpartition("/")
    if _GLOB.search(head):
        raise DatasetError(
            f"DATASET '{location.url}': expected a pattern in the file name only, found one "
            "in a directory"
        )
    directory = location.path.rpartition("/")[0] or "/"
    fs = filesystem(location)
    try:
        listed = retrying(location, "listing files", lambda: _listing(fs, directory))
    except NotImplementedError:
        raise DatasetError(
            f"DATASET '{location.url}': {location.protocol}:// cannot list directories: name "
            "each file"
        ) from None
    names = sorted({str(n).rstrip("/").rsplit("/", 1)[-1] for n in listed})
    found = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
    if not found:
        raise DatasetError(f"DATASET '{location.url}': the pattern matches no files")
    return [parse_url(f"{head}/{n}") for n in found]


def _listing(fs: Any, directory: str) -> list[str]:
    """The names in ``directory`` as the server says now, leaving no listing in fsspec's
    directory cache: fsspec-xrootd caches the top directory ``/`` under its own name but
    its entries as ``//NAME``, and reads it back as neither, so a second ``ls('/')``, or
    ``info`` of a file there while the listing is kept, raised ``FileNotFoundError('/')``
    (a glob at a server's top directory said "no such file")."""
    with contextlib.suppress(Exception):
        fs.dircache.clear()
    try:
        return list(fs.ls(directory, detail=False))
    finally:
        with contextlib.suppress(Exception):
            fs.dircache.clear()


def open_input(
    location: Location, block_size: int | None = None, known: Mapping[str, Any] | None = None
) -> RemoteFile:
    """A binary file object over ``location`` for libraries that read through one (h5py,
    pyarrow): each miss reads ``block_size`` bytes in one request, and what it fetched is
    kept for every later opening in this process (``remote_file.KNOWN``), so small reads
    of metadata cost one request per block per process, not one per read or per opening;
    reads are retried (``retrying``). ``known``: what the server said of the file when
    the dataset was opened (``info``), where a worker opens it again; without it the
    server is asked (one metadata request), so a file changed since is read anew."""
    fs = filesystem(location)
    said = known if known is not None else info(location, "opening")
    return RemoteFile(location, fs, said, block_size or BLOCK_BYTES)


BLOCK_BYTES = 4 * 2**20  # one request's bytes where a library reads through a file object
# one request's bytes for a footer (Parquet's) where the data's blocks are read by hold():
# the footer is read once, from the end, in one request, not BLOCK_BYTES of the payload
FOOTER_BLOCK_BYTES = 256 * 2**10
# one request's bytes for metadata that sits between the data (HDF5's object headers and
# chunk index nodes): small, so that opening or a chunk lookup fetches little payload
METADATA_BLOCK_BYTES = 64 * 2**10


def local_or_location(text: str | os.PathLike[str]) -> Path | Location:
    """A path, or the location of a URL."""
    return parse_url(str(text)) if is_url(str(text)) else Path(text)
