"""FileStore under SIGKILL: a writer process killed mid-put, again and again (harness and
checks: tests/tiers_crash.py). On the real disk under pytest's tmp_path, so fsync and rename
run as in production."""

from __future__ import annotations

import os

import pytest

from tiers_crash import crash_rounds


def _temp_files(root: str):
    return lambda: sum(name.endswith(".tmp") for name in os.listdir(root))


def test_killed_writer_quick(tmp_path):
    out = crash_rounds("file", str(tmp_path), rounds=2, part_bytes=64 << 10, seed=1,
                       count_temp_files=_temp_files(str(tmp_path)))
    assert out.rounds == 2 and out.acks >= 2 and out.reads_checked >= 2 * 12


@pytest.mark.slow
def test_killed_writer_many_times(tmp_path):
    """40 kills at random moments, 2 x 1 MiB parts per object: most land inside a put."""
    out = crash_rounds("file", str(tmp_path), rounds=40, part_bytes=1 << 20, seed=2,
                       count_temp_files=_temp_files(str(tmp_path)))
    assert out.rounds == 40
    assert out.mid_put_kills >= 10, out  # the kills really do interrupt puts
    print(f"rounds {out.rounds}, acknowledged puts {out.acks}, kills inside a put "
          f"{out.mid_put_kills}, objects read and checked {out.reads_checked}")
