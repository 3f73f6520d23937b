"""Each NuGraph event's bytes from metadata alone, read by several processes at once.

An event's size is its compound itemsize, read from the dataset's header: from the
header's bytes where it is the version 1 layout h5py writes (about 8 us an event), else
by HDF5 opening the dataset (about 60 us: the paper's 300,396 events, 18 s). Here the
names are cut into contiguous slices, one per CPU, each read by a fresh interpreter:
``python -m autoloader_plugins.nugraph_sizes FILE NAMES START STOP``, NAMES a file of
NUL-separated event names, prints the sizes of its slice as little-endian int64. Fresh,
not forked: the caller may already hold CUDA or autograd state, and a fresh interpreter
never re-runs the user's script. A child that fails for any reason other than a bad
file leaves its slice to this process.

Only h5py and numpy are imported here, so a child starts in about 0.2 s.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from autoloader.datasets.location import Location
from autoloader.errors import DatasetError
from autoloader.host import usable_cpus
from autoloader_plugins.h5file import h5_file

log = logging.getLogger(__name__)

EVENTS_PER_PROCESS = 20_000  # fewer per process and starting it costs more than it saves
_BAD_FILE = 2  # a child's exit status for a DatasetError, whose message is on its stderr


def itemsizes(path: Path | Location, names: list[str], processes: int | None = None) -> np.ndarray:
    """Each event's compound itemsize, in ``names`` order.

    Args:
        path: the ``.h5`` file.
        names: event names under its ``dataset`` group.
        processes: how many processes read; default one per usable CPU, and one per
            ``EVENTS_PER_PROCESS`` events at most.
    """
    if processes is None:
        processes = min(usable_cpus(), len(names) // EVENTS_PER_PROCESS)
    if processes <= 1 or isinstance(path, Location):  # a URL: one reader, blocks cached
        return read_itemsizes(path, names)
    log.info("reading the sizes of %d events from metadata in %d processes", len(names), processes)
    bounds = np.linspace(0, len(names), processes + 1).astype(int).tolist()
    children: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="autoloader-sizes-") as tmp:
        listing = Path(tmp) / "names"
        listing.write_bytes(b"\0".join(n.encode() for n in names))
        try:
            for start, stop in itertools.pairwise(bounds):
                argv = [str(path), str(listing), str(start), str(stop)]
                try:
                    children.append(
                        subprocess.Popen(
                            [sys.executable, "-m", __name__, *argv],
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                        )
                    )
                except OSError as exc:
                    log.warning("autoloader: cannot start a size reader (%s); reading here", exc)
                    return read_itemsizes(path, names)
            parts = [
                _collect(child, path, names[start:stop])
                for child, (start, stop) in zip(children, itertools.pairwise(bounds), strict=True)
            ]
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
    return np.concatenate(parts)


def read_itemsizes(path: Path | Location, names: list[str]) -> np.ndarray:
    """Each event's compound itemsize, read in this process.

    An event's datatype is read from its object header's bytes where the header is the
    plain layout h5py writes by default (a version 1 header whose datatype message is
    not shared, continuation blocks followed): HDF5's own opening of a dataset decodes
    the whole compound type, 85% of the pass (18,000 events: 1.1 s of CPU, 0.15 s so).
    The first event of each member count, and any event whose header is laid out
    otherwise, is opened by HDF5 (its class and its fields' names checked: every
    field is checked again when an event is read); where the first event's header and
    HDF5 disagree, every event is opened by HDF5. A file behind a URL is opened by HDF5
    event by event: its header bytes are not fetched apart.
    """
    with h5_file(path) as f, contextlib.ExitStack() as stack:
        raw = None if isinstance(path, Location) else stack.enter_context(open(path, "rb"))
        events = h5py.h5g.open(f.id, b"dataset")
        base = int(f.userblock_size)
        out = np.empty(len(names), dtype=np.int64)
        checked: set[int] = set()  # member counts of events opened by HDF5, fields checked
        trusted = raw is not None
        for i, name in enumerate(names):
            key = name.encode()
            found = _from_header(raw.fileno(), events, key, base) if raw and trusted else None
            if found is not None and found[1] in checked:
                out[i] = found[0]
                continue
            size, members = _opened(path, events, name, key, checked)
            if i == 0:
                trusted = found == (size, members)
            checked.add(members)
            out[i] = size
        return out


def _opened(
    path: Path | Location, events: h5py.h5g.GroupID, name: str, key: bytes, checked: set[int]
) -> tuple[int, int]:
    """(itemsize, member count) of an event opened by HDF5: a compound, whose fields are
    named store/attr (checked where its member count is not among ``checked``)."""
    # The type's class and size only: building its numpy dtype costs 8x more.
    try:
        event = h5py.h5d.open(events, key)
    except KeyError:
        raise DatasetError(f"DATASET '{path}': event {name!r} is missing") from None
    kind = event.get_type()
    if kind.get_class() != h5py.h5t.COMPOUND:
        raise DatasetError(not_compound(path, name, event))
    members = int(kind.get_nmembers())
    if members not in checked:
        check_fields(path, name, kind)
    return int(kind.get_size()), members


_V1_PREFIX = 16  # version, reserved, messages (2), references (4), header size (4), padding
_DATATYPE, _CONTINUATION, _SHARED, _COMPOUND = 0x0003, 0x0010, 0x02, 6
_MAX_CHUNKS = 4  # continuation blocks followed before HDF5 opens the event instead
_HEAD_READ = 512  # most headers of an event are shorter: one read


def _from_header(
    fd: int, events: h5py.h5g.GroupID, key: bytes, base: int
) -> tuple[int, int] | None:
    """(itemsize, member count) from the event's object header bytes (HDF5 file format,
    version 1 object header: the datatype message's size and, for a compound, its member
    count in the class bit field), following continuation blocks; None where the header
    is anything else (a version 2 header, a shared datatype, a soft link)."""
    try:
        info = events.links.get_info(key)
    except KeyError:
        return None
    if info.type != h5py.h5l.TYPE_HARD:
        return None
    at = base + int(info.u)
    head = os.pread(fd, _HEAD_READ, at)
    if len(head) < _V1_PREFIX or head[0] != 1:
        return None
    end = _V1_PREFIX + struct.unpack_from("<I", head, 8)[0]
    if end > len(head):
        head = os.pread(fd, end, at)
    chunks = [(head, _V1_PREFIX, end)]
    for _ in range(_MAX_CHUNKS):
        if not chunks:
            break
        data, pos, stop = chunks.pop(0)
        if len(data) < stop:
            return None
        while pos + 8 <= stop:
            kind, size, flags = struct.unpack_from("<HHB", data, pos)
            if kind == _DATATYPE:
                if flags & _SHARED or pos + 16 > stop or data[pos + 8] & 0x0F != _COMPOUND:
                    return None
                members = int.from_bytes(data[pos + 9 : pos + 11], "little")
                return struct.unpack_from("<I", data, pos + 12)[0], members
            if kind == _CONTINUATION and size >= 16:
                offset, length = struct.unpack_from("<QQ", data, pos + 8)
                chunks.append((os.pread(fd, length, base + offset), 0, length))
            pos += 8 + size
    return None


def check_fields(path: Path | Location, name: str, kind: h5py.h5t.TypeCompoundID) -> None:
    """Each field of an event's compound type is named ``store/attr``."""
    for k in range(kind.get_nmembers()):
        check_field(path, name, kind.get_member_name(k).decode(errors="replace"))


