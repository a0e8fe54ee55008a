#!/usr/bin/env python3
"""The decode-step benchmark (docs/BENCHMARKS.md "Decode step"): a PyTorch frontend runs a decode
step of `--layers` layers (61, DeepSeek-V3.2), each layer a torch op producing the attention
query and the indexer query from the previous layer's output (a stand-in for the projections),
the paged DsaAttention through attnd, and a torch op consuming its out; the same chain with the
same kernels launched in this process (libattnd_inproc.so, bench/decode_step/inproc.cc) is the
baseline. One JSON line per configuration goes to --out.

Paths:
  stream_ordered  each layer is a prepared call (PrepareCall once, every tensor in a region
                  registered once), run per step through a submission ring (--submit ring),
                  RunPrepared with signals (--submit rpc) or the client's OrderedCaller (--submit
                  ordered: one caller.call per layer, the bookkeeping the library's); the
                  layer's ready word is written and its done word waited on by torch's current
                  stream (cuStreamWriteValue64 / cuStreamWaitValue64), value = the step number;
                  nothing synchronises in the loop.
  blocking        the blocking DsaAttention call per layer as a client makes it today (the
                  client synchronises the device, the daemon answers when the op is over);
                  with --blocking-via ring instead (or as well) the device synchronised, then
                  the layer's prepared call through a submission ring, waited for by its done
                  word (SubmissionRing.call, polling it for --wait-spin seconds first).
Signal words (--signals): "host" (a host region, also mapped into this process's CUDA context)
or "device" (a CUDA buffer registered as a device region; a daemon without the device-side wait
path refuses it: the line then records the refusal).

    PYTHONPATH=bundle/python python3 bench/decode_step/decode_step.py --target unix:/tmp/a.sock \\
        --batch 64 128 --paths stream_ordered blocking --inproc bundle/lib/libattnd_inproc.so \\
        --out devtmp/decode_step.jsonl
    # CPU smoke test (a CPU daemon, torch without CUDA, tiny shapes, no baseline):
    python3 decode_step.py --target unix:/tmp/a.sock --device cpu --tiny --out /tmp/d.jsonl
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import ctypes
import datetime
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable

import torch

import attnd_client as ac
from attnd_client.rings import ring_bytes
from attnd_client.stream_ordered import FAILURE_BIT, Signal, SignalWord

WORD_SPACING = 64  # one signal word per cache line
_names = itertools.count()  # region names of this process
# What the watchdog stores in done words that the daemon never wrote, so that a stream waiting
# on them goes on (the run is then reported as failed). It is 0 | FAILURE_BIT (bit 62): past any
# step number for the stream's cyclic >=, and read back as a failure.
UNSTICK = 1 << 62


# ---- the in-process baseline (libattnd_inproc.so) ----


class InprocShape(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_int64)
        for n in (
            "batch",
            "next_n",
            "heads",
            "d_qk",
            "index_heads",
            "index_dim",
            "topk",
            "num_index_blocks",
            "index_block_size",
            "max_blocks",
            "kv_rows",
            "kv_row_bytes",
        )
    ] + [("sm_scale", ctypes.c_float)]


class InprocPointers(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_void_p)
        for n in (
            "index_q",
            "index_weights",
            "index_cache",
            "block_table",
            "context_lens",
            "q",
            "kv",
            "out",
            "lse",
        )
    ]


class Inproc:
    """attnd_inproc_dsa_paged through ctypes: the same operator entry the daemon runs."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        f = self.lib.attnd_inproc_dsa_paged
        f.restype = ctypes.c_int64
        f.argtypes = [
            ctypes.POINTER(InprocShape),
            ctypes.POINTER(InprocPointers),
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_char_p,
            ctypes.c_int64,
        ]
        self.fn = f
        self.err = ctypes.create_string_buffer(1024)
        st = getattr(self.lib, "attnd_inproc_stamp", None)
        if st is not None:
            st.restype = ctypes.c_int64
            st.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.stamp_fn = st
        cap = getattr(self.lib, "attnd_inproc_capture", None)
        if cap is not None:
            cap.restype = ctypes.c_int64
            cap.argtypes = [
                ctypes.POINTER(InprocShape),
                ctypes.POINTER(InprocPointers),
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_int64,
                ctypes.c_char_p,
                ctypes.c_int64,
            ]
            self.lib.attnd_inproc_launch.restype = ctypes.c_int64
            self.lib.attnd_inproc_launch.argtypes = [ctypes.c_int64, ctypes.c_void_p]
        self.capture_fn = cap

    def capture(self, shape, ptrs, workspace: int, nbytes: int, form: int) -> int:
        """A CUDA graph of the call (form 0: its launches; 1: the daemon's gate/IF/done form)."""
        if self.capture_fn is None:
            raise RuntimeError("this libattnd_inproc.so has no attnd_inproc_capture")
        h = self.capture_fn(
            ctypes.byref(shape), ctypes.byref(ptrs), workspace, nbytes, form, self.err, 1024
        )
        if h < 0:
            raise RuntimeError(f"attnd_inproc_capture: {self.err.value.decode()}")
        return h

    def launch(self, handle: int, stream: int) -> None:
        if self.lib.attnd_inproc_launch(handle, stream) != 0:
            raise RuntimeError("attnd_inproc_launch failed")

    def call(self, shape, ptrs, stream: int, workspace: int | None, nbytes: int) -> int:
        r = self.fn(
            ctypes.byref(shape), ctypes.byref(ptrs), stream, workspace, nbytes, self.err, 1024
        )
        if r < 0:
            raise RuntimeError(f"attnd_inproc_dsa_paged: {self.err.value.decode()}")
        return r


# ---- plumbing ----


def scrape(url: str | None) -> dict[str, float]:
    """{name{labels}: value} of a Prometheus page (empty without a URL or on failure)."""
    if not url:
        return {}
    try:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def metric_sum(samples: dict[str, float], family: str, needle: str = "dsa_attention") -> float:
    return sum(v for k, v in samples.items() if k.startswith(family) and needle in k)


