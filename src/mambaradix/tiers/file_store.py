"""The default L3 store: one file per object in a directory, durable across restarts.

A put writes the framed bundle to a temp file in the same directory, fsyncs it, renames it
over ``{object name}.bin`` and fsyncs the directory: after a crash at any point the name
holds the previous complete file or the new complete file (rename is atomic on POSIX), and an
acknowledged put survives a power loss. A reader that opened the old file keeps reading it
whole. File names equal SGLang HiCacheFile's (``keys.py``); the contents are our frame
(``bundle.py``), not upstream's raw tensor bytes.

Temp files are ``.{host}.{pid}.{random}.tmp``: opening the store removes those left by dead
processes of this host. `capacity_bytes` bounds the ``.bin`` bytes in the directory as this
object sees them (counted at open, then its own puts and deletes): a put past it is refused
(counted), as is one that hits ENOSPC/EDQUOT.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import uuid
from typing import Any

import numpy as np

from mambaradix.tiers.bundle import DIGEST_BYTES, BytesLike, body_hasher
from mambaradix.tiers.keys import Namespace
from mambaradix.tiers.store import Blob, BlobStore, StoreError, StoreUnavailable

_FULL = (errno.ENOSPC, errno.EDQUOT)
_EXT = ".bin"
_TMP = ".tmp"
_CHUNK = 4 << 20  # read and hash this much at a time


class FileStore(BlobStore):
    """`Store` in a local (or shared POSIX) directory; see the module docstring."""

    def __init__(
        self, root: str | os.PathLike[str], namespace: Namespace, *,
        capacity_bytes: int | None = None,
    ) -> None:
        super().__init__(namespace)
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path, got {type(root).__name__}")
        if capacity_bytes is not None and (
            isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int)
            or capacity_bytes < 0
        ):
            raise ValueError(f"capacity_bytes must be None or an int >= 0, got {capacity_bytes!r}")
        self._root = os.fspath(root)
        self._capacity = capacity_bytes
        self._host = socket.gethostname().replace("/", "-")
        try:
            os.makedirs(self._root, exist_ok=True)
            self._dir_fd: int | None = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise StoreUnavailable(f"file store at {self._root!r} cannot be opened: {e}") from None
        self._used = self._recover()

    @property
    def root(self) -> str:
        return self._root

    @property
    def used_bytes(self) -> int:
        """Bytes of ``.bin`` files in the directory, as this object counts them."""
        return self._used

    def close(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    # ------------------------------------------------------------------ primitives

    def _write(self, name: str, chunks: list[BytesLike], nbytes: int) -> bool:
        dir_fd = self._fd()
        path = self._path(name)
        old = _size(path)
        if self._capacity is not None and self._used - old + nbytes > self._capacity:
            return False
        tmp = os.path.join(self._root, f".{self._host}.{os.getpid()}.{uuid.uuid4().hex}{_TMP}")
        try:
            _write_file(tmp, chunks)
            os.replace(tmp, path)
        except BaseException as e:
            _unlink(tmp)
            if isinstance(e, OSError) and e.errno in _FULL:
                return False
            if isinstance(e, OSError):
                raise StoreError(f"file store {self._root!r}: writing {name}: {e}") from None
            raise
        os.fsync(dir_fd)  # the rename itself survives a crash
        self._used += nbytes - old
        return True

    def _read(self, name: str) -> Blob | None:
        self._fd()
        try:
            fd = os.open(self._path(name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"file store {self._root!r}: reading {name}: {e}") from None
        try:
            st = os.fstat(fd)
            data, digest = _read_hashed(fd, st.st_size)
        finally:
            os.close(fd)
        return Blob(data, (st.st_dev, st.st_ino), digest)

    def _exists(self, names: list[str]) -> list[bool]:
        self._fd()
        return [os.path.isfile(self._path(n)) for n in names]

    def _delete(self, names: list[str]) -> int:
        self._fd()
        return sum(self._unlink_object(n, None) for n in names)

    def _discard(self, name: str, token: Any) -> None:
        self._unlink_object(name, token)

    # ------------------------------------------------------------------ helpers

    def _path(self, name: str) -> str:
        return os.path.join(self._root, name + _EXT)

    def _fd(self) -> int:
        if self._dir_fd is None:
            raise StoreUnavailable(f"file store at {self._root!r} is closed")
        return self._dir_fd

    def _unlink_object(self, name: str, version: Any) -> bool:
        """Unlink `name` (only the file `version` = (dev, inode) names, when given)."""
        path = self._path(name)
        try:
            st = os.stat(path)
            if version is not None and (st.st_dev, st.st_ino) != version:
                return False  # replaced by a new put since it was read: keep it
            os.unlink(path)
        except FileNotFoundError:
            return False
        self._used -= st.st_size
        return True

    def _recover(self) -> int:
        """Remove temp files of dead local writers; return the ``.bin`` bytes present."""
        used = 0
        with os.scandir(self._root) as entries:
            for entry in entries:
                if entry.name.endswith(_EXT) and entry.is_file(follow_symlinks=False):
                    used += entry.stat().st_size
                elif entry.name.endswith(_TMP) and self._orphan(entry.name):
                    _unlink(entry.path)
        return used

    def _orphan(self, tmp_name: str) -> bool:
        host, _, rest = tmp_name[1 : -len(_TMP)].rpartition(".")[0].rpartition(".")
        if host != self._host or not rest.isdigit():
            return False
        return not _alive(int(rest))

    def check_invariants(self) -> None:
        """Raise AssertionError unless the byte count matches the directory and no temp file
        of this process is left. Valid while this object is the directory's only writer."""
        on_disk, mine = 0, f".{self._host}.{os.getpid()}."
        with os.scandir(self._root) as entries:
            for entry in entries:
                if entry.name.endswith(_EXT):
                    on_disk += entry.stat().st_size
                if entry.name.startswith(mine) and entry.name.endswith(_TMP):
                    raise AssertionError(f"temp file left behind: {entry.name}")
        if on_disk != self._used:
            raise AssertionError(f"used_bytes {self._used} != {on_disk} on disk")


def _write_file(path: str, chunks: list[BytesLike]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view.nbytes:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_hashed(fd: int, size: int) -> tuple[memoryview, bytes | None]:
    """Up to `size` bytes of `fd` (fewer at EOF) and the checksum of all but the last
    `DIGEST_BYTES`, hashed chunk by chunk while each chunk is still in the CPU cache
    (None when the read was cut short).
    The buffer is not zero-filled first (numpy.empty): zeroing 100 MB costs as much as
    the checksum."""
    view = np.empty(size, np.uint8).data
    body, hasher, got = size - DIGEST_BYTES, body_hasher(), 0
    while got < size:
        n = os.readv(fd, [view[got : got + _CHUNK]])
        if n == 0:
            break  # shorter than at open: the frame check rejects it
        if got < body:
            hasher.update(view[got : min(got + n, body)])
        got += n
    if got < size:  # cut short: let decode hash exactly what was read
        return view[:got], None
    return view, hasher.digest()


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
