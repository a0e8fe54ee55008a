// Cross-check cases for the shared conversions: every fp8 e4m3fn and bf16 encoding, decoded by
// attnd (the reference) and by hand in NumPy (tests/numpy/ops/conversions.py).
#include <vector>

#include "kernels/common/bf16.h"
#include "kernels/common/fp8.h"
#include "tests/numpy/dump.h"

namespace attnd::testing {
namespace {

void DumpConversions(const std::string& dir) {
  std::vector<uint8_t> fp8(256);
  std::vector<double> fp8_values(256);
  for (int c = 0; c < 256; ++c) {
    fp8[c] = static_cast<uint8_t>(c);
    fp8_values[c] = kernels::Fp8E4M3ToFloat(fp8[c]);
  }
  std::vector<uint16_t> bf16(65536);
  std::vector<double> bf16_values(65536);
  for (int b = 0; b < 65536; ++b) {
    bf16[b] = static_cast<uint16_t>(b);
    bf16_values[b] = kernels::Bf16ToFloat(bf16[b]);
  }
  CaseWriter w(dir, "conversions_all_encodings", "conversions");
  w.AddTensor("fp8", kernels::MakeTensor(fp8.data(), kernels::DType::kFp8E4M3, {256}));
  w.AddTensor("bf16", kernels::MakeTensor(bf16.data(), kernels::DType::kBF16, {65536}));
  w.AddReference("fp8", fp8_values, {256});
  w.AddReference("bf16", bf16_values, {65536});
  w.Finish();
}

}  // namespace
}  // namespace attnd::testing

ATTND_REGISTER_NUMPY_DUMPER(conversions, attnd::testing::DumpConversions);
