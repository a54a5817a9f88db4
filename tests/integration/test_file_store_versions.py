"""The file store's conditional writes name versions by content, not by stat.

A file's (inode, mtime, size) is not a version: inode numbers are reused (ext4
alternates the two inodes of a key that is rewritten) and writes within one
timestamp tick share an mtime. A process holding the ETag of version A must see
its ``If-Match`` refused once another writer has gone A -> B -> C, even when C
has A's inode, mtime and size.

The collision is forced, not waited for: on a busy machine ext4 hands a freed
inode back only most of the time. The writer keeps A's inode alive with a hard
link and moves C onto it, as if the filesystem had given C's temporary file
A's inode, then sets C's timestamps to A's with ``os.utime``, as a
coarse-timestamp filesystem (or one tick) would.

These are writes that replace a whole file (a temporary file renamed over it):
the fixture below makes every object too big to be slotted, in this process and
in the writer's (an overwrite in place keeps its file and compares by content;
test_file_store_slots.py covers it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from okq.errors import CASConflict
from okq.store import FileStore
from okq.store import file as file_store

KEY = "default/manifests/q"
SIZE = 256
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def whole_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_store, "SLOT_MAX", -1)
    monkeypatch.setattr(file_store, "SLOT_NEW_MAX", -1)


def payload(tag: str) -> bytes:
    """Distinct contents of one size, so size never tells versions apart."""
    return tag.encode().ljust(SIZE, b".")


def triple(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_mtime_ns, st.st_size


async def overwrite_as(store: FileStore, key: str, etag_a: str, keep: Path) -> tuple[str, bytes]:
    """Go A -> B -> C on ``key`` by CAS, and give C A's inode and timestamps.

    ``keep`` (outside the store, same filesystem) becomes a hard link to A's inode
    while A is current; C's bytes are then written into that inode and renamed
    over the key, exactly what a write does when its temporary file is given the
    inode A had. Returns C's ETag and bytes."""
    path = store.root / key
    st_a = path.stat()
    os.link(path, keep)
    etag_b = await store.put(key, payload("b"), if_match=etag_a)
    data_c = payload("c")
    etag_c = await store.put(key, data_c, if_match=etag_b)
    with keep.open("r+b") as fh:  # C on A's inode
        fh.write(data_c)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(keep, path)
    os.utime(path, ns=(st_a.st_atime_ns, st_a.st_mtime_ns))  # C in A's tick
    return etag_c, data_c


async def hold_version_a(holder: FileStore) -> tuple[str, os.stat_result]:
    """Write A and look it up the way a listing does, so a cache keyed by stat
    remembers A. Returns A's ETag and stat."""
    etag = await holder.put(KEY, payload("v"), if_none_match=True)
    etag = await holder.put(KEY, payload("a"), if_match=etag)
    assert (await holder.head(KEY)).etag == etag
    assert [i.etag for i in (await holder.list("default/")).items] == [etag]
    return etag, (holder.root / KEY).stat()


async def assert_stale_if_match_refused(holder: FileStore, op: str, stale: str,
                                        survivor: bytes) -> None:
    with pytest.raises(CASConflict):
        if op == "put":
            await holder.put(KEY, payload("stale"), if_match=stale)
        else:
            await holder.delete(KEY, if_match=stale)
    blob = await FileStore(holder.root).get(KEY)
    assert blob.data == survivor, f"the stale If-Match {op} destroyed a newer version"


@pytest.mark.parametrize("op", ["put", "delete"])
async def test_stale_if_match_refused_when_a_version_reuses_inode_and_mtime(
        tmp_path: Path, op: str) -> None:
    """In one process: the holder and the other writer are separate FileStores."""
    root = tmp_path / "store"
    holder, writer = FileStore(root), FileStore(root)
    etag_a, st_a = await hold_version_a(holder)
    etag_c, data_c = await overwrite_as(writer, KEY, etag_a, tmp_path / "keep")
    assert triple((root / KEY).stat()) == triple(st_a)  # C looks like A by stat
    assert etag_c != etag_a
    await assert_stale_if_match_refused(holder, op, etag_a, data_c)


WRITER = """
import asyncio, json, sys
from pathlib import Path
from okq.store import FileStore, file as file_store
from tests.integration.test_file_store_versions import overwrite_as
file_store.SLOT_MAX = file_store.SLOT_NEW_MAX = -1  # whole files, as in this process
root, key, etag, keep = sys.argv[1:]
etag_c, data_c = asyncio.run(overwrite_as(FileStore(root), key, etag, Path(keep)))
print(json.dumps([etag_c, data_c.decode()]))
"""


async def test_stale_if_match_refused_across_processes(tmp_path: Path) -> None:
    """This process holds A's ETag; another OS process writes A -> B -> C with C on
    A's inode and timestamps. The stale If-Match is refused and C survives."""
    root = tmp_path / "store"
    holder = FileStore(root)
    etag_a, st_a = await hold_version_a(holder)
    args = [str(root), KEY, etag_a, str(tmp_path / "keep")]
    proc = subprocess.run([sys.executable, "-c", WRITER, *args], cwd=REPO, env=os.environ,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    etag_c, data_c = json.loads(proc.stdout)
    assert triple((root / KEY).stat()) == triple(st_a)  # C looks like A by stat
    assert etag_c != etag_a
    await assert_stale_if_match_refused(holder, "put", etag_a, data_c.encode())


async def test_bytes_it_wrote_are_compared_not_hashed_and_others_are_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conditional write whose key holds the bytes this store wrote there last
    knows their ETag without hashing them; once another writer changed them, it
    hashes what is on disk: a stale ETag is refused, and bytes equal to the ones
    it holds (written back by the other) have that ETag again."""

    hashed: list[bytes] = []
    real = file_store.etag_of

    def counting(data: bytes) -> str:
        hashed.append(bytes(data))
        return real(data)

    monkeypatch.setattr(file_store, "etag_of", counting)
    mine, other = FileStore(tmp_path), FileStore(tmp_path)
    try:
        a = await mine.put(KEY, payload("A"))
        hashed.clear()
        b = await mine.put(KEY, payload("B"), if_match=a)
        assert hashed == [payload("B")]  # only the new bytes: A on disk was compared
        await other.put(KEY, payload("C"), if_match=b)
        hashed.clear()
        with pytest.raises(CASConflict):
            await mine.put(KEY, payload("D"), if_match=b)
        assert hashed == [payload("C")]  # bytes it never wrote: hashed
        await other.put(KEY, payload("B"))  # the other writes B's bytes back
        assert await mine.put(KEY, payload("E"), if_match=b) == real(payload("E"))
    finally:
        await mine.close()
        await other.close()
