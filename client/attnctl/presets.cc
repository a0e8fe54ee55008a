// The shape presets of every op (docs/ATTNCTL.md lists them) and MakeOpCase. Sizes are chosen
// for a CPU daemon on a small machine: "tiny" runs in milliseconds, the model-shaped presets
// (deepseek, glm) in about a second.
#include <algorithm>
#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/attnctl/builders.h"

namespace attnd::attnctl {
namespace {

using Builder = absl::StatusOr<std::unique_ptr<OpCase>> (*)(const Dims&, Rng&);

struct OpEntry {
  std::string name;
  std::string rpc;
  Builder build;
  std::vector<PresetInfo> presets;
};

const std::vector<OpEntry>& Table() {
  static const auto* table = new std::vector<OpEntry>{
      {"indexer_logits",
       "IndexerLogits",
       BuildIndexerLogits,
       {
           {"tiny", "a few rows, small heads", {{"M", 8}, {"H", 4}, {"D", 64}, {"N", 256}}},
           {"decode",
            "4 new tokens against an 8k context, DeepSeek indexer heads",
            {{"M", 4}, {"H", 64}, {"D", 128}, {"N", 8192}}},
           {"prefill",
            "a 256-token chunk over 2k positions",
            {{"M", 256}, {"H", 64}, {"D", 128}, {"N", 2048}}},
           {"deepseek",
            "DeepSeek-V3.2 indexer (H=64, D=128), 64 tokens over 8k",
            {{"M", 64}, {"H", 64}, {"D", 128}, {"N", 8192}}},
           {"glm",
            "GLM-5 indexer (H=32, D=128), 64 tokens over 8k",
            {{"M", 64}, {"H", 32}, {"D", 128}, {"N", 8192}}},
       }},
      {"indexer_logits_paged",
       "IndexerLogitsPaged",
       BuildIndexerLogitsPaged,
       {
           {"tiny",
            "2 requests, short paged contexts",
            {{"B", 2}, {"NEXT", 1}, {"H", 4}, {"D", 64}, {"CTX", 200}, {"BLOCK", 64}}},
           {"decode",
            "8 requests, 4k contexts, DeepSeek indexer heads",
            {{"B", 8}, {"NEXT", 1}, {"H", 64}, {"D", 128}, {"CTX", 4096}, {"BLOCK", 64}}},
           {"mtp",
            "8 requests with next_n = 2 (speculative decoding)",
            {{"B", 8}, {"NEXT", 2}, {"H", 64}, {"D", 128}, {"CTX", 4096}, {"BLOCK", 64}}},
           {"deepseek",
            "DeepSeek-V3.2 indexer, 32 requests, 8k contexts",
            {{"B", 32}, {"NEXT", 1}, {"H", 64}, {"D", 128}, {"CTX", 8192}, {"BLOCK", 64}}},
           {"glm",
            "GLM-5 indexer (H=32), 32 requests, 8k contexts",
            {{"B", 32}, {"NEXT", 1}, {"H", 32}, {"D", 128}, {"CTX", 8192}, {"BLOCK", 64}}},
       }},
      {"topk",
       "TopK",
       BuildTopK,
       {
           {"tiny",
            "4 rows of 300, k = 64",
            {{"M", 4}, {"N", 300}, {"K", 64}, {"WINDOWS", 0}, {"PAGE", 0}}},
           {"decode",
            "64 rows of 8k logits, k = 2048 (lengths)",
            {{"M", 64}, {"N", 8192}, {"K", 2048}, {"WINDOWS", 0}, {"PAGE", 0}}},
           {"prefill",
            "256 causal rows over 4k, k = 2048 (ks/ke)",
            {{"M", 256}, {"N", 4096}, {"K", 2048}, {"WINDOWS", 1}, {"PAGE", 0}}},
           {"fused",
            "64 rows of 4k with the fused block-table mapping (page 64)",
            {{"M", 64}, {"N", 4096}, {"K", 2048}, {"WINDOWS", 0}, {"PAGE", 64}}},
           {"deepseek",
            "64 rows of 32k logits, k = 2048",
            {{"M", 64}, {"N", 32768}, {"K", 2048}, {"WINDOWS", 0}, {"PAGE", 0}}},
       }},
      {"sparse_mla",
       "SparseMla",
       BuildSparseMla,
       {
           {"tiny",
            "4 tokens, 8 heads, d_qk 576, k = 64",
            {{"T", 4}, {"H", 8}, {"D", 576}, {"S", 512}, {"K", 64}, {"MASK_PCT", 2}}},
           {"decode",
            "the service benchmark's call: T=64, H=16, k=2048, d_qk 512",
            {{"T", 64}, {"H", 16}, {"D", 512}, {"S", 8192}, {"K", 2048}, {"MASK_PCT", 0}}},
           {"prefill",
            "256 tokens, 16 heads, d_qk 576, k = 512",
            {{"T", 256}, {"H", 16}, {"D", 576}, {"S", 4096}, {"K", 512}, {"MASK_PCT", 2}}},
           {"deepseek",
            "DeepSeek-V3.2 decode: 16 tokens, H=128, d_qk 576, k=2048",
            {{"T", 16}, {"H", 128}, {"D", 576}, {"S", 16384}, {"K", 2048}, {"MASK_PCT", 0}}},
           {"glm",
            "GLM-5.3-Flash decode: 16 tokens, H=64, d_qk 512, k=2048",
            {{"T", 16}, {"H", 64}, {"D", 512}, {"S", 16384}, {"K", 2048}, {"MASK_PCT", 0}}},
       }},
      {"mla_decode",
       "MlaDecode",
       BuildMlaDecode,
       {
           {"tiny",
            "2 requests, 8 heads, contexts <= 256",
            {{"B", 2}, {"SQ", 1}, {"H", 8}, {"D", 576}, {"CTX", 256}, {"PAGE", 64}, {"CAUSAL", 0}}},
           {"decode",
            "16 requests, 16 heads, contexts <= 2k",
            {{"B", 16},
             {"SQ", 1},
             {"H", 16},
             {"D", 576},
             {"CTX", 2048},
             {"PAGE", 64},
             {"CAUSAL", 0}}},
           {"mtp",
            "8 requests, s_q = 2 causal (speculative decoding)",
            {{"B", 8},
             {"SQ", 2},
             {"H", 16},
             {"D", 576},
             {"CTX", 2048},
             {"PAGE", 64},
             {"CAUSAL", 1}}},
           {"deepseek",
            "DeepSeek dense MLA decode: 8 requests, H=128, d_qk 576, 4k contexts",
            {{"B", 8},
             {"SQ", 1},
             {"H", 128},
             {"D", 576},
             {"CTX", 4096},
             {"PAGE", 64},
             {"CAUSAL", 0}}},
           {"glm",
            "GLM-style MLA decode: 8 requests, H=64, d_qk 512, 4k contexts",
            {{"B", 8},
             {"SQ", 1},
             {"H", 64},
             {"D", 512},
             {"CTX", 4096},
             {"PAGE", 64},
             {"CAUSAL", 0}}},
       }},
      {"mla_prefill",
       "MlaPrefill",
       BuildMlaPrefill,
       {
           {"tiny",
            "2 short sequences, 4 heads",
            {{"B", 2},
             {"LQ", 12},
             {"LK", 20},
             {"H", 4},
             {"HKV", 4},
             {"DQK", 192},
             {"DV", 128},
             {"CAUSAL", 1}}},
           {"prefill",
            "2 sequences of <= 512 tokens, 16 heads, causal",
            {{"B", 2},
             {"LQ", 512},
             {"LK", 512},
             {"H", 16},
             {"HKV", 16},
             {"DQK", 192},
             {"DV", 128},
             {"CAUSAL", 1}}},
           {"chunked",
            "2 chunks of 16 queries after 1k cached keys, 32 heads",
            {{"B", 2},
             {"LQ", 16},
             {"LK", 1024},
             {"H", 32},
             {"HKV", 32},
             {"DQK", 192},
             {"DV", 128},
             {"CAUSAL", 1}}},
           {"deepseek",
            "DeepSeek non-absorbed prefill (qk 192, v 128): 1k tokens, 32 heads",
            {{"B", 1},
             {"LQ", 1024},
             {"LK", 1024},
             {"H", 32},
             {"HKV", 32},
             {"DQK", 192},
             {"DV", 128},
             {"CAUSAL", 1}}},
       }},
      {"dsa_attention",
       "DsaAttention",
       BuildDsaAttention,
       {
           {"tiny",
            "4 tokens over 512 positions, top-64",
            {{"T", 4}, {"N", 512}, {"HI", 4}, {"DI", 64}, {"TOPK", 64}, {"H", 8}, {"D", 576}}},
           {"decode",
            "16 tokens over 8k positions, top-2048, 16 heads, d_qk 576",
            {{"T", 16},
             {"N", 8192},
             {"HI", 64},
             {"DI", 128},
             {"TOPK", 2048},
             {"H", 16},
             {"D", 576}}},
           {"prefill",
            "a 128-token chunk over 4k positions, top-2048",
            {{"T", 128},
             {"N", 4096},
             {"HI", 64},
             {"DI", 128},
             {"TOPK", 2048},
             {"H", 16},
             {"D", 576}}},
           {"deepseek",
            "DeepSeek-V3.2 layer: 16 tokens over 16k, indexer H=64, MLA H=128",
            {{"T", 16},
             {"N", 16384},
             {"HI", 64},
             {"DI", 128},
             {"TOPK", 2048},
             {"H", 128},
             {"D", 576}}},
           {"glm",
            "GLM-5 layer: 16 tokens over 16k, indexer H=32, MLA H=64, d_qk 512",
            {{"T", 16},
             {"N", 16384},
             {"HI", 32},
             {"DI", 128},
             {"TOPK", 2048},
             {"H", 64},
             {"D", 512}}},
           // The paged decode form (a CTX dim selects it): both caches through one block table.
           {"paged_tiny",
            "paged: 2 requests of <= 300 tokens, next_n 2, block 64, top-64, bf16 KV",
            {{"B", 2},
             {"NEXT", 2},
             {"CTX", 300},
             {"BLOCK", 64},
             {"HI", 4},
             {"DI", 64},
             {"TOPK", 64},
             {"H", 8},
             {"D", 576},
             {"FP8", 0}}},
           {"paged_decode",
            "paged: 8 requests of <= 4k, indexer H=64, top-2048, 16 heads, FP8 KV",
            {{"B", 8},
             {"NEXT", 1},
             {"CTX", 4096},
             {"BLOCK", 64},
             {"HI", 64},
             {"DI", 128},
             {"TOPK", 2048},
             {"H", 16},
             {"D", 576},
             {"FP8", 1}}},
           {"paged_mtp",
            "paged: 8 requests of <= 4k, next_n 4 (3 draft tokens), 16 heads, FP8 KV",
            {{"B", 8},
             {"NEXT", 4},
             {"CTX", 4096},
             {"BLOCK", 64},
             {"HI", 64},
             {"DI", 128},
             {"TOPK", 2048},
             {"H", 16},
             {"D", 576},
             {"FP8", 1}}},
       }},
  };
  return *table;
}

const OpEntry* FindOp(const std::string& name) {
  for (const OpEntry& e : Table()) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

const std::vector<std::string>& OpNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>();
    for (const OpEntry& e : Table()) v->push_back(e.name);
    return v;
  }();
  return *names;
}

std::string CanonicalOpName(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "dsa") return "dsa_attention";
  for (const OpEntry& e : Table()) {
    if (e.name == lower || absl::AsciiStrToLower(e.rpc) == lower) return e.name;
  }
  return "";
}

