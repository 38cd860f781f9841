#include "launch.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <stdexcept>

#include "runtime.h"

namespace cula {

const char* dtype_name(DType d) { return d == DType::bf16 ? "bf16" : "f16"; }
int dtype_code(DType d) { return d == DType::bf16 ? CULA_BF16 : CULA_F16; }

CulaSeqs seqs_of(const SeqArgs& s) {
  CulaSeqs out{};
  out.cu_seqlens = reinterpret_cast<const void*>(s.cu_seqlens);
  out.cu_seqlens_int64 = s.cu_seqlens_int64 ? 1 : 0;
  out.num_seqs = s.num_seqs;
  out.seq_len = s.seq_len;
  return out;
}

bool force_generic() {
  const char* env = std::getenv("CULA_FORCE_GENERIC");
  if (env == nullptr) return false;
  std::string v(env);
  const auto first = v.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string::npos) return false;
  v = v.substr(first, v.find_last_not_of(" \t\n\r\f\v") - first + 1);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

bool use_sm90a(const std::string& variant) { return variant == "sm90a" && !force_generic(); }

int persistent_ctas(int device) {
  if (const char* env = std::getenv("CULA_CHUNK_CTAS")) {
    const long long n = std::atoll(env);
    if (n >= 1) return static_cast<int>(std::min<long long>(n, INT_MAX));
  }
  return multiprocessor_count(device);
}

unsigned grid_for(long long items, int ctas) {
  const long long grid = std::min<long long>(items, ctas);
  if (items + grid > INT_MAX)  // the kernels count items, and step through them by the grid, in int
    throw std::invalid_argument("cula: too many (value slice, head, sequence piece) work items for one launch: " +
                                std::to_string(items));
  return static_cast<unsigned>(grid);
}

}  // namespace cula
