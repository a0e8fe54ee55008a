"""torch_support.DeviceRegionCache without CUDA (skipped without torch): CPU tensors stand in for
CUDA ones through an injected share function (a fake allocation handle and offset per storage),
so the storages, their weak references and their deaths are torch's own. Checked: a dead
storage's region is unregistered on the next call, never from the garbage collector; a new
storage with the same (device, handle, offset, size) re-uses the registration, one of another
size gets its own; 1000 fresh tensors leave no growth; keep_alive pins; the cap raises."""

import gc
import threading

import pytest

torch = pytest.importorskip("torch")

from attnd_client import torch_support  # noqa: E402
from attnd_client.torch_support import DeviceRegionCache, DeviceRegionLimitError  # noqa: E402


class Registrar:
    """Records registrations; `live` is the set the daemon would hold."""

    def __init__(self):
        self.registered = []
        self.unregistered = []
        self.live = set()
        self.thread = None  # the thread that unregisters must be a caller's

    def device_uuids(self):
        return ["GPU-fake"]

    def register_device_region(self, **kwargs):
        assert kwargs["name"] not in self.live
        self.registered.append(kwargs)
        self.live.add(kwargs["name"])

    def unregister_region(self, name):
        assert name in self.live, name
        self.unregistered.append(name)
        self.live.remove(name)
        self.thread = threading.current_thread()
        return [name]


class Done:
    def __init__(self, value):
        self.value = value

    def done(self):
        return True

    def result(self, timeout=None):
        return self.value


class SubmittingRegistrar(Registrar):
    def submit_unregister(self, name):
        return Done(self.unregister_region(name))


class Sharer:
    """share(storage): device 0, a handle per 'allocation' and the storage's offset in it. By
    default the allocation is the storage's own address (the CPU allocator re-uses them as
    torch's CUDA one re-uses blocks); `place` pins a storage to a given (handle, offset)."""

    def __init__(self):
        self.calls = 0
        self.place = {}  # data_ptr -> (handle, offset)

    def __call__(self, storage):
        self.calls += 1
        handle, offset = self.place.get(storage.data_ptr(), (None, 0))
        if handle is None:
            handle = storage.data_ptr().to_bytes(8, "little") * 8
        return (0, handle, storage.nbytes(), offset, b"ref", 0, b"ev", False)


def make(registrar=None, **options):
    registrar = registrar or Registrar()
    sharer = Sharer()
    syncs = []
    cache = DeviceRegionCache(
        registrar,
        share=sharer,
        device_uuid=lambda device: "fake",
        synchronize=syncs.append,
        **options,
    )
    return cache, registrar, sharer, syncs


def test_one_region_per_storage_and_views_share_it():
    cache, reg, sharer, syncs = make()
    base = torch.zeros(16, 8, dtype=torch.bfloat16)
    ref = cache.ref(base[2:5])
    assert ref.region == reg.registered[0]["name"] and ref.offset == 2 * 8 * 2
    assert ref.shape == (3, 8) and ref.dtype == "bf16"
    assert reg.registered[0]["byte_size"] == 16 * 8 * 2
    assert reg.registered[0]["device_uuid"] == "GPU-fake"
    sref = cache.ref(base[:, :4])
    assert sref.region == ref.region and sref.strides == (8, 1)
    assert len(reg.registered) == 1 and sharer.calls == 1, "shared once per storage"
    assert syncs == [0, 0]
    with torch_support.ordered_by_ready():
        cache.ref(base)
    assert syncs == [0, 0], "no synchronise inside ordered_by_ready()"


def test_one_synchronize_per_device_within_one_request():
    cache, reg, _, syncs = make()
    a, b = torch.zeros(16), torch.ones(32)
    with torch_support.one_synchronize_per_device():
        cache.ref(a)
        cache.ref(b)
        cache.ref(a[1:])
        assert syncs == [0], "the first reference synchronises the device, the others not"
        with torch_support.ordered_by_ready():
            cache.ref(b)
        assert syncs == [0]
    with torch_support.one_synchronize_per_device():
        cache.ref(b)
    assert syncs == [0, 0], "each scope (request) synchronises again"
    cache.ref(a)
    cache.ref(b)
    assert syncs == [0, 0, 0, 0], "outside a scope every reference synchronises"
    assert len(reg.registered) == 2


def test_dead_storage_is_unregistered_on_the_next_call_not_in_gc():
    cache, reg, _, _ = make()
    keep = torch.zeros(64)
    t = torch.ones(1000)
    cache.ref(keep)
    name = cache.ref(t).region
    del t
    gc.collect()
    assert reg.unregistered == [], "no RPC from the weakref callback"
    assert name in cache.names()
    cache.ref(keep)
    assert reg.unregistered == [name]
    assert reg.thread is threading.current_thread()
    assert cache.names() == [reg.registered[0]["name"]]


