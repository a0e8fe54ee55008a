#include "tests/numpy/dump.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

namespace attnd::testing {
namespace {

const char* NpyDescr(kernels::DType t) {
  switch (t) {
    case kernels::DType::kF32: return "<f4";
    case kernels::DType::kBF16: return "<u2";
    case kernels::DType::kFp8E4M3: return "|u1";
    case kernels::DType::kI32: return "<i4";
    case kernels::DType::kU8: return "|u1";
    case kernels::DType::kInvalid: break;
  }
  return "|u1";
}

bool WriteNpy(const std::string& path, const char* descr, const std::vector<int64_t>& shape,
              const void* data, size_t bytes) {
  std::ostringstream header;
  header << "{'descr': '" << descr << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i)
    header << shape[i] << (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  header << "), }";
  std::string h = header.str();
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  const char magic[] = "\x93NUMPY\x01\x00";
  out.write(magic, 8);
  const uint16_t len = static_cast<uint16_t>(h.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  return static_cast<bool>(out);
}

std::map<std::string, NumpyDumper>& Registry() {
  static auto* registry = new std::map<std::string, NumpyDumper>();
  return *registry;
}

}  // namespace

CaseWriter::CaseWriter(const std::string& dir, const std::string& case_name, const std::string& op)
    : path_(dir + "/" + case_name), op_(op) {
  if (mkdir(path_.c_str(), 0755) != 0) {
    std::cerr << "mkdir " << path_ << ": " << std::strerror(errno) << "\n";
    ok_ = false;
  }
}

void CaseWriter::AddTensor(const std::string& name, const kernels::Tensor& t) {
  const int64_t esize = kernels::DTypeSize(t.dtype);
  std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.rank);
  std::vector<char> dense(static_cast<size_t>(t.numel() * esize));
  std::vector<int64_t> idx(t.rank, 0);
  for (int64_t flat = 0; flat < t.numel(); ++flat) {
    int64_t off = 0;
    for (int d = 0; d < t.rank; ++d) off += idx[d] * t.strides[d];
    std::memcpy(dense.data() + flat * esize, static_cast<const char*>(t.data) + off * esize,
                static_cast<size_t>(esize));
    for (int d = t.rank - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  ok_ &=
      WriteNpy(path_ + "/" + name + ".npy", NpyDescr(t.dtype), shape, dense.data(), dense.size());
  tensors_[name] = kernels::DTypeName(t.dtype);
}

void CaseWriter::AddReference(const std::string& name, const std::vector<double>& values,
                              const std::vector<int64_t>& shape) {
  ok_ &= WriteNpy(path_ + "/ref_" + name + ".npy", "<f8", shape, values.data(),
                  values.size() * sizeof(double));
  refs_.push_back(name);
}

void CaseWriter::AddScalar(const std::string& name, double value) { scalars_[name] = value; }

bool CaseWriter::Finish() {
  std::ofstream out(path_ + "/case.json");
  out.precision(17);
  out << "{\"op\": \"" << op_ << "\", \"tensors\": {";
  bool first = true;
  for (const auto& [name, dtype] : tensors_) {
    out << (first ? "" : ", ") << "\"" << name << "\": \"" << dtype << "\"";
    first = false;
  }
  out << "}, \"refs\": [";
  for (size_t i = 0; i < refs_.size(); ++i) out << (i ? ", " : "") << "\"" << refs_[i] << "\"";
  out << "], \"scalars\": {";
  first = true;
  for (const auto& [name, value] : scalars_) {
    out << (first ? "" : ", ") << "\"" << name << "\": " << value;
    first = false;
  }
  out << "}}\n";
  ok_ &= static_cast<bool>(out);
  if (!ok_) std::cerr << "writing case " << path_ << " failed\n";
  return ok_;
}

bool RegisterNumpyDumper(const std::string& op, NumpyDumper dumper) {
  return Registry().emplace(op, std::move(dumper)).second;
}

const std::map<std::string, NumpyDumper>& NumpyDumpers() { return Registry(); }

}  // namespace attnd::testing