def daemon_times(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per call over the window: the daemon's request time minus its compute time, and both."""
    d = {
        f: metric_sum(after, f) - metric_sum(before, f)
        for f in (
            "attnd_request_duration_seconds_sum",
            "attnd_request_duration_seconds_count",
            "attnd_compute_duration_seconds_sum",
        )
    }
    n = d["attnd_request_duration_seconds_count"]
    if n <= 0:
        return {}
    # Calls the daemon ran wholly on its device stream (wait, op and done there), if it counts
    # them: the path that served the stream-ordered calls.
    family, device = "attnd_stream_ordered_calls_total", 'event="device"'
    on_device = metric_sum(after, family, device) - metric_sum(before, family, device)
    total = d["attnd_request_duration_seconds_sum"] / n * 1e6
    compute = d["attnd_compute_duration_seconds_sum"] / n * 1e6
    return {
        "daemon_calls": n,
        "daemon_total_us_per_call": total,
        "daemon_compute_us_per_call": compute,
        "daemon_added_us_per_call": total - compute,
        "daemon_device_path_calls": on_device,
    }


def commit_of(explicit: str | None) -> str:
    if explicit:
        return explicit
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class DeviceWords:
    """Signal words in a CUDA buffer registered as a device region (an int64 tensor: its
    storage's region through DeviceRegionCache.region_slice, which takes any dtype); the caller's
    stream writes and waits on them at their device addresses (cuda_signals.StreamMemOps)."""

    def __init__(self, client: ac.Client, count: int) -> None:
        from attnd_client.cuda_signals import StreamMemOps

        self.ops = StreamMemOps()
        self.stride = WORD_SPACING // 8  # int64 elements from one word to the next
        self.buf = torch.zeros(count * self.stride, dtype=torch.int64, device="cuda")
        # Registers the storage and synchronises once: the zeros are in place before the
        # daemon reads a word.
        self.region, self.base = client.device_regions(keep_alive=True).region_slice(self.buf)
        self.ptr = self.buf.data_ptr()

    def offset(self, i: int) -> int:
        return self.base + i * WORD_SPACING

    def close(self) -> None:
        pass  # the buffer's region stays with the client's (keep_alive) device region cache

    def unstick(self, indices: list[int], side: torch.cuda.Stream) -> None:
        # On a side stream, not behind the stuck wait; one int64 store per word (UNSTICK is
        # below 2^63 and step numbers below 2^62, so the cyclic >= of the stream wait sees it as
        # past any step number).
        with torch.cuda.stream(side):
            for i in indices:
                self.buf[i * self.stride].fill_(UNSTICK)

    def peek(self, indices: list[int], side: torch.cuda.Stream) -> list[int]:
        """The words now, read on `side` (the current stream may be stuck in a wait)."""
        with torch.cuda.stream(side):
            words = self.buf.view(-1, self.stride)[:, 0].cpu().tolist()
        return [words[i] & ((1 << 64) - 1) for i in indices]

    def value(self, i: int) -> int:
        return int(self.buf[i * self.stride].item()) & ((1 << 64) - 1)

    def write(self, i: int, value: int, stream: int) -> None:
        self.ops.write(self.ptr + i * WORD_SPACING, value, stream)

    def wait(self, i: int, value: int, stream: int) -> None:
        self.ops.wait(self.ptr + i * WORD_SPACING, value, stream)


class HostWords:
    """Signal words in a host region; on CUDA the stream writes and waits them (StreamSignals),
    on the CPU the thread does."""

    def __init__(self, client: ac.Client, count: int, cuda: bool) -> None:
        self.host = client.create_host_region(
            f"ds-signals-{os.getpid()}-{next(_names)}", count * WORD_SPACING
        )
        self.region = self.host.name
        self.words = [SignalWord(self.host, i * WORD_SPACING) for i in range(count)]
        self.cuda = None
        if cuda:
            from attnd_client.cuda_signals import StreamSignals

            self.cuda = StreamSignals(self.host)

    def offset(self, i: int) -> int:
        return self.words[i].offset

    def close(self) -> None:
        if self.cuda is not None:
            self.cuda.close()
        self.host.close()

    def unstick(self, indices: list[int], side: object) -> None:
        for i in indices:
            self.words[i].set(UNSTICK)

    def peek(self, indices: list[int], side: object) -> list[int]:
        return [self.words[i].get() for i in indices]

    def value(self, i: int) -> int:
        return self.words[i].get()

    def write(self, i: int, value: int, stream: int) -> None:
        if self.cuda is not None:
            self.cuda.write(self.words[i], value, stream)
        else:
            self.words[i].set(value)

    def wait(self, i: int, value: int, stream: int) -> None:
        if self.cuda is not None:
            self.cuda.wait(self.words[i], value, stream)
        else:
            self.words[i].wait(value, timeout=600)


# ---- the model's tensors ----


class Model:
    """Shared caches (one MLA pool and one indexer cache, read by every layer: 61 layers' own
    caches would not fit) and per-layer queries, weights and outputs, each kind in one storage
    (one region), the layers' views of it."""

    def __init__(self, a, batch: int, client: ac.Client) -> None:
        cuda = a.device == "cuda"
        self.cuda = cuda
        self.dev = torch.device(a.device)
        self.batch, self.layers = batch, a.layers
        self.heads, self.d_qk, self.topk = a.heads, a.d_qk, a.topk
        self.hi, self.di, self.bs = a.index_heads, a.index_dim, a.block_size
        self.max_blocks = -(-a.ctx // a.block_size)
        self.num_blocks = batch * self.max_blocks + 1
        self.kv_rows = self.num_blocks * self.bs
        self.t = batch  # next_n 1
        self.sm_scale = 1.0 / math.sqrt(a.d_qk)
        self._host = None
        if not cuda:  # every tensor in one host region: torch views of it, zero-copy calls
            self._host = client.create_host_region(
                f"ds-model-{os.getpid()}-{next(_names)}", self._bytes_needed()
            )
        L, T, H, B = self.layers, self.t, self.heads, batch
        g = torch.Generator(device=self.dev).manual_seed(a.seed)
        on = dict(generator=g, device=self.dev)  # generated where they live: quick on a GPU
        u8, i32 = torch.uint8, torch.int32
        # The indexer cache: per block, bs fp8 keys of di, then bs f32 scales.
        self.index_cache = self.empty((self.num_blocks, self.bs * (self.di + 4)), u8)
        self.kv = self.empty((self.kv_rows, 656), u8)
        chunk = max(1, (1 << 26) // (self.bs * self.di))
        for b0 in range(0, self.num_blocks, chunk):
            n = min(chunk, self.num_blocks - b0)
            keys = torch.randn(n, self.bs * self.di, **on).to(torch.float8_e4m3fn)
            scales = torch.empty(n, self.bs, device=self.dev).uniform_(0.5, 2.0, generator=g)
            self.index_cache[b0 : b0 + n, : self.bs * self.di] = keys.view(u8)
            self.index_cache[b0 : b0 + n, self.bs * self.di :] = scales.view(u8).reshape(n, -1)
        rows = 1 << 17
        for r0 in range(0, self.kv_rows, rows):
            n = min(rows, self.kv_rows - r0)
            codes = (torch.randn(n, 512, **on) * 64).to(torch.float8_e4m3fn).view(u8)
            scales = torch.exp2(torch.randint(-9, -4, (n, 4), **on).float())
            rope = torch.randn(n, 64, **on).to(torch.bfloat16).view(u8)
            block = torch.cat([codes, scales.view(u8).reshape(n, 16), rope.reshape(n, 128)], 1)
            self.kv[r0 : r0 + n] = block
        self.block_table = self.empty((B, self.max_blocks), i32)
        perm = torch.randperm(self.num_blocks, **on)[: B * self.max_blocks]
        self.block_table.copy_(perm.reshape(B, -1).to(i32))
        self.context_lens = self.empty((B,), i32)
        self.context_lens.fill_(a.ctx)
        # Per layer (views of one storage per kind).
        self.q_base = (torch.randn(T, H, self.d_qk, **on) * 0.5).to(torch.bfloat16)
        self.iq_base = torch.randn(B, 1, self.hi, self.di, **on).to(torch.float8_e4m3fn)
        self.iq_base = self.iq_base.view(u8)
        self.q = self.empty((L, T, H, self.d_qk), torch.bfloat16)
        self.q.copy_(self.q_base.expand(L, T, H, self.d_qk))
        self.index_q = self.empty((L, B, 1, self.hi, self.di), torch.float8_e4m3fn)
        self.index_q.view(u8).copy_(self.iq_base.expand(L, B, 1, self.hi, self.di))
        self.index_weights = self.empty((L, T, self.hi), torch.float32)
        self.index_weights.copy_(torch.randn(L, T, self.hi, **on))
        self.out = self.empty((L, T, H, 512), torch.bfloat16)
        self.out.fill_(float("nan"))
        self.lse = self.empty((L, T, H), torch.float32)
        self.check_lse = self.empty((T, H), torch.float32)
        self.check_out = self.empty((T, H, 512), torch.bfloat16)
        self.acc = torch.zeros(T, H, 512, dtype=torch.bfloat16, device=self.dev)

    def _bytes_needed(self) -> int:
        L, T, H, B = self.layers, self.t, self.heads, self.batch
        parts = [
            self.num_blocks * self.bs * (self.di + 4),
            self.kv_rows * 656,
            B * self.max_blocks * 4,
            B * 4,
            L * T * H * self.d_qk * 2,
            L * B * self.hi * self.di,
            L * T * self.hi * 4,
            L * T * H * 512 * 2,
            T * H * 512 * 2,
            L * T * H * 4,
            T * H * 4,
        ]
        return sum(p + 64 for p in parts)

    def empty(self, shape, dtype) -> torch.Tensor:
        if self._host is None:
            return torch.empty(shape, dtype=dtype, device=self.dev)
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        raw = self._host.array("u8", n)
        return torch.from_numpy(raw).view(dtype).reshape(shape)

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None

    def args(self, layer: int, check: bool = False) -> dict:
        return dict(
            index_q=self.index_q[layer],
            index_weights=self.index_weights[layer],
            q=self.q[layer],
            kv=self.kv,
            index_cache=self.index_cache,
            index_block_table=self.block_table,
            context_lens=self.context_lens,
            index_block_size=self.bs,
            topk=self.topk,
            sm_scale=self.sm_scale,
            out=self.check_out if check else self.out[layer],
            lse=self.check_lse if check else self.lse[layer],
        )

    def produce(self, layer: int) -> None:
        """The stand-in for the projections: q's latent part from the previous layer's output
        (acc), the indexer query copied in."""
        torch.add(self.q_base[..., :512], self.acc, alpha=1 / 64, out=self.q[layer, ..., :512])
        self.index_q[layer].view(torch.uint8).copy_(self.iq_base)

    def consume(self, layer: int) -> None:
        self.acc.lerp_(self.out[layer], 0.5)

    # The baseline's arguments.
    def inproc_shape(self) -> InprocShape:
        return InprocShape(
            self.batch,
            1,
            self.heads,
            self.d_qk,
            self.hi,
            self.di,
            self.topk,
            self.num_blocks,
            self.bs,
            self.max_blocks,
            self.kv_rows,
            656,
            self.sm_scale,
        )

    def inproc_ptrs(self, layer: int, check: bool = False) -> InprocPointers:
        return InprocPointers(
            self.index_q[layer].data_ptr(),
            self.index_weights[layer].data_ptr(),
            self.index_cache.data_ptr(),
            self.block_table.data_ptr(),
            self.context_lens.data_ptr(),
            self.q[layer].data_ptr(),
            self.kv.data_ptr(),
            (self.check_out if check else self.out[layer]).data_ptr(),
            (self.check_lse if check else self.lse[layer]).data_ptr(),
        )


# ---- timing ----


class Timer:
    """Step times on the device timeline (CUDA events on the stream) or the host clock (CPU)."""

    def __init__(self, cuda: bool, steps: int) -> None:
        self.cuda = cuda
        if cuda:
            self.events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(steps)
            ]
        self.host: list[tuple[float, float]] = []

    def start(self, i: int) -> None:
        if self.cuda:
            self.events[i][0].record()
        else:
            self.host.append((time.perf_counter(), 0.0))

    def stop(self, i: int) -> None:
        if self.cuda:
            self.events[i][1].record()
        else:
            self.host[i] = (self.host[i][0], time.perf_counter())

    def step_us(self) -> list[float]:
        if self.cuda:
            return [a.elapsed_time(b) * 1e3 for a, b in self.events]
        return [(b - a) * 1e6 for a, b in self.host]


def sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


class Tracer:
    """--trace: %globaltimer stamps (libattnd_inproc.so's attnd_inproc_stamp) at four points of
    every layer of the measured steps, on the stream: s0 before the producer, s1 after it (before
    the ready write or the in-process call), s2 after the done wait (or the call), s3 after the
    consumer. The stamps are kernels of their own, so a traced run's step time is not the
    benchmark's figure."""

    POINTS = 4

    def __init__(self, lib: Inproc, steps: int, layers: int) -> None:
        self.lib, self.layers = lib, layers
        self.buf = torch.zeros(steps * layers * self.POINTS, dtype=torch.int64, device="cuda")
        self.step: int | None = None  # the measured step being run (None: warm-up)
        self.stream = torch.cuda.current_stream().cuda_stream

    def stamp(self, layer: int, point: int) -> None:
        if self.step is None:
            return
        i = (self.step * self.layers + layer) * self.POINTS + point
        if self.lib.stamp_fn(self.buf.data_ptr() + 8 * i, self.stream) != 0:
            raise RuntimeError("attnd_inproc_stamp failed")

    def summary(self, daemon_trace: str | None, first_ns: int | None) -> dict:
        """Medians (µs) of the layer's segments; with the daemon's trace (ATTND_ORDERED_TRACE),
        the attnd segment split at the daemon's stamps (each daemon call matched to the layer
        whose [s1, s2] holds its gate stamp)."""
        t = self.buf.view(-1, self.layers, self.POINTS).cpu().tolist()
        seg: dict[str, list[float]] = {
            k: [] for k in ("producer", "attn", "consumer", "between_layers", "layer")
        }
        spans = []
        for step in t:
            for layer, (s0, s1, s2, s3) in enumerate(step):
                seg["producer"].append((s1 - s0) / 1e3)
                seg["attn"].append((s2 - s1) / 1e3)
                seg["consumer"].append((s3 - s2) / 1e3)
                seg["layer"].append((s3 - s0) / 1e3)
                if layer + 1 < len(step):
                    seg["between_layers"].append((step[layer + 1][0] - s3) / 1e3)
                spans.append((s1, s2))
        out = {f"{k}_us_p50": statistics.median(v) for k, v in seg.items() if v}
        if daemon_trace:
            calls = []
            with open(daemon_trace) as f:
                for line in f:
                    try:
                        d = json.loads(line)
                    except ValueError:
                        continue
                    if d.get("gate_ns") and (first_ns is None or d["gate_ns"] >= first_ns):
                        calls.append(d)
            calls.sort(key=lambda d: d["gate_ns"])
            gates = [d["gate_ns"] for d in calls]
            parts: dict[str, list[float]] = {
                k: []
                for k in ("ready_to_wait_end", "wait_end_to_gate", "gate_to_done", "done_to_s2")
            }

            for s1, s2 in spans:
                j = bisect.bisect_left(gates, s1)
                if j >= len(calls) or gates[j] > s2:
                    continue
                d = calls[j]
                if d.get("wait_ns"):
                    parts["ready_to_wait_end"].append((d["wait_ns"] - s1) / 1e3)
                    parts["wait_end_to_gate"].append((d["gate_ns"] - d["wait_ns"]) / 1e3)
                parts["gate_to_done"].append((d["done_ns"] - d["gate_ns"]) / 1e3)
                parts["done_to_s2"].append((s2 - d["done_ns"]) / 1e3)
            out["daemon_calls_matched"] = len(parts["gate_to_done"])
            out.update({f"{k}_us_p50": statistics.median(v) for k, v in parts.items() if v})
        return out


class Runner:
    def __init__(self, a, model: Model, client: ac.Client) -> None:
        self.a, self.m, self.client = a, model, client
        self.cuda = model.cuda
        self.seq = 0  # the last signal value used (values grow across passes)
        self.stuck = False  # a stream-ordered run's stream did not get on (_await)
        self.unstick = None  # forces the run's done words (set during a stream-ordered run)
        self.tracer: Tracer | None = None  # --trace: set around a traced run

    def _await(self, event: torch.cuda.Event | None) -> None:
        """Polls `event` (sleeping, so the GIL is free) until the stream passed it. Past
        --stream-timeout the run counts as stuck and self.unstick (when set) forces the done
        words each poll, so the stream goes on."""
        if event is None:
            return
        start = time.monotonic()
        while not event.query():
            if time.monotonic() - start > self.a.stream_timeout:
                self.stuck = True
                if self.unstick is not None:
                    self.unstick()
            time.sleep(50e-6)

    def _step_end(self, ends: list) -> None:
        """Marks a step's end; before the next step the caller waits for the end of the one
        before this (at most two steps in flight: the CPU stays ahead of the GPU by a step, as a
        serving engine that samples each step would, and never blocks in a full launch queue)."""
        if not self.cuda:
            return
        event = torch.cuda.Event()
        event.record()
        ends.append(event)
        if len(ends) >= 2:
            self._await(ends[-2])

    def _layer(self, layer: int, call: Callable[[int], None]) -> int:
        """One layer: the producer, `call(layer)` (its thread CPU time is returned: the
        caller's CPU per call), the consumer; stamped around each part when traced."""
        tr, m = self.tracer, self.m
        if tr:
            tr.stamp(layer, 0)
        m.produce(layer)
        if tr:
            tr.stamp(layer, 1)
        t0 = time.thread_time_ns()
        call(layer)
        t1 = time.thread_time_ns()
        if tr:
            tr.stamp(layer, 2)
        m.consume(layer)
        if tr:
            tr.stamp(layer, 3)
        return t1 - t0

    def _watched_loop(self, layer_fn, force: Callable[[], None]) -> tuple[dict, bool]:
        """_loop(layer_fn) under a watchdog: the daemon never answering (a refused device word,
        a lost call) would leave the stream waiting forever and the loop blocked in a launch,
        so past twice --stream-timeout `force()` (storing UNSTICK into the done words) runs
        every 50 ms until the loop ends, as it does from _await once a step is late. (result,
        whether the run stalled)."""
        finished = threading.Event()
        stuck: list[float] = []

        def watchdog() -> None:
            if finished.wait(2 * self.a.stream_timeout):  # the whole run
                return
            stuck.append(time.monotonic())
            while not finished.wait(0.05):
                force()

        guard = threading.Thread(target=watchdog, daemon=True)
        guard.start()
        self.stuck, self.unstick = False, force
        try:
            r = self._loop(layer_fn)
        finally:
            finished.set()
            guard.join()
            self.unstick = None
        return r, bool(stuck) or self.stuck

    def _loop(self, layer_fn) -> dict:
        """Warm-up steps, a wait for the stream, then the measured steps: no synchronise; the
        thread runs at most two steps ahead of the stream (_step_end)."""
        a, m = self.a, self.m
        ends: list = []
        for _ in range(a.warmup):
            self.seq += 1
            for layer in range(m.layers):
                layer_fn(layer, self.seq)
            self._step_end(ends)
        self._await(ends[-1] if ends else None)
        sync(self.cuda)
        timer = Timer(self.cuda, a.steps)
        cpu_ns, calls = 0, 0
        before = scrape(a.metrics)
        wall = time.perf_counter()
        for i in range(a.steps):
            self.seq += 1
            if self.tracer is not None:
                self.tracer.step = i
            timer.start(i)
            for layer in range(m.layers):
                cpu_ns += layer_fn(layer, self.seq)
                calls += 1
            timer.stop(i)
            self._step_end(ends)
        self._await(ends[-1] if ends else None)
        sync(self.cuda)
        if self.tracer is not None:
            self.tracer.step = None
        wall = time.perf_counter() - wall
        times = timer.step_us()
        result = {
            "step_us": statistics.median(times),
            "step_us_min": min(times),
            "step_us_max": max(times),
            "caller_cpu_us_per_call": cpu_ns / calls / 1e3,
            "host_wall_us_per_step": wall / a.steps * 1e6,
        }
        result.update(daemon_times(before, scrape(a.metrics)))
        return result

    def inproc(self, lib: Inproc, form: str = "stream") -> dict:
        """The in-process chain: the call's launches on the stream (form "stream"), or each
        layer's call captured once into a CUDA graph ("graph") or into the daemon's
        device-ordered form ("cond"), launched per layer."""
        m = self.m
        stream = torch.cuda.current_stream().cuda_stream
        shape = m.inproc_shape()
        ptrs = [m.inproc_ptrs(layer) for layer in range(m.layers)]
        need = lib.call(shape, ptrs[0], stream, None, 0)
        ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
        graphs: list[int] = []
        if form != "stream":
            code = {"graph": 0, "cond": 1, "cond_empty": 2, "cond_child": 3, "cond_memset_out": 4}[
                form
            ]
            graphs = [lib.capture(shape, p, ws.data_ptr(), need, code) for p in ptrs]

        def launch(layer: int) -> None:
            if graphs:
                lib.launch(graphs[layer], stream)
            else:
                lib.call(shape, ptrs[layer], stream, ws.data_ptr(), need)

        r = self._loop(lambda layer, _n: self._layer(layer, launch))
        r["workspace_bytes"] = need
        return r

    def blocking(self) -> dict:
        m, client = self.m, self.client
        args = [m.args(layer) for layer in range(m.layers)]
        stats: list[float] = []

        def layer_fn(layer: int, _n: int) -> int:
            m.produce(layer)
            t0 = time.thread_time_ns()
            res = client.dsa_attention(timeout=600, **args[layer])
            t1 = time.thread_time_ns()
            s = res.stats
            stats.append((s.total_seconds - s.compute_seconds) * 1e6)
            m.consume(layer)
            return t1 - t0

        r = self._loop(layer_fn)
        r["daemon_added_us_per_call_p50"] = statistics.median(stats[-m.layers * self.a.steps :])
        return r

    def blocking_ring(self, spin: float) -> dict:
        """The blocking form through a submission ring (docs/SERVICE.md "Blocking calls
        through a ring"): per layer the stream is synchronised (inputs complete, as a blocking
        client does), the layer's prepared call goes through the ring and the thread waits for
        its done word (polling it for `spin` seconds first), then the consumer runs."""
        m, client = self.m, self.client
        words = HostWords(client, m.layers, False)
        ids = [
            client.prepare_call("dsa_attention", timeout=600, **m.args(layer))
            for layer in range(m.layers)
        ]
        entries = 1 << max(6, (2 * m.layers - 1).bit_length())
        ring_region = client.create_host_region(
            f"ds-ring-{os.getpid()}-{next(_names)}", ring_bytes(entries)
        )
        ring = None
        try:
            ring = client.open_ring(ring_region, 0, entries, signals=words.host)
            counts = [0] * m.layers
            wall: list[float] = []

            def layer_fn(layer: int, _n: int) -> int:
                m.produce(layer)
                t0 = time.thread_time_ns()
                sync(self.cuda)
                w0 = time.perf_counter()
                counts[layer] += 1
                ring.call(ids[layer], words.words[layer], counts[layer], timeout=600, spin=spin)
                wall.append((time.perf_counter() - w0) * 1e6)
                t1 = time.thread_time_ns()
                m.consume(layer)
                return t1 - t0

            r = self._loop(layer_fn)
            r["client_wall_us_per_call_p50"] = statistics.median(wall[-m.layers * self.a.steps :])
            r["wait_spin_us"] = spin * 1e6
            return r
        finally:
            if ring is not None:
                ring.close()
            ring_region.close()
            for call_id in ids:
                client.release_call(call_id)
            words.close()

    def ordered_caller(self, bound: bool = False) -> dict:
        """The stream-ordered path through the client library's OrderedCaller (--submit
        ordered): per layer one caller.call(...) with the layer's torch tensors on the current
        stream (its prepared call made on the first step and cached by the tensors' regions,
        host-region signal words); with `bound` (--submit bound) each layer's call is bound
        once (caller.bind) and run by `bound(stream)`. The caller CPU per call is the
        library's whole cost (on a CPU daemon the call is host-ordered and waited for in the
        layer)."""
        m, client = self.m, self.client
        stream = torch.cuda.current_stream().cuda_stream if self.cuda else None
        caller = client.ordered_caller(depth=4 * m.layers, timeout=self.a.stream_timeout)
        # Each layer's tensors are built once (the static buffers a graph-replaying engine
        # holds), as the ring and rpc paths' call ids are: the figure is the library's cost.
        # The per-call cost of building them (m.args: five tensor views) is reported apart.
        args = [m.args(layer) for layer in range(m.layers)]
        t0 = time.thread_time_ns()
        for layer in range(m.layers):
            m.args(layer)
        args_ns = (time.thread_time_ns() - t0) / m.layers
        profile = None
        if self.a.profile_calls:
            import cProfile

            profile = cProfile.Profile()

        bound_calls = (
            [caller.bind("dsa_attention", **args[layer]) for layer in range(m.layers)]
            if bound
            else None
        )

        def call(layer: int) -> None:
            if profile is not None:
                profile.enable()
            if bound_calls is not None:
                bound_calls[layer](stream)
            else:
                caller.call("dsa_attention", stream=stream, **args[layer])
            if profile is not None:
                profile.disable()
            if stream is None:
                caller.wait()

        def force() -> None:
            caller.abort()  # the pending calls' done words get the failure bit: the stream goes on

        stuck = True
        try:
            r, stuck = self._watched_loop(lambda layer, _n: self._layer(layer, call), force)
            if not stuck:
                caller.wait()
        finally:
            prepares = caller.prepares
            if stuck:
                caller.abort()  # their words as failed: close() need not wait
                with contextlib.suppress(ac.AttndError):
                    caller.close()
            else:
                caller.close()
        if stuck:
            raise TimeoutError(f"the stream stalled (--stream-timeout {self.a.stream_timeout} s)")
        r["failed_layers"] = 0  # wait() raised otherwise
        r["done_words_ok"] = True
        r["prepares"] = prepares
        r["arguments"] = "bound" if bound else "prebuilt"
        r["args_cpu_us_per_call"] = args_ns / 1e3
        if profile is not None:
            import io
            import pstats

            # The profiler runs inside each timed call: this line's caller CPU is not comparable.
            r["profiled"] = True

            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
            with open(self.a.profile_calls, "a") as f:
                f.write(f"# decode_step ordered caller, batch {m.batch}, warm-up included\n")
                f.write(text.getvalue())
        return r

    def stream_ordered(self, signals: str, submit: str) -> dict:
        if submit in ("ordered", "bound"):
            if signals != "host":
                raise NotImplementedError(f"--submit {submit}: host signal words only")
            return self.ordered_caller(bound=submit == "bound")
        m, client = self.m, self.client
        words = (
            DeviceWords(client, 2 * m.layers)
            if signals == "device"
            else HostWords(client, 2 * m.layers, self.cuda)
        )
        ready = list(range(0, 2 * m.layers, 2))
        done = list(range(1, 2 * m.layers, 2))
        ids = [
            client.prepare_call("dsa_attention", timeout=600, **m.args(layer))
            for layer in range(m.layers)
        ]
        ring = ring_region = None
        stream = torch.cuda.current_stream().cuda_stream if self.cuda else 0
        try:
            if submit == "ring":
                entries = 1 << max(6, (2 * m.layers - 1).bit_length())
                ring_region = client.create_host_region(
                    f"ds-ring-{os.getpid()}-{next(_names)}", ring_bytes(entries)
                )
                # The words' HostRegion when they are host words (SubmissionRing.call checks
                # words against it), else the device region's name.
                host = getattr(words, "host", None)
                ring = client.open_ring(
                    ring_region, 0, entries, signals=host if host is not None else words.region
                )
            self.seq = max(self.seq, max(words.value(i) for i in range(2 * m.layers)))

            def submit_layer(layer: int, n: int) -> None:
                r_off, d_off = words.offset(ready[layer]), words.offset(done[layer])
                if ring is not None:
                    while not ring.submit(ids[layer], r_off, n, d_off, n):
                        time.sleep(20e-6)  # full: the daemon's poller frees slots
                else:
                    client.run_prepared(
                        ids[layer],
                        ready=Signal(words.region, r_off, n),
                        done=Signal(words.region, d_off, n),
                        timeout=600,
                    )
                words.write(ready[layer], n, stream)
                words.wait(done[layer], n, stream)

            side = torch.cuda.Stream() if self.cuda else None
            forced: list[list[int]] = []  # the done words as the first forcing found them
            force_lock = threading.Lock()

            def force() -> None:
                with force_lock:
                    if not forced:
                        forced.append(words.peek(done, side))
                    words.unstick(done, side)

            r, stuck = self._watched_loop(
                lambda layer, n: self._layer(layer, lambda _: submit_layer(layer, n)), force
            )
            if stuck:
                seen = forced[0] if forced else []
                failed = [v for v in seen if v & FAILURE_BIT]
                rest = [v for v in seen if not v & FAILURE_BIT]
                # A failed call's done word (n | FAILURE_BIT, bit 62) ends a stream's wait for n
                # (docs/SERVICE.md "Failure bit"): a stall is a word the daemon never wrote.
                raise TimeoutError(
                    f"the stream or the step loop stalled (--stream-timeout {self.a.stream_timeout} s): "
                    f"before UNSTICK was stored, {len(failed)} done words had the failure bit, "
                    f"the others were {min(rest, default=None)}..{max(rest, default=None)} "
                    f"(step {self.seq})"
                )
            failed = [layer for layer in range(m.layers) if words.value(done[layer]) & FAILURE_BIT]
            stale = [layer for layer in range(m.layers) if words.value(done[layer]) != self.seq]
            r["failed_layers"] = len(failed)
            r["done_words_ok"] = not failed and not stale
            if failed or stale:
                r["error"] = (
                    f"done words: {len(failed)} layers failed, {len(stale)} not at {self.seq}"
                )
            return r
        finally:
            if ring is not None:
                ring.close()
            if ring_region is not None:
                ring_region.close()
            for call_id in ids:
                client.release_call(call_id)
            words.close()

    def check(self, lib: Inproc | None) -> dict:
        """The last layer's out (left by the measured path) against the baseline's kernels on
        the same inputs (CUDA), or a blocking attnd call (no baseline)."""
        m = self.m
        sync(self.cuda)
        layer = m.layers - 1
        got = m.out[layer].clone()
        m.check_out.fill_(float("nan"))
        if lib is not None:
            stream = torch.cuda.current_stream().cuda_stream
            shape, ptrs = m.inproc_shape(), m.inproc_ptrs(layer, check=True)
            need = lib.call(shape, ptrs, stream, None, 0)
            ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
            lib.call(shape, ptrs, stream, ws.data_ptr(), need)
            against = "inproc"
        else:
            self.client.dsa_attention(timeout=600, **m.args(layer, check=True))
            against = "blocking"
        sync(self.cuda)
        want = m.check_out
        if torch.isnan(got.float()).any():
            return {"check": "fail", "check_against": against, "check_detail": "NaN in out"}
        if torch.equal(got.view(torch.int16), want.view(torch.int16)):
            return {"check": "bitwise", "check_against": against}
        diff = (got.float() - want.float()).abs()
        scale = want.float().abs().max().item()
        rel_l2 = (diff.norm() / want.float().norm().clamp_min(1e-30)).item()
        ok = rel_l2 <= 1e-2 and diff.max().item() <= 2e-2 * max(scale, 1.0)
        return {
            "check": "close" if ok else "fail",
            "check_against": against,
            "check_max_abs": diff.max().item(),
            "check_rel_l2": rel_l2,
        }


def write_trace(path: str, line: dict) -> None:
    print("  trace: " + json.dumps(line), flush=True)
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--metrics", help="the daemon's /metrics URL (daemon-side times)")
    p.add_argument("--out", required=True, help="append one JSON line per configuration here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--batch", type=int, nargs="+", default=[64, 128])
    p.add_argument(
        "--paths", nargs="+", default=["stream_ordered", "blocking"],
        choices=("stream_ordered", "blocking"),
    )  # fmt: skip
    p.add_argument("--signals", nargs="+", default=["host"], choices=("host", "device"))
    p.add_argument(
        "--submit", choices=("ring", "rpc", "ordered", "bound"), default="ring",
        help="stream_ordered path: a hand-written ring, RunPrepared RPCs, the client's "
        "OrderedCaller (caller.call per layer; host words), or its bound calls (caller.bind "
        "once per layer, bound(stream) per call; host words)",
    )  # fmt: skip
    p.add_argument(
        "--blocking-via", nargs="+", default=["call"], choices=("call", "ring"),
        help="blocking path: the DsaAttention call, and/or the prepared call through a "
        "submission ring waited for by its done word (SubmissionRing.call)",
    )  # fmt: skip
    p.add_argument(
        "--wait-spin", type=float, default=2e-3,
        help="blocking via ring: seconds the caller polls its done word before sleeping",
    )  # fmt: skip
    p.add_argument("--inproc", help="libattnd_inproc.so (CUDA): the in-process baseline")
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--blocking-steps", type=int, default=5, help="steps of the blocking path")
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--d-qk", type=int, default=576)
    p.add_argument("--ctx", type=int, default=32768)
    p.add_argument("--index-heads", type=int, default=64)
    p.add_argument("--index-dim", type=int, default=128)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--tiny", action="store_true", help="a CPU smoke test's shapes")
    p.add_argument(
        "--stream-timeout", type=float, default=25.0,
        help="seconds a stream-ordered run may take before its done words are forced",
    )  # fmt: skip
    p.add_argument("--commit")
    p.add_argument("--seed", type=int, default=20261202)
    p.add_argument(
        "--profile-calls",
        help="--submit ordered: profile the caller.call()s (cProfile, warm-up steps included) "
        "and append the 30 costliest functions here",
    )
    p.add_argument(
        "--trace",
        help="also run every CUDA configuration once more with %%globaltimer stamps around each "
        "layer's parts (needs --inproc) and append its segment medians here as JSON lines",
    )
    p.add_argument(
        "--torch-stream",
        choices=("default", "new"),
        default="default",
        help="the frontend's stream: torch's default (the legacy default stream) or a new one",
    )
    p.add_argument(
        "--inproc-forms",
        nargs="*",
        default=[],
        choices=("graph", "cond", "cond_empty", "cond_child", "cond_memset_out"),
        help="more in-process chains, a line each (path inproc_<form>): each layer's call "
        "captured into a CUDA graph (graph), into the daemon's device-ordered form (cond), the "
        "same with an empty conditional body and the op after it (cond_empty), with the op "
        "a child graph in the body (cond_child), or with the op's memsets moved before the gate "
        "(cond_memset_out)",
    )
    p.add_argument(
        "--daemon-trace",
        help="the file the daemon writes its device-ordered call trace to (ATTND_ORDERED_TRACE, "
        "same host): --trace then splits the attnd segment at the daemon's stamps",
    )
    a = p.parse_args()
    if a.tiny:
        a.heads, a.ctx, a.index_heads, a.topk, a.block_size = 16, 256, 8, 64, 16
        a.layers, a.steps, a.warmup, a.blocking_steps = min(a.layers, 4), 3, 1, 2
        a.batch = sorted({min(b, 2 + (b > 64)) for b in a.batch})
    cuda = a.device == "cuda"
    if cuda and a.torch_stream == "new":
        # Every chain (in process and through attnd) on a stream of its own instead of the
        # legacy default stream, which synchronises with the process's other blocking streams.
        torch.cuda.set_stream(torch.cuda.Stream())
    lib = Inproc(a.inproc) if a.inproc and cuda else None
    rc = 0
    with ac.Client(a.target, timeout=600) as client:
        client.wait_ready(timeout=60)
        info = client.info()
        dev0 = info.devices[0] if info.devices else None
        mps = bool(getattr(dev0, "mps", False))
        device_name = dev0.name if dev0 is not None else info.backend
        if cuda:
            client.device_regions(keep_alive=True)
        common = {
            "op": "decode_step",
            "client": "python",
            "mps": mps,
            "commit": commit_of(a.commit),
            "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
            "device": device_name,
            "backend": info.backend,
            "layers": a.layers,
            "submit": a.submit,
            "heads": a.heads,
            "d_qk": a.d_qk,
            "ctx": a.ctx,
            "topk": a.topk,
            "kv": "fp8_656",
            "next_n": 1,
            "torch_stream": a.torch_stream,
        }
        for batch in a.batch:
            ctx = f"{a.ctx // 1024}k" if a.ctx % 1024 == 0 else str(a.ctx)
            preset = f"b{batch}_h{a.heads}_ctx{ctx}_fp8"
            print(f"== {preset}: building the caches", flush=True)
            model = Model(a, batch, client)
            runner = Runner(a, model, client)
            baseline = {}
            if lib is not None:
                try:
                    baseline = runner.inproc(lib)
                    print(f"  inproc baseline: {baseline['step_us']:.1f} us/step", flush=True)
                except Exception as e:  # the attnd lines still come, without a baseline
                    traceback.print_exc()
                    common_error = f"baseline: {type(e).__name__}: {e}"[:300]
                    baseline, rc = {}, 1
                    sync(cuda)
                    print(common_error, flush=True)
            for form in a.inproc_forms if lib is not None and baseline else []:
                line = dict(common, preset=preset, batch=batch, path=f"inproc_{form}")
                try:
                    r = runner.inproc(lib, form)
                    line.update(step_us=r["step_us"], baseline_step_us=baseline["step_us"])
                    line["added_us_per_layer"] = (r["step_us"] - baseline["step_us"]) / a.layers
                except Exception as e:
                    traceback.print_exc()
                    line["error"] = f"{type(e).__name__}: {e}"[:300]
                    sync(cuda)
                print(json.dumps(line), flush=True)
                with open(a.out, "a") as f:
                    f.write(json.dumps(line) + "\n")
                if a.trace and lib.stamp_fn is not None and not line.get("error"):
                    runner.tracer = Tracer(lib, a.steps, model.layers)
                    try:
                        runner.inproc(lib, form)
                        summary = runner.tracer.summary(None, None)
                    finally:
                        runner.tracer = None
                    write_trace(
                        a.trace, dict(common, preset=preset, path=f"inproc_{form}", **summary)
                    )
            traced = bool(a.trace and lib is not None and lib.stamp_fn is not None)
            if a.trace and not traced:
                print("  --trace needs --inproc with attnd_inproc_stamp: not traced", flush=True)
            if traced and baseline:
                runner.tracer = Tracer(lib, a.steps, model.layers)
                try:
                    runner.inproc(lib)
                    summary = runner.tracer.summary(None, None)
                finally:
                    runner.tracer = None
                write_trace(a.trace, dict(common, preset=preset, path="inproc", **summary))
            # Device signal words last: a daemon that mishandles them costs the least there.
            # (path, signals or the blocking form)
            configs = [
                (path, sig)
                for path in a.paths
                for sig in (a.signals if path != "blocking" else a.blocking_via)
            ]
            configs.sort(key=lambda c: c[1] == "device")
            for path, sig in configs:
                line = dict(common, preset=preset, batch=batch, path=path)
                line["signals"] = sig if path != "blocking" else None
                line["blocking_via"] = sig if path == "blocking" else None
                # Every line has the measured fields; a failed configuration keeps them null.
                line["step_us"] = line["caller_cpu_us_per_call"] = None
                steps = a.steps if path == "stream_ordered" else a.blocking_steps
                line["steps"] = steps
                saved = a.steps
                a.steps = steps
                try:
                    if sig == "device" and not cuda:
                        raise NotImplementedError("device signals need CUDA")
                    if path == "blocking" and sig == "ring":
                        r = runner.blocking_ring(a.wait_spin)
                    elif path == "blocking":
                        r = runner.blocking()
                    else:
                        r = runner.stream_ordered(sig, a.submit)
                    line.update(r)
                    line.update(runner.check(lib))
                    if line.get("check") == "fail" or line.get("error"):
                        rc = 1
                except Exception as e:  # a refused configuration is a line, not the end
                    traceback.print_exc()
                    line["error"] = f"{type(e).__name__}: {e}"[:500]
                    # A daemon without the device-side wait refuses device signal words.
                    refused = "INVALID_ARGUMENT" in line["error"] or not cuda
                    if not (sig == "device" and refused):
                        rc = 1
                    sync(cuda)
                finally:
                    a.steps = saved
                if baseline:
                    line["baseline_step_us"] = baseline["step_us"]
                    line["baseline_caller_cpu_us_per_call"] = baseline["caller_cpu_us_per_call"]
                    if line["step_us"] is not None:
                        line["added_us_per_layer"] = (
                            line["step_us"] - baseline["step_us"]
                        ) / a.layers
                else:
                    line["baseline_step_us"] = None
                    line["added_us_per_layer"] = None
                print(json.dumps(line), flush=True)
                with open(a.out, "a") as f:
                    f.write(json.dumps(line) + "\n")
                if traced and path == "stream_ordered" and not line.get("error"):
                    runner.tracer = Tracer(lib, steps, model.layers)
                    try:
                        r = runner.stream_ordered(sig, a.submit)
                        first = int(runner.tracer.buf.view(-1, 4)[:, 0].min().item())
                        summary = runner.tracer.summary(a.daemon_trace, first)
                        summary["step_us"] = r["step_us"]
                    except Exception as e:
                        traceback.print_exc()
                        summary = {"error": f"{type(e).__name__}: {e}"[:300]}
                        sync(cuda)
                    finally:
                        runner.tracer = None
                    write_trace(
                        a.trace,
                        dict(common, preset=preset, path=path, signals=sig, **summary),
                    )
            model.close()
            del runner, model
            if cuda:
                torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    sys.exit(main())
