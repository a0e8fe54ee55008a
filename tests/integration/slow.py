"""A calibrated slow call for the tests that need a request in flight (unregister waits, queue
full, deadlines, cancellation, drain, a client killed mid-call): a sparse MLA call whose inputs
and outputs live in one host region, sized so that it computes for about `seconds` on this
daemon (measured once; the machine may be loaded, so tests only rely on "long enough").

    slow = SlowCall(client, "busy", seconds=1.5)
    future = slow.submit()                  # OpFuture (unary) ...
    call = slow.submit(caller=session)      # ... or SessionCall
    slow.check(future.result())
    slow.close()
"""

import time

import numpy as np
import pytest

from attnd_client import to_bf16

import reference as ref

HEADS, D_QK, ROWS, K = 64, 576, 4096, 2048
MAX_TOKENS = 512


class SlowCall:
    # The call's tensors in its region (q, kv, indices, out, lse): the daemon holds one pin per
    # tensor, so `in_flight() >= PINS` means the call resolved them all (before that, an
    # unregistration wins the race and the call answers NOT_FOUND for a tensor not yet pinned).
    PINS = 5

    def __init__(
        self,
        client,
        region_name,
        seconds=1.5,
        seed=0,
        owner=None,
        max_tokens=MAX_TOKENS,
        hold=True,
    ):
        """`owner` (Client or Session) registers the region; `client` by default. `max_tokens`
        caps the call's size (the region holds that many tokens: about 150 KB each). `hold`: the
        test needs the call to occupy the daemon for about `seconds`; where even the largest call
        computes for less than a quarter of that (a GPU daemon: milliseconds), the test is
        skipped, saying so. Pass False where a short call still proves the point (and in child
        processes, which cannot skip)."""
        self.client = client
        self.region_name = region_name
        rng = np.random.default_rng(seed)
        self.kv_rows = rng.standard_normal((ROWS, D_QK), dtype=np.float32)
        owner = owner or client
        probe = 16
        tokens = max(probe, max_tokens)
        self.region = owner.create_host_region(region_name, self._bytes(tokens))
        self.kv = self.region.put(self.kv_rows, "bf16")
        # 16 distinct random tokens repeated: the work per token is what matters here.
        reps = tokens // probe
        self._q_all = np.tile(
            to_bf16(rng.standard_normal((probe, HEADS, D_QK), dtype=np.float32)), (reps, 1, 1)
        )
        self._idx_all = np.tile(rng.integers(0, ROWS, (probe, K)).astype(np.int32), (reps, 1))
        self.q_full = self.region.put(self._q_all, "bf16")
        self.idx_full = self.region.put(self._idx_all, "i32")
        self.out_full = self.region.array("bf16", (tokens, HEADS, 512))
        self.lse_full = self.region.array("f32", (tokens, HEADS))
        self.tokens = probe
        # The fastest of three probes: the machine may be loaded while we calibrate and idle
        # while the test runs, and a call that turns out shorter than asked breaks the tests
        # that need work still queued or running; one that turns out longer only costs time.
        per_token = float("inf")
        for _ in range(3):
            start = time.monotonic()
            res = self._call_now()
            wall = time.monotonic() - start
            per_token = min(per_token, max(res.stats.compute_seconds, wall) / probe)
        self.tokens = int(min(tokens, max(probe, seconds / per_token)))
        self.expected_seconds = self.tokens * per_token
        if hold and self.expected_seconds < 0.25 * seconds:
            self.region.close()
            pytest.skip(
                f"needs a call that occupies the daemon for ~{seconds:g} s; the largest this "
                f"daemon takes computes for {self.expected_seconds * 1e3:.1f} ms"
            )

    @staticmethod
    def _bytes(tokens):
        return (
            ROWS * D_QK * 2
            + tokens * HEADS * D_QK * 2
            + tokens * K * 4
            + tokens * HEADS * 512 * 2
            + tokens * HEADS * 4
            + 8 * 64
        )

    def arguments(self):
        t = self.tokens
        return {
            "q": self.q_full[:t],
            "kv": self.kv,
            "indices": self.idx_full[:t],
            "sm_scale": 1.0 / np.sqrt(D_QK),
            "out": self.out_full[:t],
            "lse": self.lse_full[:t],
        }

    def _call_now(self):
        return self.client.call("sparse_mla", **self.arguments())

    def submit(self, caller=None, timeout=None):
        return (caller or self.client).submit("sparse_mla", timeout=timeout, **self.arguments())

    def in_flight(self):
        for r in self.client.list_regions():
            if r.name == self.region_name:
                return r.in_flight
        return 0

    def check(self, result, tokens=(0, -1)):
        """Checks a finished call's out/lse for a few tokens against the fp64 reference."""
        assert result.stats.copied_bytes_in == 0 and result.stats.copied_bytes_out == 0
        for t in tokens:
            t = t % self.tokens
            q = self._q_all[t : t + 1]
            idx = self._idx_all[t : t + 1]
            want_abs = []
            want_out, want_lse = ref.sparse_mla(
                q, to_bf16(self.kv_rows), idx, 1 / np.sqrt(D_QK), weighted_abs=want_abs
            )
            ref.assert_attention_close(
                f"out[{t}]", self.out_full[t : t + 1], want_out, want_abs[0], None
            )
            ref.assert_lse_close(f"lse[{t}]", self.lse_full[t : t + 1], want_lse)

    def close(self):
        self.region.close()