def check_field(path: Path | Location, name: str, field: str) -> None:
    """A field name is ``store/attr``: a node or edge store, and one of its attributes."""
    parts = field.split("/")
    if len(parts) != 2 or not all(parts):
        raise DatasetError(
            f"DATASET '{path}': event {name!r}: field {field!r}: expected a name "
            "'store/attr' (node store u, edge store u_plane_u, ...)"
        )


def not_compound(path: Path | Location, name: str, event: h5py.h5d.DatasetID) -> str:
    """The error for an event that is not a scalar of a compound dtype."""
    return (
        f"DATASET '{path}': event {name!r}: expected a scalar of a compound dtype "
        f"(fields named store/attr), found a dataset of {event.dtype} with shape {event.shape}"
    )


def _collect(child: subprocess.Popen[bytes], path: Path, names: list[str]) -> np.ndarray:
    out, err = child.communicate()
    message = err.decode(errors="replace").strip()
    if child.returncode == _BAD_FILE and message:
        raise DatasetError(message)
    sizes = np.frombuffer(out, dtype="<i8")
    if child.returncode == 0 and len(sizes) == len(names):
        return sizes.astype(np.int64)
    log.warning(
        "autoloader: a size reader for %s failed (exit status %s%s); reading its %d events here",
        path,
        child.returncode,
        f": {message.splitlines()[-1]}" if message else "",
        len(names),
    )
    return read_itemsizes(path, names)


def _main() -> int:
    path, listing = Path(sys.argv[1]), Path(sys.argv[2])
    start, stop = int(sys.argv[3]), int(sys.argv[4])
    names = listing.read_bytes().decode().split("\0")[start:stop]
    try:
        sizes = read_itemsizes(path, names)
    except DatasetError as exc:
        print(exc, file=sys.stderr)
        return _BAD_FILE
    sys.stdout.buffer.write(sizes.astype("<i8").tobytes())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
