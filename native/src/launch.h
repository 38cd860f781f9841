// What every kernel family's host launcher shares: the input dtype, the sequence layout, the
// kernel variant the device runs, and the sizes of persistent grids. Families' launchers
// (<family>_ops.cpp) receive arguments already validated by the Python layer.
#pragma once

#include <cstdint>
#include <string>

#include "params.h"

namespace cula {

enum class DType : int { bf16 = 0, f16 = 1 };
const char* dtype_name(DType d);  // "bf16" / "f16", as kernel names spell it
int dtype_code(DType d);          // CULA_BF16 / CULA_F16 (params.h)

struct SeqArgs {
  std::uintptr_t cu_seqlens = 0;  // device pointer or 0
  bool cu_seqlens_int64 = false;
  int num_seqs = 0;
  long long seq_len = 0;
  long long total_tokens = 0;  // rows of q/k/v: B*T, or T with cu_seqlens
  long long longest = 0;       // with cu_seqlens: the longest sequence's tokens where the host read them (0:
                               // unknown); host choices only, the kernels never see it
  // Where the host read cu_seqlens, also the longest sequence's index (the first of that length; -1:
  // not read yet, -2: never read, the values unchecked) and first row, and the longest of the others
  // (host choices: the split of one long sequence among short ones).
  int longest_at = -1;
  long long longest_bos = 0, second = 0;
};
CulaSeqs seqs_of(const SeqArgs& s);

// A size the caller may leave to its default (a state pitch, a row stride, a token count): `given`
// where positive, else `contiguous`, the one of a contiguous array.
inline long long given_or(long long given, long long contiguous) { return given > 0 ? given : contiguous; }

// The longest sequence's tokens as the host knows them (host choices of kernels): seq_len without
// cu_seqlens; with them s.longest where the host read cu_seqlens (the ops' value check), else all
// the call's tokens, a bound (CUDA-graph capture, CULA_CHECK_VALUES=0).
inline long long longest_tokens(const SeqArgs& s) {
  return s.cu_seqlens == 0 && s.seq_len > 0 ? s.seq_len : given_or(s.longest, s.total_tokens);
}

// CULA_FORCE_GENERIC=1 (or true, yes, on; any case) runs the generic kernels, what the sm_100
// family runs, on an sm_90 GPU too (tests, benchmarks). Read on every call, so a test can flip it.
bool force_generic();

// The device's variant ("sm90a" or "generic", from cula._loader.check_device) as a launch uses it.
bool use_sm90a(const std::string& variant);

// Persistent grids: one CTA per SM, each taking work items in turn. CULA_CHUNK_CTAS=n launches n
// CTAs instead (tests: many items per CTA; more than the SMs run in waves, one item each when n >=
// items). Read on every call, like CULA_FORCE_GENERIC.
int persistent_ctas(int device);

// min(items, ctas) as a grid size; throws when the kernels' int item counters could overflow.
unsigned grid_for(long long items, int ctas);

}  // namespace cula