def test_dead_storage_in_a_cycle_is_released_after_gc():
    cache, reg, _, _ = make()
    t = torch.ones(100)
    name = cache.ref(t).region
    holder = [t]
    holder.append(holder)  # a cycle keeps t alive until gc
    del t, holder
    assert cache.collect() == []
    gc.collect()
    assert cache.collect() == [name]
    assert reg.live == set() and len(cache) == 0


def test_same_key_reuses_the_registration():
    cache, reg, sharer, _ = make()
    handle = bytes(range(64))
    t = torch.zeros(32)
    sharer.place[t.data_ptr()] = (handle, 4096)
    first = cache.ref(t).region
    del t
    gc.collect()
    # The allocator hands the block out again: a new storage at the same handle + offset and
    # of the same size addresses the same bytes; its registration is re-used and kept.
    u = torch.zeros(32)
    sharer.place[u.data_ptr()] = (handle, 4096)
    assert cache.ref(u).region == first
    assert len(reg.registered) == 1 and reg.unregistered == []
    assert cache.collect() == [] and reg.live == {first}
    del u
    gc.collect()
    assert cache.collect() == [first]
    assert reg.live == set()


def test_same_place_other_size_gets_its_own_region():
    cache, reg, sharer, _ = make()
    handle = bytes(range(64))
    t = torch.zeros(32)
    sharer.place[t.data_ptr()] = (handle, 0)
    first = cache.ref(t).region
    del t
    gc.collect()
    u = torch.zeros(48)
    sharer.place[u.data_ptr()] = (handle, 0)
    second = cache.ref(u).region
    assert second != first
    assert reg.unregistered == [first], "the old one unregistered on that same call"
    assert reg.registered[1]["byte_size"] == 48 * 4 and reg.registered[1]["offset"] == 0
    assert reg.live == {second}


def test_a_new_storage_with_a_reused_id_is_not_taken_for_the_old():
    # id() of a dead storage's Python object may come back for a new storage; the cache checks
    # identity through the weak reference, so the new one is shared and registered on its own.
    cache, reg, sharer, _ = make()
    for n in range(50):
        t = torch.zeros(8 + n)
        cache.ref(t)
        del t
    assert sharer.calls == 50
    assert len(reg.registered) == 50


@pytest.mark.parametrize("registrar", [Registrar, SubmittingRegistrar])
def test_no_growth_over_1000_fresh_tensors(registrar):
    cache, reg, _, _ = make(registrar())
    weights = torch.zeros(256, 64)
    cache.ref(weights)
    for step in range(1000):
        q = torch.full((4, 64), float(step))  # a fresh activation each step
        cache.ref(q)
        out = q * 2  # and a functional output
        cache.ref(out)
        del q, out
        assert len(reg.live) <= 4, step
        assert len(cache) <= 4 and len(cache._by_storage) <= 4
    cache.collect()
    assert len(reg.live) == 1 and cache.names() == [reg.registered[0]["name"]]
    assert len(cache._pending) == 0


def test_keep_alive_pins_storages_until_clear():
    cache, reg, _, _ = make(keep_alive=True)
    t = torch.ones(10)
    storage_ref = __import__("weakref").ref(t.untyped_storage())
    name = cache.ref(t).region
    del t
    gc.collect()
    assert storage_ref() is not None, "pinned"
    assert cache.collect() == [] and reg.live == {name}
    cache.clear()
    assert reg.unregistered == [name] and len(cache) == 0
    gc.collect()
    assert storage_ref() is None, "released by clear()"


def test_cap_raises_and_dead_storages_make_room():
    cache, reg, _, _ = make(max_regions=3)
    held = [torch.zeros(4 + i) for i in range(3)]
    for t in held:
        cache.ref(t)
    extra = torch.zeros(100)
    with pytest.raises(DeviceRegionLimitError, match="max_regions"):
        cache.ref(extra)
    assert len(reg.live) == 3
    del held[0]
    cache.ref(extra)  # the dead one is collected first
    assert len(reg.live) == 3 and len(reg.unregistered) == 1
    pinned, preg, _, _ = make(keep_alive=True, max_regions=2)
    a, b = torch.zeros(3), torch.zeros(5)
    pinned.ref(a)
    pinned.ref(b)
    del a, b
    with pytest.raises(DeviceRegionLimitError, match="keep_alive"):
        pinned.ref(torch.zeros(7))
    with pytest.raises(ValueError):
        DeviceRegionCache(Registrar(), max_regions=0)


def test_clear_unregisters_everything_live_or_dead():
    cache, reg, _, _ = make()
    keep = torch.zeros(3)
    cache.ref(keep)
    t = torch.zeros(5)
    cache.ref(t)
    del t
    gc.collect()
    cache.clear()
    assert reg.live == set() and len(reg.unregistered) == 2 and len(cache) == 0
    cache.ref(keep)  # registered again after a clear
    assert len(reg.live) == 1
    cache.clear(unregister=False)
    assert len(reg.live) == 1 and len(cache) == 0


