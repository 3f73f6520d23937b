"""Each NuGraph event's bytes from metadata alone, read by several processes at once.

An event's size is its compound itemsize, read from the dataset's header. HDF5 takes about
0.1 ms to open a header, so the paper's 300,396 events take 30 s in one process. Here the
names are cut into contiguous slices, one per CPU, each read by a fresh interpreter:
``python -m autoloader_plugins.nugraph_sizes FILE NAMES START STOP``, NAMES a file of
NUL-separated event names, prints the sizes of its slice as little-endian int64. Fresh,
not forked: the caller may already hold CUDA or autograd state, and a fresh interpreter
never re-runs the user's script. A child that fails for any reason other than a bad
file leaves its slice to this process.

Only h5py and numpy are imported here, so a child starts in about 0.2 s.
"""

from __future__ import annotations

import itertools
import logging
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
    """Each event's compound itemsize, read in this process."""
    with h5_file(path) as f:
        events = h5py.h5g.open(f.id, b"dataset")
        out = np.empty(len(names), dtype=np.int64)
        layout: tuple[int, bytes] | None = None  # the first event's member count and name
        for i, name in enumerate(names):
            # The type's class and size only: building its numpy dtype costs 8x more.
            try:
                event = h5py.h5d.open(events, name.encode())
            except KeyError:
                raise DatasetError(f"DATASET '{path}': event {name!r} is missing") from None
            kind = event.get_type()
            if kind.get_class() != h5py.h5t.COMPOUND:
                raise DatasetError(not_compound(path, name, event))
            # Every field of the first event, and of any event laid out otherwise, must be
            # store/attr; two calls an event keep this within the noise of the pass.
            mine = (kind.get_nmembers(), kind.get_member_name(0) if kind.get_nmembers() else b"")
            if mine != layout:
                check_fields(path, name, kind)
                layout = layout or mine
            out[i] = kind.get_size()
        return out


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
