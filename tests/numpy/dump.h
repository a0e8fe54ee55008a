// Writes cases for the NumPy cross-check (tests/numpy/crosscheck.py): each case is a folder
// <dir>/<case>/ holding one .npy per tensor (a dense copy; bf16 as uint16 and fp8 as uint8 raw
// bits, decoded by hand on the Python side) and case.json naming the op, dtypes and scalars.
// Ops register a dumper from tests/numpy/cases_<op>.cc:
//   ATTND_REGISTER_NUMPY_DUMPER(sparse_mla, [](const std::string& dir) { ... });
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/common/tensor.h"

namespace attnd::testing {

class CaseWriter {
 public:
  // Creates <dir>/<case_name>/ (case names must be unique across ops; prefix with the op).
  CaseWriter(const std::string& dir, const std::string& case_name, const std::string& op);
  // A tensor of the call (input or output), copied densely in logical order.
  void AddTensor(const std::string& name, const kernels::Tensor& t);
  // A reference result (fp64) saved as float64 "ref_<name>.npy" with the given shape.
  void AddReference(const std::string& name, const std::vector<double>& values,
                    const std::vector<int64_t>& shape);
  void AddScalar(const std::string& name, double value);
  // Writes case.json; returns false (and prints why) on an I/O error.
  bool Finish();

 private:
  std::string path_, op_;
  std::map<std::string, std::string> tensors_;  // name -> dtype name
  std::vector<std::string> refs_;
  std::map<std::string, double> scalars_;
  bool ok_ = true;
};

using NumpyDumper = std::function<void(const std::string& dir)>;
bool RegisterNumpyDumper(const std::string& op, NumpyDumper dumper);
const std::map<std::string, NumpyDumper>& NumpyDumpers();

}  // namespace attnd::testing

#define ATTND_REGISTER_NUMPY_DUMPER(op, fn) \
  static const bool attnd_numpy_dumper_##op = ::attnd::testing::RegisterNumpyDumper(#op, fn)
