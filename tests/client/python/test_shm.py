"""attnd_client.regions without a daemon: shm objects in /dev/shm (created exclusive, mode 0600,
unlinked exactly once), keys, and HostRegion views (alignment, bounds, encoding)."""

import os
import stat

import numpy as np
import pytest

import attnd_client as ac
from attnd_client import regions


class Owner:
    def __init__(self):
        self.released = []

    def _release_region(self, region):
        self.released.append(region.name)


def test_shm_object_lifecycle():
    obj = ac.ShmObject(10000)
    path = "/dev/shm" + obj.key
    try:
        st = os.stat(path)
        assert st.st_size == 10000 and stat.S_IMODE(st.st_mode) == 0o600
        obj.buffer[:4] = [1, 2, 3, 4]
        with open(path, "rb") as f:
            assert f.read(4) == bytes([1, 2, 3, 4])
        with pytest.raises(FileExistsError):
            ac.ShmObject(10, key=obj.key)
        obj.unlink()
        assert not os.path.exists(path)
        obj.buffer[4] = 5  # the mapping outlives the name
        obj.unlink()
    finally:
        obj.close()
    assert not os.path.exists(path)


def test_keys():
    a, b = regions.new_key(), regions.new_key()
    assert a != b and a.startswith(f"/attnd-py-{os.getpid()}-") and "/" not in a[1:]
    for bad in ["", "/", "x", "/a/b"]:
        with pytest.raises(ValueError):
            regions.shm_path(bad)


def test_host_region_views():
    owner = Owner()
    with ac.ShmObject(1 << 16) as obj:
        region = ac.HostRegion(owner, "r", obj, offset=4096)
        a = region.array("f32", (3, 5))
        b = region.array("bf16", (7,))
        assert ac.tensors.array_address(a) == region.address
        assert (ac.tensors.array_address(b) - region.address) % 64 == 0
        assert region.contains(ac.tensors.array_address(b), b.nbytes)
        c = region.put(np.array([1.0, 2.0]), "bf16")
        assert c.tolist() == [0x3F80, 0x4000]
        with pytest.raises(ValueError):
            region.array("f32", (1 << 20,))
        with pytest.raises(ValueError):
            region.array("u8", (16,), offset=region.byte_size - 8)
        region.close()
        assert owner.released == ["r"] and not region.contains(region.address, 1)
