// The tile vocabulary of every op's GPU code (kernels/<op>/gpu, namespace <op>::gpu) and the
// shared-memory bound its tiles are checked against. Plain C++; host and device code include it.
//
//   kThreads, kWarps           threads and warps per CTA
//   kBlockM                    query-side rows a CTA computes: rows of S and O (queries, stacked
//                              (token, head) rows, heads; the indexers' (query, head) columns)
//   kBlockN                    key-side rows per tile or step: keys, cache positions, selected
//                              KV rows (top-k: columns of an ordered tile)
//   kMTiles, kKSteps, kOTiles  m16 MMA tiles of a CTA, k16 steps of an MMA loop, n8 tiles of O
//                              per warp
//   k<Name>Offset, k<Name>Bytes, kSmemBytes
//                              the shared-memory layout in bytes, and its total
//   k<Name>Chunks              16-byte pieces of a row (one uint4 or cp.async each)
// A namespace holding several kernels prefixes them with the kernel (kSimtBlockN, kMmaBlockN);
// host-side launch shapes use the same words (KernelShape::block_m, block_n).
#pragma once

namespace attnd::kernels {

// Dynamic shared memory one CTA may opt into on sm_90 (227 KiB); tiles sized for Hopper
// static_assert against it.
inline constexpr int kSm90MaxSmemBytes = 227 * 1024;

// Registers per thread of a 384-thread CTA launched one per SM (65536 / 384, rounded down to a
// multiple of 8): the pool that `setmaxnreg` redistributes among its three warpgroups. An inc
// the pool cannot serve waits forever, so the roles' counts sum to at most 3 × this
// (docs/KERNELS.md "Registers"); the Hopper tiles static_assert against it.
inline constexpr int kSm90Regs384 = 168;

}  // namespace attnd::kernels
