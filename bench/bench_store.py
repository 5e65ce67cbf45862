"""FileStore put/get of one large state vs a plain write + fsync + rename / a plain read.

    .venv/bin/python bench/bench_store.py [--mb 100 --repeats 7 --dir DIR --cold]

One process, one directory, the same bytes, the runs interleaved (their order alternates per
repeat), medians of `--repeats`:

* put:   `FileStore.put` of a state bundle (conv 2 MB + ssm the rest: frame, xxh3 checksum,
         temp file, fsync, rename, directory fsync) vs `open(tmp, "wb").write(data)`, fsync,
         `os.replace` of the same bytes as one buffer;
* get:   `FileStore.get` (read into one buffer, checksum and name verified, views of the
         parts) vs `open(path, "rb").read()` of the plain file, and vs `readinto` a
         preallocated bytearray (the fastest plain read, for reference).

Reads come from the page cache unless `--cold` (drops the kernel caches before each read;
needs root). Target (issue 17): put <= 1.5x plain, get <= 1.5x plain read.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mambaradix.tiers import MAMBA, FileStore, Namespace, ObjectKey, page_hashes  # noqa: E402

TARGET = 1.5


def plain_put(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def plain_read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def plain_readinto(path: str) -> bytearray:
    buf = bytearray(os.path.getsize(path))
    with open(path, "rb", buffering=0) as f:
        f.readinto(buf)
    return buf


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(fn: Callable[[], object], cold: bool) -> float:
    if cold:
        drop_caches()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=100, help="state size in MB (default 100)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir in /tmp)")
    ap.add_argument("--cold", action="store_true", help="drop kernel caches before reads")
    args = ap.parse_args()
    if args.mb < 1 or args.repeats < 1:
        ap.error("--mb and --repeats must be >= 1")

    root = tempfile.mkdtemp(prefix="bench-store-", dir=args.dir)
    try:
        run(root, args.mb << 20, args.repeats, args.cold)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: str, nbytes: int, repeats: int, cold: bool) -> None:
    data = os.urandom(nbytes)
    view = memoryview(data)
    parts = {"conv": view[: 2 << 20], "ssm": view[2 << 20 :]}
    store = FileStore(os.path.join(root, "store"), Namespace("bench/model"))
    key = ObjectKey(page_hashes(list(range(16)), 16)[0], MAMBA)
    plain = os.path.join(root, "plain.bin")
    ops = {
        "put plain": lambda: plain_put(plain, data),
        "put store": lambda: store.put([(key, parts)]),
        "get plain read()": lambda: plain_read(plain),
        "get plain readinto": lambda: plain_readinto(plain),
        "get store": lambda: store.get([key]),
    }
    times: dict[str, list[float]] = {name: [] for name in ops}
    for rep in range(repeats):
        order = list(ops) if rep % 2 == 0 else list(reversed(ops))
        order.sort(key=lambda name: not name.startswith("put"))  # files exist before reads
        for name in order:
            times[name].append(timed(ops[name], cold and name.startswith("get")))
    (got,) = store.get([key])
    assert got is not None and bytes(got["conv"]) + bytes(got["ssm"]) == data

    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(
        f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"dir {root}, {nbytes / 1e6:.0f} MB, {repeats} repeats, "
        f"{'cold' if cold else 'page-cache'} reads"
    )
    for name, t in med.items():
        spread = max(times[name]) - min(times[name])
        print(
            f"{name:20s} median {t * 1e3:8.1f} ms  (min {min(times[name]) * 1e3:7.1f}, "
            f"spread {spread * 1e3:6.1f})  {nbytes / t / 1e9:5.2f} GB/s"
        )
    put_ratio = med["put store"] / med["put plain"]
    get_ratio = med["get store"] / med["get plain read()"]
    get_ratio_into = med["get store"] / med["get plain readinto"]
    print(
        f"put store / plain write+fsync+rename: {put_ratio:.2f}x "
        f"({'within' if put_ratio <= TARGET else 'OVER'} {TARGET}x)"
    )
    print(
        f"get store / plain read():             {get_ratio:.2f}x "
        f"({'within' if get_ratio <= TARGET else 'OVER'} {TARGET}x)"
    )
    print(f"get store / plain readinto:           {get_ratio_into:.2f}x (reference)")


if __name__ == "__main__":
    main()
