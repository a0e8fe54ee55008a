#!/usr/bin/env python3
"""The frontend test on a GPU host: a PyTorch "serving frontend" allocates its tensors
on the GPU, registers them with a running attnd as device regions through their storages' CUDA
IPC handles, calls SparseMla, MlaDecode, IndexerLogits and DsaAttention with every input and
output in device regions, runs a stream-ordered SparseMla chain whose signals its own CUDA
stream writes and waits on (by hand, through the client's OrderedCaller, and through the
attnd::sparse_mla torch op bound ordered), and checks the results against the same formulas
written out in PyTorch (float64 on the GPU). /metrics must show zero tensor bytes copied for these calls.

    PYTHONPATH=bundle/python python3 frontend_test.py --target unix:/tmp/x/attnd.sock \\
        --metrics http://127.0.0.1:9464/metrics [--json out.json]

Run by gpu-tests/run_frontend.sh (which starts the bundled daemon). Needs torch and grpcio; the
attnd_client package comes from the bundle. Exit status 0 when every check passed.
"""

import argparse
import json
import math
import re
import sys
import time
import traceback
import urllib.request

import grpc
import torch

import attnd_client as ac

DEV = torch.device("cuda", 0)
NEG_INF = float("-inf")
DIRECTIONS = ("in", "out", "host_to_device", "device_to_host")


# ---- plumbing ----


def scrape(url):
    """{(family, labels): value} of a Prometheus text page."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$', line)
        if m:
            samples[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return samples


def copied(samples, direction):
    return samples.get(("attnd_copied_bytes_total", f'{{direction="{direction}"}}'), 0.0)


GRAPHS = True  # the daemon captures graphs (--graphs on the command line)


def nan_like(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def fp8(shape, scale=1.0):
    return (torch.randn(shape, device=DEV) * scale).to(torch.float8_e4m3fn)


class Checks:
    def __init__(self):
        self.failures = []
        self.report = {}

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            print(f"  FAIL {what}", flush=True)
        return ok

    def close(self, got, ref, what, rel_l2, atol, rtol):
        """got (any float dtype) vs ref (float64): equal infinities, relative L2 and per-element
        |got - ref| <= atol + rtol |ref| over the finite reference values; no NaN anywhere."""
        got = got.double()
        finite = torch.isfinite(ref)
        ok = self.expect(
            not torch.isnan(got).any().item(),
            f"{what}: NaN in the result (an element left unwritten?)",
        )
        ok &= self.expect(
            torch.equal(got[~finite], ref[~finite]), f"{what}: infinities differ from the reference"
        )
        g, r = got[finite], ref[finite]
        if r.numel() == 0:
            return ok
        err = torch.linalg.norm(g - r).item() / max(torch.linalg.norm(r).item(), 1e-30)
        bad = (g - r).abs() > atol + rtol * r.abs()
        ok &= self.expect(err <= rel_l2, f"{what}: relative L2 error {err:.3g} > {rel_l2}")
        ok &= self.expect(
            not bad.any().item(),
            f"{what}: {int(bad.sum())} elements off (worst {(g - r).abs().max().item():.3g})",
        )
        print(f"  {what}: rel L2 {err:.2e}, max abs {(g - r).abs().max().item():.2e}")
        return ok

    def zero_copy(self, result, op):
        s = result.stats
        figures = {
            f: getattr(s, f, 0)
            for f in (
                "copied_bytes_in",
                "copied_bytes_out",
                "copied_bytes_host_to_device",
                "copied_bytes_device_to_host",
                "count_readback_bytes",
            )
        }
        for f in (
            "copied_bytes_in",
            "copied_bytes_out",
            "copied_bytes_host_to_device",
            "copied_bytes_device_to_host",
        ):
            self.expect(figures[f] == 0, f"{op}: stats.{f} = {figures[f]}, want 0")
        self.report[op] = dict(
            figures,
            impl=s.impl,
            compute_us=s.compute_seconds * 1e6,
            graph=getattr(s, "graph", ""),
            device=getattr(s, "device_uuid", ""),
            work_count=getattr(s, "work_count", ""),
            flops=s.flops,
            logical_bytes=s.logical_bytes,
        )
        print(
            f"  {op}: impl {s.impl}, {s.compute_seconds * 1e6:.1f} us on the device, graph "
            f"{getattr(s, 'graph', '?')}, work count {getattr(s, 'work_count', '?')} "
            f"(readback {figures['count_readback_bytes']} B)"
        )


# ---- references (float64 on the GPU) ----


def ref_sparse_mla(q, kv, indices, sm_scale):
    """out [T,H,512], lse [T,H]: softmax over each token's valid selected rows (index in [0,S))."""
    q64, kv64 = q.double(), kv.double()
    s = kv.shape[0]
    valid = (indices >= 0) & (indices < s)
    rows = kv64[indices.clamp(0, s - 1).long()]  # [T,K,d_qk]
    scores = torch.einsum("thd,tkd->thk", q64, rows) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], NEG_INF)
    lse = torch.logsumexp(scores, dim=-1)  # -inf for an empty row
    p = torch.nan_to_num(torch.exp(scores - lse[..., None]), nan=0.0)
    return torch.einsum("thk,tkd->thd", p, rows[..., :512]), lse