def test_threads_share_one_registration():
    cache, reg, _, _ = make()
    t = torch.zeros(1024)
    names = []

    def use():
        for _ in range(200):
            names.append(cache.ref(t[1:]).region)

    threads = [threading.Thread(target=use) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(set(names)) == 1 and len(reg.registered) == 1


def test_client_device_regions_options():
    import attnd_client as ac

    client = ac.Client("unix:/nonexistent/attnd.sock")  # never connects: no call is made
    try:
        cache = client.device_regions(keep_alive=True, max_regions=8)
        assert cache.keep_alive and cache.max_regions == 8
        assert client.device_regions(keep_alive=True, max_regions=8) is cache
        # No options: whatever exists (an ordered caller's lookup); one option given must match.
        assert client.device_regions() is cache
        assert client.device_regions(keep_alive=True) is cache
        with pytest.raises(ValueError, match="keep_alive=True"):
            client.device_regions(keep_alive=False)
        with pytest.raises(ValueError, match="max_regions=8"):
            client.device_regions(max_regions=9)
    finally:
        client.close()
    fresh = ac.Client("unix:/nonexistent/attnd.sock")
    try:
        cache = fresh.device_regions()
        assert not cache.keep_alive and cache.max_regions == torch_support.DEFAULT_MAX_REGIONS
    finally:
        fresh.close()


def test_known_name_answers_only_for_registered_live_storages():
    cache, reg, sharer, syncs = make()
    base = torch.zeros(64)
    assert cache.known_name(base) is None, "not registered yet"
    name, offset = cache.region_slice(base[8:])
    assert offset == 8 * 4
    assert cache.known_name(base[3:]) == name, "a view of a registered storage"
    calls = sharer.calls
    for n in range(20):  # a dead storage's id may come back: never answered for the new one
        t = torch.zeros(8 + n)
        assert cache.known_name(t) is None
        cache.ref(t)
        assert cache.known_name(t) == reg.registered[-1]["name"]
        del t
    assert sharer.calls == calls + 20
    cache.clear()
    assert cache.known_name(base) is None, "cleared"


class _Owner:
    def __init__(self, cache):
        self.cache = cache

    def device_regions(self):
        return self.cache


def _keyer(monkeypatch, cache):
    """An OrderedCaller's key function over `cache` with CPU tensors standing in for CUDA."""
    from attnd_client import ordered

    monkeypatch.setattr(ordered, "_is_cuda_tensor", lambda v: isinstance(v, torch.Tensor))
    caller = ordered.OrderedCaller.__new__(ordered.OrderedCaller)
    caller.owner = _Owner(cache)
    return lambda **arguments: caller._key("op", arguments)


def test_ordered_caller_key_of_cuda_tensors(monkeypatch):
    """The key an OrderedCaller caches prepared calls under: equal for fresh views of the same
    bytes, different whenever the region, offset, shape, strides or dtype differ, and a dead
    storage's region is unregistered on the next call (once per call, not per tensor)."""
    cache, reg, _, _ = make()
    key = _keyer(monkeypatch, cache)
    q = torch.zeros(4, 8, 16, dtype=torch.bfloat16)
    out = torch.zeros(4, 8, 16, dtype=torch.bfloat16)
    k0, held = key(q=q[1], out=out[1], scale=0.5)
    assert len(held) == 2 and held[0] is not q  # the views themselves are held
    assert key(q=q[1], out=out[1], scale=0.5)[0] == k0, "fresh views, the same bytes"
    assert key(out=out[1], q=q[1], scale=0.5)[0] == k0, "argument order does not matter"
    assert len(reg.registered) == 2
    assert key(q=q[2], out=out[1], scale=0.5)[0] != k0, "another offset"
    assert key(q=q[1], out=out[1], scale=0.25)[0] != k0, "another scalar"
    assert key(q=q[1].view(torch.int16), out=out[1], scale=0.5)[0] != k0, "another dtype"
    assert key(q=q[1].t(), out=out[1], scale=0.5)[0] != k0, "other strides"
    assert key(q=q[1][:4], out=out[1], scale=0.5)[0] != k0, "another shape"
    # A new storage in a new region: another key; the dead one is unregistered next call.
    k1 = key(q=q[1], out=torch.zeros(8, 16, dtype=torch.bfloat16), scale=0.5)[0]
    assert k1 != k0 and len(reg.registered) == 3
    assert reg.unregistered == []
    key(q=q[1], out=out[1], scale=0.5)
    assert reg.unregistered == [reg.registered[2]["name"]]
    assert key(q=q[1], out=out[1], scale=0.5)[0] == k0
