// The CPU implementation of sparse MLA (cpu.cc), for the implementation list in sparse_mla.cc
// and nothing else: callers go through sparse_mla::Run.
#pragma once

#include "absl/status/status.h"
#include "kernels/common/registry.h"
#include "kernels/sparse_mla/params.h"

namespace attnd::kernels::sparse_mla {

// Runs validated params on ctx.pool. Returns INVALID_ARGUMENT from CheckSelectionData (a
// malformed CSR indptr) before writing any output.
absl::Status RunCpu(const Params& p, const ExecContext& ctx);

}  // namespace attnd::kernels::sparse_mla