def ref_mla_decode(q, kv_cache, block_table, seqlens, sm_scale, causal):
    b_count, s_q, h, _ = q.shape
    pages, page, _ = kv_cache.shape
    out = torch.zeros(b_count, s_q, h, 512, dtype=torch.float64, device=DEV)
    lse = torch.full((b_count, s_q, h), NEG_INF, dtype=torch.float64, device=DEV)
    for b in range(b_count):
        seqlen = max(0, min(int(seqlens[b]), block_table.shape[1] * page))
        n = torch.arange(seqlen, device=DEV)
        ids = block_table[b, n // page].long()
        valid = (ids >= 0) & (ids < pages)
        rows = kv_cache[ids.clamp(0, pages - 1), n % page].double()  # [n, d_qk]
        scores = torch.einsum("shd,nd->shn", q[b].double(), rows) * sm_scale
        visible = valid[None, :].expand(s_q, seqlen).clone()
        if causal:
            limit = seqlen - s_q + torch.arange(s_q, device=DEV) + 1  # query i sees n < limit
            visible &= n[None, :] < limit[:, None]
        scores = scores.masked_fill(~visible[:, None, :], NEG_INF)
        lse[b] = torch.logsumexp(scores, dim=-1)
        p = torch.nan_to_num(torch.exp(scores - lse[b][..., None]), nan=0.0)
        out[b] = torch.einsum("shn,nd->shd", p, rows[:, :512])
    return out, lse


def ref_indexer(q, k, k_scale, weights, ks, ke):
    """logits[m,n] = sum_h relu(q[m,h].k[n]) k_scale[n] w[m,h] on [max(ks,0), min(ke,N)), -inf
    elsewhere."""
    n = k.shape[0]
    dots = torch.einsum("mhd,nd->mhn", q.to(torch.float32).double(), k.to(torch.float32).double())
    logits = torch.einsum("mhn,mh->mn", dots.clamp_min(0), weights.double()) * k_scale.double()
    col = torch.arange(n, device=DEV)[None, :]
    inside = (col >= ks.long().clamp_min(0)[:, None]) & (col < ke.long().clamp_max(n)[:, None])
    return logits.masked_fill(~inside, NEG_INF)


# ---- the calls ----


def run_sparse_mla(client, checks):
    t, h, d_qk, s, k = 48, 64, 576, 8192, 512
    q = torch.randn(t, h, d_qk, device=DEV).bfloat16()
    cache = torch.randn(s, 640, device=DEV).bfloat16()  # kv is a strided view of a wider cache
    kv = cache[:, :d_qk]
    indices = torch.randint(-64, s + 64, (t, k), dtype=torch.int32, device=DEV)  # some masked
    indices[3] = -1  # an empty row
    out, lse = nan_like((t, h, 512), torch.bfloat16), nan_like((t, h), torch.float32)
    scale = 1 / math.sqrt(d_qk)
    # The inputs come from a side stream; the daemon waits on the recorded IPC event in-stream.
    ready = torch.cuda.Event(interprocess=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q.mul_(1.0)
    ready.record(side)
    results = []
    for _ in range(2):
        res = client.sparse_mla(
            ready_event=bytes(ready.ipc_handle()),
            q=q,
            kv=kv,
            indices=indices,
            sm_scale=scale,
            out=out,
            lse=lse,
            timeout=300,
        )
        results.append(res)
    ref_out, ref_lse = ref_sparse_mla(q, kv, indices, scale)
    checks.close(out, ref_out, "sparse_mla out", 1e-2, 2e-2, 2e-2)
    checks.close(lse, ref_lse, "sparse_mla lse", 1e-4, 2e-3, 0)
    checks.zero_copy(results[0], "sparse_mla")
    graph = results[1].stats.graph
    if GRAPHS:
        checks.expect(
            graph == "hit",
            f"sparse_mla: the repeated call's graph is {graph!r}, "
            "want 'hit' (same launch key, same pointers)",
        )
    else:
        checks.expect(graph == "", f"sparse_mla: graph {graph!r} with --graphs=false, want ''")


def chain_inputs():
    """The stream-ordered chains' SparseMla (T 16, H 64, d_qk 576, S 4096, K 256): (t, h, d_qk,
    scale, q, kv, indices, out, lse), the outputs NaN-poisoned."""
    t, h, d_qk, s, k = 16, 64, 576, 4096, 256
    q = torch.randn(t, h, d_qk, device=DEV).bfloat16()
    kv = torch.randn(s, d_qk, device=DEV).bfloat16()
    indices = torch.randint(0, s, (t, k), dtype=torch.int32, device=DEV)
    out, lse = nan_like((t, h, 512), torch.bfloat16), nan_like((t, h), torch.float32)
    return t, h, d_qk, 1 / math.sqrt(d_qk), q, kv, indices, out, lse


def run_stream_ordered(client, checks):
    """A stream-ordered SparseMla chain driven by the caller's own CUDA stream: each step's q is
    produced on torch's current stream behind a GPU busy-wait (so the daemon must wait for it),
    the stream writes `ready` (cuStreamWriteValue64 into a host region), waits for `done`
    (cuStreamWaitValue64) and copies `out`; the thread never synchronises until the end. Every
    copy must match the reference of its own step's q: a copy taken before the daemon wrote
    `out` would be NaN (poisoned) or the previous step's."""
    from attnd_client.cuda_signals import StreamSignals
    from attnd_client.stream_ordered import FAILURE_BIT, SignalWord

    t, h, d_qk, scale, q, kv, indices, out, lse = chain_inputs()
    args = dict(q=q, kv=kv, indices=indices, sm_scale=scale, out=out, lse=lse)
    client.sparse_mla(timeout=300, **args)  # registers the device regions once
    region = client.create_host_region(f"signals-{id(q)}", 4096)
    ready, done = SignalWord(region), SignalWord(region)
    stream = torch.cuda.current_stream()
    steps, qs, outs, caller_us = 4, [], [], []
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    with StreamSignals(region) as signals:
        for n in range(1, steps + 1):
            start = time.perf_counter()
            torch.cuda._sleep(20_000_000)  # the GPU busy for milliseconds before q is ready
            q.copy_(torch.randn(t, h, d_qk, device=DEV).bfloat16())
            qs.append(q.clone())
            client.enqueue("sparse_mla", ready=ready.signal(n), done=done.signal(n), **args)
            signals.write(ready, n, stream.cuda_stream)
            signals.wait(done, n, stream.cuda_stream)
            outs.append(out.clone())
            caller_us.append((time.perf_counter() - start) * 1e6)
        torch.cuda.synchronize()
    word = done.get()
    checks.expect(word == steps, f"stream-ordered: done word {word:#x}, want {steps}")
    checks.expect(not word & FAILURE_BIT, "stream-ordered: the failure bit is set")
    for n in range(steps):
        ref_out, _ = ref_sparse_mla(qs[n], kv, indices, scale)
        checks.close(outs[n], ref_out, f"stream-ordered step {n + 1} out", 1e-2, 2e-2, 2e-2)
    caller_us.sort()
    checks.report["stream_ordered_caller_us_p50"] = caller_us[len(caller_us) // 2]
    print(f"  caller CPU per step (enqueue + signal ops): {caller_us} us")
    region.close()


def run_ordered_caller(client, checks):
    """The chain of run_stream_ordered through the client's OrderedCaller (one caller.call per
    step on torch's current stream: one PrepareCall, then no RPC), then through the
    attnd::sparse_mla torch op with torch_ops.bind(client, ordered=True). Each step's q comes
    behind a GPU busy-wait; each step's copy of `out`, taken on the stream right after the
    call, must match its own q's reference (a copy taken before the daemon wrote `out` would be
    NaN or the previous step's)."""
    import attnd_client.torch_ops as attnd_ops

    t, h, d_qk, scale, q, kv, indices, out, lse = chain_inputs()
    stream = torch.cuda.current_stream()
    steps = 4
    torch.cuda.synchronize()

    def step(call):
        torch.cuda._sleep(20_000_000)  # the GPU busy for milliseconds before q is ready
        q.copy_(torch.randn(t, h, d_qk, device=DEV).bfloat16())
        start = time.perf_counter()
        call()
        us = (time.perf_counter() - start) * 1e6
        return q.clone(), out.clone(), us

    runs = {}
    with client.ordered_caller() as caller:
        args = dict(q=q, kv=kv, indices=indices, sm_scale=scale, out=out, lse=lse)
        runs["OrderedCaller"] = [
            step(lambda: caller.call("sparse_mla", stream=stream, **args)) for _ in range(steps)
        ]
        caller.wait(timeout=60)
        checks.expect(caller.prepares == 1, f"OrderedCaller: {caller.prepares} PrepareCalls")
    previous = attnd_ops.bind(client, ordered=True)
    try:
        runs["torch op, ordered"] = [
            step(lambda: torch.ops.attnd.sparse_mla(q, kv, indices, scale, out, lse))
            for _ in range(steps)
        ]
        prepares = attnd_ops.ordered_caller().prepares
        attnd_ops.synchronize(timeout=60)
        checks.expect(prepares == 1, f"torch op, ordered: {prepares} PrepareCalls")
    finally:
        attnd_ops.bind(previous)
    torch.cuda.synchronize()
    for name, run in runs.items():
        for n, (q_n, out_n, _) in enumerate(run):
            ref_out, _ = ref_sparse_mla(q_n, kv, indices, scale)
            checks.close(out_n, ref_out, f"{name} step {n + 1} out", 1e-2, 2e-2, 2e-2)
        us = sorted(u for _, _, u in run[1:])  # the first call prepares
        key = "ordered_caller_us_p50" if name == "OrderedCaller" else "torch_op_ordered_us_p50"
        checks.report[key] = us[len(us) // 2]
        print(f"  {name}: caller CPU per call after the first {[round(u, 1) for u in us]} us")


def run_mla_decode(client, checks):
    b, s_q, h, d_qk, page, max_pages, pages = 4, 2, 16, 576, 64, 24, 128
    q = torch.randn(b, s_q, h, d_qk, device=DEV).bfloat16()
    kv_cache = torch.randn(pages, page, d_qk, device=DEV).bfloat16()
    block_table = torch.randperm(pages, device=DEV)[: b * max_pages].reshape(b, max_pages).int()
    block_table[1, 2] = -1  # a masked page
    block_table[2, 0] = pages + 5  # an out-of-range page id
    seqlens = torch.tensor([1000, 1537, 64, 1], dtype=torch.int32, device=DEV)
    out, lse = nan_like((b, s_q, h, 512), torch.bfloat16), nan_like((b, s_q, h), torch.float32)
    scale = 1 / math.sqrt(d_qk)
    res = client.mla_decode(
        q=q,
        kv_cache=kv_cache,
        block_table=block_table,
        cache_seqlens=seqlens,
        sm_scale=scale,
        causal=True,
        out=out,
        lse=lse,
        timeout=300,
    )
    ref_out, ref_lse = ref_mla_decode(q, kv_cache, block_table, seqlens.tolist(), scale, True)
    checks.close(out, ref_out, "mla_decode out", 1e-2, 2e-2, 2e-2)
    checks.close(lse, ref_lse, "mla_decode lse", 1e-4, 2e-3, 0)
    checks.zero_copy(res, "mla_decode")


def indexer_inputs(m, n, h_i, d_i):
    q = fp8((m, h_i, d_i))
    k = fp8((n, d_i))
    k_scale = torch.rand(n, device=DEV) + 0.5
    weights = torch.randn(m, h_i, device=DEV) / math.sqrt(h_i)
    ke = torch.arange(n - m + 1, n + 1, dtype=torch.int32, device=DEV)  # causal prefill
    ks = torch.zeros(m, dtype=torch.int32, device=DEV)
    ks[5], ke[5] = 10, 10  # an empty window
    ks[6], ke[6] = n - 40, n + 100  # past the end
    return q, k, k_scale, weights, ks, ke


def run_indexer_logits(client, checks):
    m, n, h_i, d_i = 64, 2048, 64, 128
    q, k, k_scale, weights, ks, ke = indexer_inputs(m, n, h_i, d_i)
    wide = nan_like((m, n + 32), torch.float32)  # row stride ld > N: columns past N untouched
    logits = wide[:, :n]
    res = client.indexer_logits(
        q=q,
        k=k,
        k_scale=k_scale,
        weights=weights,
        ks=ks,
        ke=ke,
        logits=logits,
        timeout=300,
    )
    ref = ref_indexer(q, k, k_scale, weights, ks, ke)
    scale = ref[torch.isfinite(ref)].abs().max().item()
    checks.close(logits, ref, "indexer_logits", 1e-4, 1e-4 * scale, 1e-4)
    checks.expect(torch.isnan(wide[:, n:]).all().item(), "indexer_logits: wrote past column N")
    checks.zero_copy(res, "indexer_logits")


def run_dsa_attention(client, checks):
    t, n, h_i, d_i, h, d_qk, topk = 32, 1024, 64, 128, 16, 576, 128
    q_i, k_i, k_scale, weights, ks, ke = indexer_inputs(t, n, h_i, d_i)
    q = torch.randn(t, h, d_qk, device=DEV).bfloat16()
    kv = torch.randn(n, d_qk, device=DEV).bfloat16()
    out, lse = nan_like((t, h, 512), torch.bfloat16), nan_like((t, h), torch.float32)
    indices = torch.full((t, topk), -7, dtype=torch.int32, device=DEV)
    logits = nan_like((t, n), torch.float32)
    scale = 1 / math.sqrt(d_qk)
    res = client.dsa_attention(
        index_q=q_i,
        index_k=k_i,
        index_k_scale=k_scale,
        index_weights=weights,
        ks=ks,
        ke=ke,
        topk=topk,
        q=q,
        kv=kv,
        sm_scale=scale,
        out=out,
        lse=lse,
        indices=indices,
        logits=logits,
        timeout=300,
    )
    ref_logits = ref_indexer(q_i, k_i, k_scale, weights, ks, ke)
    big = ref_logits[torch.isfinite(ref_logits)].abs().max().item()
    checks.close(logits, ref_logits, "dsa_attention logits", 1e-4, 1e-4 * big, 1e-4)
    # The selection: min(topk, window) distinct in-window rows, a true top-k of the logits (up to
    # f32 rounding at the threshold), ascending, then -1.
    ok = True
    for r in range(t):
        lo, hi = max(int(ks[r]), 0), min(int(ke[r]), n)
        want = min(topk, max(hi - lo, 0))
        row = indices[r]
        chosen = row[:want]
        ok &= checks.expect(bool((row[want:] == -1).all()), f"dsa indices row {r}: not -1 padded")
        if want == 0:
            continue
        ok &= checks.expect(
            bool(((chosen >= lo) & (chosen < hi)).all()) and bool((chosen[1:] > chosen[:-1]).all()),
            f"dsa indices row {r}: not ascending distinct rows of the window",
        )
        mask = torch.zeros(n, dtype=torch.bool, device=DEV)
        mask[chosen.long().clamp(0, n - 1)] = True
        window = torch.zeros(n, dtype=torch.bool, device=DEV)
        window[lo:hi] = True
        rest = ref_logits[r][window & ~mask]
        if rest.numel():
            gap = ref_logits[r][mask].min().item() - rest.max().item()
            ok &= checks.expect(
                gap >= -1e-5 * big,
                f"dsa indices row {r}: not a top-k (a better row was left out by {-gap:.3g})",
            )
    ref_out, ref_lse = ref_sparse_mla(q, kv, indices, scale)
    checks.close(out, ref_out, "dsa_attention out", 1e-2, 2e-2, 2e-2)
    checks.close(lse, ref_lse, "dsa_attention lse", 1e-4, 2e-3, 0)
    checks.zero_copy(res, "dsa_attention")


def run_refusals(client, checks):
    q = torch.randn(2, 8, 576, device=DEV).bfloat16()
    kv = torch.randn(64, 576, device=DEV).bfloat16()
    idx = torch.zeros(2, 4, dtype=torch.int32, device=DEV)
    for extra, what in (
        ({"ready_event": b"short"}, "a 5-byte ready_event"),
        (
            {"device_uuid": "GPU-00000000-0000-0000-0000-000000000000"},
            "a device_uuid other than the regions' device",
        ),
    ):
        try:
            client.sparse_mla(
                **extra,
                q=q,
                kv=kv,
                indices=idx,
                sm_scale=0.1,
                out=nan_like((2, 8, 512), torch.bfloat16),
                timeout=300,
            )
            checks.expect(False, f"{what} was accepted")
        except ac.AttndError as e:
            checks.expect(
                e.code == grpc.StatusCode.INVALID_ARGUMENT,
                f"{what}: {e.code.name}, want INVALID_ARGUMENT",
            )


def run_vllm_device_decode(client, args, checks):
    """The vLLM plugin's fused decode kept on the GPU (attnd_vllm.calls.run_dsa_decode's device
    form: vLLM-shaped CUDA tensors as device regions, the kv rows -> positions step in torch)
    against its host path on NumPy copies of the same tensors: the same topk_indices_buffer,
    out and lse bytes; the device form copies no tensor bytes (/metrics)."""
    import os
    from types import SimpleNamespace

    import numpy as np

    try:
        from attnd_vllm import calls
    except ImportError as e:
        checks.expect(False, f"vLLM device form: attnd_vllm not importable ({e})")
        return
    b, next_n, h_i, h, bs, per, topk = 4, 2, 64, 16, 64, 6, 128
    num_blocks, t = b * per + 2, b * next_n
    seq = torch.randint(200, per * bs, (b,), dtype=torch.int32, device=DEV)
    seq2d = seq[:, None] - next_n + torch.arange(next_n, dtype=torch.int32, device=DEV) + 1
    table = torch.randperm(num_blocks, device=DEV)[: b * per].view(b, per).to(torch.int32)
    table = torch.cat([table, torch.zeros(b, 1, dtype=torch.int32, device=DEV)], 1)
    icache = torch.randint(0, 256, (num_blocks, bs, 132), dtype=torch.uint8, device=DEV)
    flat = icache.view(num_blocks, bs * 132)
    keys = flat[:, : bs * 128]
    keys[(keys & 0x7F) == 0x7F] = 0  # no NaN codes
    scales = torch.rand(num_blocks, bs, device=DEV) * 0.1 + 0.01
    flat[:, bs * 128 :] = scales.view(torch.uint8).view(num_blocks, bs * 4)
    mcache = torch.randn(num_blocks, bs, 576, device=DEV).to(torch.bfloat16)
    q_fp8 = fp8((t, h_i, 128))
    weights = torch.randn(t, h_i, device=DEV)
    q = torch.randn(t, h, 576, device=DEV).to(torch.bfloat16)
    lens = torch.full((b,), next_n, dtype=torch.int32, device=DEV)

    def step_of(tensor, draft=None):
        # draft: uneven draft counts per request (requires_padding; t = their sum), else even.
        n_tok = t if draft is None else int(sum(draft))
        decode = SimpleNamespace(
            block_table=tensor(table),
            seq_lens=tensor(seq2d),
            decode_lens=tensor(lens if draft is None else torch.tensor(draft, device=DEV)),
            requires_padding=draft is not None,
        )
        md = SimpleNamespace(decode=decode, num_prefills=0, num_decodes=b, num_decode_tokens=n_tok)
        return calls.DecodeStep(
            md, tensor(q_fp8[:n_tok]), tensor(weights[:n_tok]), tensor(icache), n_tok, 128, topk
        )

    def host(x):
        if x.dtype in (torch.bfloat16, torch.float8_e4m3fn):
            raw = x.view(torch.int16 if x.dtype == torch.bfloat16 else torch.uint8)
            a = raw.cpu().numpy()
            return a.view(np.uint16) if x.dtype == torch.bfloat16 else a
        return x.cpu().numpy()

    buf = torch.full((t + 2, topk), 12345, dtype=torch.int32, device=DEV)
    torch.cuda.synchronize()
    before = scrape(args.metrics)
    out, lse = calls.run_dsa_decode(client, step_of(lambda x: x), q, mcache, 0.07, buf)
    torch.cuda.synchronize()
    after = scrape(args.metrics)
    checks.expect(out.is_cuda and lse.is_cuda, "vLLM device form: out / lse on the GPU")
    for d in DIRECTIONS:
        delta = copied(after, d) - copied(before, d)
        checks.expect(delta == 0, f"vLLM device form: {delta:.0f} bytes copied ({d}), want 0")
    hbuf = np.full((t + 2, topk), 12345, np.int32)
    hout, hlse = calls.run_dsa_decode(client, step_of(host), host(q), host(mcache), 0.07, hbuf)
    checks.expect((buf.cpu().numpy() == hbuf).all(), "vLLM device form: topk_indices_buffer")
    checks.expect((host(out) == ac.dtypes.as_raw(hout)).all(), "vLLM device form: out bytes")
    checks.expect((lse.cpu().numpy() == hlse).all(), "vLLM device form: lse")
    checks.expect((hbuf[:t] >= 0).sum() > 0, "vLLM device form: positions chosen")
    # Stream-ordered (ATTND_VLLM_ORDERED=1): queued on torch's current stream, the positions
    # mapped after the done wait on that stream; the same bytes once the stream is synchronised.
    os.environ["ATTND_VLLM_ORDERED"] = "1"
    try:
        for rep in range(3):
            obuf = torch.full((t + 2, topk), 12345, dtype=torch.int32, device=DEV)
            oout, olse = calls.run_dsa_decode(client, step_of(lambda x: x), q, mcache, 0.07, obuf)
            torch.cuda.synchronize()
            what = f"vLLM device form, ordered, call {rep}"
            checks.expect((obuf.cpu().numpy() == hbuf).all(), f"{what}: topk_indices_buffer")
            checks.expect((host(oout) == ac.dtypes.as_raw(hout)).all(), f"{what}: out bytes")
            checks.expect((olse.cpu().numpy() == hlse).all(), f"{what}: lse")
        calls.ordered_caller(client).wait(timeout=30)
    finally:
        os.environ.pop("ATTND_VLLM_ORDERED", None)

    # Uneven draft counts (requires_padding), packed into [B, next_n] rows on the device.
    draft = [2, 1, 2, 2]
    tu = sum(draft)
    ubuf = torch.full((tu + 2, topk), 12345, dtype=torch.int32, device=DEV)
    uout, ulse = calls.run_dsa_decode(
        client, step_of(lambda x: x, draft), q[:tu], mcache, 0.07, ubuf
    )
    hubuf = np.full((tu + 2, topk), 12345, np.int32)
    huout, hulse = calls.run_dsa_decode(
        client, step_of(host, draft), host(q[:tu]), host(mcache), 0.07, hubuf
    )
    checks.expect((ubuf.cpu().numpy() == hubuf).all(), "vLLM device form, uneven: buffer")
    checks.expect((host(uout) == ac.dtypes.as_raw(huout)).all(), "vLLM device form, uneven: out")
    checks.expect((ulse.cpu().numpy() == hulse).all(), "vLLM device form, uneven: lse")

    # The split decode's indexer (run_indexer on the decode tokens): the paged logits left on
    # the GPU for the top-k; the same buffer as the host form's.
    dmd = step_of(lambda x: x).metadata
    sbuf = torch.full((t + 2, topk), 12345, dtype=torch.int32, device=DEV)
    calls.run_indexer(client, dmd, q_fp8, weights, icache, 128, topk, sbuf, num_tokens=t)
    hsbuf = np.full((t + 2, topk), 12345, np.int32)
    calls.run_indexer(
        client,
        step_of(host).metadata,
        host(q_fp8),
        host(weights),
        host(icache),
        128,
        topk,
        hsbuf,
        num_tokens=t,
    )
    checks.expect((sbuf.cpu().numpy() == hsbuf).all(), "vLLM device form: split decode top-k")

    # A prefill chunk of two requests through run_indexer, then sparse MLA over the positions it
    # wrote (the split path's forward_mqa): device form against host form, the same bytes.
    seqs, rows_q = [300, 420], [40, 25]
    cu = torch.tensor([0, seqs[0], sum(seqs)], dtype=torch.int32, device=DEV)
    ks = torch.cat([torch.full((n,), int(cu[r]), dtype=torch.int32) for r, n in enumerate(rows_q)])
    ke = torch.cat(
        [
            int(cu[r]) + seqs[r] - n + torch.arange(n, dtype=torch.int32) + 1
            for r, n in enumerate(rows_q)
        ]
    )
    chunk = SimpleNamespace(
        block_table=table[:2],
        local_cu_seq_lens=cu,
        cu_seqlen_ks=ks.to(DEV),
        cu_seqlen_ke=ke.to(DEV),
        token_start=0,
        token_end=sum(rows_q),
        total_seq_lens=sum(seqs),
    )
    tp = sum(rows_q)
    pq, pw = fp8((tp, h_i, 128)), torch.randn(tp, h_i, device=DEV)
    md = SimpleNamespace(num_prefills=2, num_decodes=0, prefill=SimpleNamespace(chunks=[chunk]))
    pbuf = torch.full((tp, topk), 12345, dtype=torch.int32, device=DEV)
    calls.run_indexer(client, md, pq, pw, icache, 128, topk, pbuf)
    hchunk = SimpleNamespace(
        **{k: host(v) if torch.is_tensor(v) else v for k, v in vars(chunk).items()}
    )
    hmd = SimpleNamespace(num_prefills=2, num_decodes=0, prefill=SimpleNamespace(chunks=[hchunk]))
    hpbuf = np.full((tp, topk), 12345, np.int32)
    calls.run_indexer(client, hmd, host(pq), host(pw), host(icache), 128, topk, hpbuf)
    checks.expect((pbuf.cpu().numpy() == hpbuf).all(), "vLLM device form: prefill top-k")
    req = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(rows_q)])
    pq2 = torch.randn(tp, h, 576, device=DEV).to(torch.bfloat16)
    sout, slse = calls.run_sparse_mla(client, pq2, mcache, pbuf, req.to(DEV), table[:2], 0.07)
    hsout, hslse = calls.run_sparse_mla(
        client, host(pq2), host(mcache), hpbuf, host(req), host(table[:2]), 0.07
    )
    checks.expect(sout.is_cuda, "vLLM device form: sparse MLA out on the GPU")
    checks.expect((host(sout) == ac.dtypes.as_raw(hsout)).all(), "vLLM device form: sparse out")
    checks.expect((slse.cpu().numpy() == hslse).all(), "vLLM device form: sparse lse")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="attnd address, e.g. unix:/tmp/attnd.sock")
    parser.add_argument("--metrics", required=True, help="http://host:port/metrics")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument(
        "--graphs",
        choices=("on", "off"),
        default="on",
        help="whether the daemon runs with graphs (off: --graphs=false)",
    )
    args = parser.parse_args()
    global GRAPHS
    GRAPHS = args.graphs == "on"
    torch.manual_seed(args.seed)
    checks = Checks()
    with ac.Client(args.target, timeout=300) as client:
        client.wait_ready(timeout=60)
        info = client.info()
        print(
            f"attnd {info.version}, backend {info.backend}, devices: "
            + ", ".join(f"{d.name} {d.uuid} ({d.arch}, {d.cores} SMs)" for d in info.devices)
        )
        checks.expect(info.backend == "cuda", f"backend is {info.backend!r}, want 'cuda'")
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        checks.expect(
            any(d.uuid in (uuid, "GPU-" + uuid) for d in info.devices),
            f"torch's device 0 ({uuid}) is not among the daemon's devices",
        )
        before = scrape(args.metrics)
        for name, fn in (
            ("SparseMla", run_sparse_mla),
            ("MlaDecode", run_mla_decode),
            ("IndexerLogits", run_indexer_logits),
            ("DsaAttention", run_dsa_attention),
            ("StreamOrdered", run_stream_ordered),
            ("OrderedCaller", run_ordered_caller),
        ):
            print(f"== {name}", flush=True)
            try:
                fn(client, checks)
            except Exception as e:  # a failed call is one failed check; go on with the others
                traceback.print_exc()
                checks.expect(False, f"{name}: {type(e).__name__}: {e}")
        torch.cuda.synchronize()
        time.sleep(0.2)
        after = scrape(args.metrics)
        print("== zero copies in /metrics")
        for d in DIRECTIONS:
            delta = copied(after, d) - copied(before, d)
            print(f"  attnd_copied_bytes_total{{direction=\"{d}\"}} +{delta:.0f}")
            checks.expect(delta == 0, f"/metrics: {delta:.0f} bytes copied ({d}), want 0")
        readback = copied(after, "count_readback") - copied(before, "count_readback")
        print(f"  (index data read back for work counts: {readback:.0f} B)")
        regions = [r for r in client.list_regions() if r.kind == ac.pb.RegionInfo.KIND_DEVICE]
        checks.expect(len(regions) > 0, "no device regions listed")
        print(f"  {len(regions)} device regions registered")
        print("== refusals")
        run_refusals(client, checks)
        print("== vLLM device form", flush=True)
        try:
            run_vllm_device_decode(client, args, checks)
        except Exception as e:  # one failed check; the report still comes
            traceback.print_exc()
            checks.expect(False, f"vLLM device form: {type(e).__name__}: {e}")
    checks.report["failures"] = checks.failures
    if args.json:
        with open(args.json, "w") as f:
            json.dump(checks.report, f, indent=1)
    print("PASS" if not checks.failures else f"FAIL: {len(checks.failures)} check(s)")
    return 0 if not checks.failures else 1


if __name__ == "__main__":
    sys.exit(main())