std::vector<PresetInfo> Presets(const std::string& op) {
  const OpEntry* e = FindOp(CanonicalOpName(op));
  return e == nullptr ? std::vector<PresetInfo>() : e->presets;
}

absl::StatusOr<std::unique_ptr<OpCase>> MakeOpCase(const std::string& op, const std::string& preset,
                                                   const Dims& overrides, uint64_t seed) {
  const OpEntry* e = FindOp(CanonicalOpName(op));
  if (e == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown op '", op, "'; known: ", absl::StrJoin(OpNames(), ", ")));
  }
  const PresetInfo* info = nullptr;
  std::vector<std::string> names;
  for (const PresetInfo& p : e->presets) {
    names.push_back(p.name);
    if (p.name == preset) info = &p;
  }
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(e->name, ": unknown preset '", preset,
                                                   "'; known: ", absl::StrJoin(names, ", ")));
  }
  Dims dims = info->dims;
  for (const auto& [key, value] : overrides) {
    if (dims.count(key) == 0) {
      std::vector<std::string> keys;
      for (const auto& kv : dims) keys.push_back(kv.first);
      return absl::InvalidArgumentError(
          absl::StrCat(e->name, ": no dim '", key, "'; dims: ", absl::StrJoin(keys, ", ")));
    }
    dims[key] = value;
  }
  Rng rng(seed);
  return e->build(dims, rng);
}

}  // namespace attnd::attnctl
