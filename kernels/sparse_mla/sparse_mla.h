// Sparse MLA (docs/CONTRACTS.md "sparse_mla"): the host entry. Validate checks a call, Count gives
// its FLOPs and logical bytes, Run validates and dispatches to the first implementation that
// supports it.
//   ATTND_RETURN_IF_ERROR(sparse_mla::Run(params, ctx));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla {

// Checks every shape, dtype, stride and scalar; INVALID_ARGUMENT names the tensor and dimension.
// Reads no tensor data (the selection may live on a device); see CheckSelectionData.
absl::Status Validate(const Params& p);

// Data-dependent checks of a host-resident selection: CSR indptr starts at 0, is monotone and
// ends at nnz. The table form has nothing to check (bad indices are masked, lengths clamped).
// The CPU implementation runs it before touching any output.
absl::Status CheckSelectionData(const Params& p);

// Valid selections E: slots inside the row (and topk_length) whose index lies in [0, S). Reads
// the host-resident selection; 0 when CheckSelectionData fails.
int64_t CountValidSelections(const Params& p);

// FLOPs 2·H·(d_qk + 512)·E (= 2·T·H·(d_qk + 512)·K_valid when every token has K_valid valid
// slots) and logical bytes (one gathered KV row per valid selection):
//   2·T·H·d_qk + row·E + 4·slots + 4·(T+1) [CSR indptr] or 4·T [topk_length, if present]
//   + 2·T·H·512 [+ 4·T·H lse], row = 2·d_qk bytes (bf16 cache), 656 (FP8 cache) or d_qk
//   (per-tensor FP8 cache),
// slots = T·K (table) or nnz (CSR). Reads the selection (host-resident calls only).
WorkCount Count(const Params& p);
// FlashMLA's count, reading no data: every slot counts as a selection (E = slots).
WorkCount CountSlots(const Params& p);

// Fastest first; each with its Supports predicate.
const std::vector<Impl<Params>>& Implementations();

// Validate + Dispatch. *impl (optional) receives the implementation's name.
absl::Status Run(const Params& p, const ExecContext& ctx, std::string* impl = nullptr);

}  // namespace attnd::kernels::sparse_mla
