// Warpgroup-level wgmma (sm_90a): shared-memory descriptors of swizzled boxes, fences, and the
// m64n64k16 forms the kernels use (A from shared memory or registers, B from shared memory).
#pragma once

#include "common/ptx.cuh"

// The body of an sm_90a variant's entry point: the kernel exists in every cubin so that kernel
// lookup is uniform, but only the sm_90a cubin compiles CALL (elsewhere the body traps; the host
// never launches it on another architecture).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CULA_SM90A_ONLY(CALL) CALL
#else
#define CULA_SM90A_ONLY(CALL) __trap()
#endif

// Whether this thread is among the block's first THREADS (whole warps): a warp-specialised
// kernel's role. WG (code that issues wgmma): the test goes through a shuffle, so that the compiler
// knows the role is the same across the warp; from a plain test it treats the role's code as
// divergent and serialises its wgmma.
template <bool WG, unsigned THREADS>
__device__ __forceinline__ bool in_first_threads() {
  if constexpr (WG)
    return __shfl_sync(0xffffffffu, threadIdx.x < THREADS, 0);
  else
    return threadIdx.x < THREADS;
}

// Shared-memory matrix descriptor of a 128-byte-swizzled operand whose 8-row groups are 1024
// bytes apart (the layout of a TMA box with 128-byte rows). k-major operands (q, k: the reduction
// runs along the 128-byte row) advance 32 bytes per k-step inside the swizzle atom; mn-major ones
// (v, the state copy: the reduction runs down the rows) advance 16 rows. With 64 columns there
// is a single atom across, so the leading-dimension offset is unused; it is set to the same 1024.
__device__ __forceinline__ u64 smem_desc(u32 addr) {  // (addr: a shared-memory address, as SwizzledTile's base)
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(1024 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ u64 smem_desc(const u16* p) { return smem_desc(smem_addr(p)); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {  // at most N committed groups still running
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

#define CULA_ACC32                                                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define CULA_ACC32_OPS(d)                                                                                 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),            \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
      "+f"(d[30]), "+f"(d[31])

// d (64 x 64, fp32) {=, +=} A B (acc: +=), B in shared memory; A in shared memory (ss) or registers (rs).
// TA / TB: the operand is mn-major (its rows run along the reduction) rather than k-major.
template <typename T, int TA, int TB> struct WgmmaSS;
template <typename T, int TB> struct WgmmaRS;
#define CULA_WGMMA_SS(TAG, PTX_T, TA, TB)                                                                   \
  template <> struct WgmmaSS<TAG, TA, TB> {                                                                 \
    static __device__ __forceinline__ void run(float* d, u64 a, u64 b, int acc) {                           \
      asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"                                              \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_T "." PTX_T " " CULA_ACC32                \
                   ", %32, %33, p, 1, 1, " #TA ", " #TB "; }"                                               \
                   : CULA_ACC32_OPS(d)                                                                      \
                   : "l"(a), "l"(b), "r"(acc)                                                               \
                   : "memory");                                                                             \
    }                                                                                                       \
  };
#define CULA_WGMMA_RS(TAG, PTX_T, TB)                                                                       \
  template <> struct WgmmaRS<TAG, TB> {                                                                     \
    static __device__ __forceinline__ void run(float* d, const u32* a, u64 b, int acc) {                    \
      asm volatile("{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"                                              \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX_T "." PTX_T " " CULA_ACC32                \
                   ", {%32, %33, %34, %35}, %36, p, 1, 1, " #TB "; }"                                       \
                   : CULA_ACC32_OPS(d)                                                                      \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc)                           \
                   : "memory");                                                                             \
    }                                                                                                       \
  };
CULA_WGMMA_SS(bf16_tag, "bf16", 0, 0)
CULA_WGMMA_SS(bf16_tag, "bf16", 0, 1)
CULA_WGMMA_SS(bf16_tag, "bf16", 1, 1)
CULA_WGMMA_RS(bf16_tag, "bf16", 0)
CULA_WGMMA_RS(bf16_tag, "bf16", 1)
CULA_WGMMA_SS(f16_tag, "f16", 0, 0)
CULA_WGMMA_SS(f16_tag, "f16", 0, 1)
CULA_WGMMA_SS(f16_tag, "f16", 1, 1)
CULA_WGMMA_RS(f16_tag, "f16", 0)
CULA_WGMMA_RS(f16_tag, "f16", 1)

// Descriptor of the element `offset` (in 16-bit elements, a multiple of 8) past a descriptor's
// start: the start address field counts 16-byte units and never carries (shared memory < 256 KiB).
__device__ __forceinline__ u64 desc_at(u64 desc, int offset) { return desc + (u64)(offset >> 3); }

// The element offset of k-step kk (16 of the reduction) in a swizzled operand of 64-column panels
// of `rows` rows: k-major, 16 columns of panel kk / 4; mn-major, 16 rows.
__device__ __forceinline__ int kmajor_step(int kk, int rows) { return (kk >> 2) * rows * 64 + (kk & 3) * 16; }
__device__ __forceinline__ int mnmajor_step(int kk) { return kk * 16 * 64; }

// acc (64 x 64) += A B over KSTEPS k-steps, both in shared memory: A k-major (panels of ROWS rows),
// B mn-major. The caller fences, commits and waits.
template <typename T, int KSTEPS, int ROWS>
__device__ __forceinline__ void wgmma_kmajor_times_mn(float* acc, u64 a, u64 b) {
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk)
    WgmmaSS<T, 0, 1>::run(acc, desc_at(a, kmajor_step(kk, ROWS)), desc_at(b, mnmajor_step(kk)), 1);
}

// acc (64 x 64) = A B over KSTEPS k-steps, A from registers (the warp's 16 rows, a[kk] for k-step
// kk), B k-major in shared memory as B^T (64 rows, its panels of BROWS rows). The caller fences,
// commits and waits. The first k-step overwrites acc (scale-d 0): zeros written to acc in C++ would
// be registers the wgmma reads, and ptxas may then wait for every earlier wgmma of the warpgroup
// before this one issues (C7517), which serialises two products meant to run together.
template <typename T, int KSTEPS, int BROWS>
__device__ __forceinline__ void wgmma_regs_times_kmajor(float* acc, const u32 (&a)[KSTEPS][4], u64 b) {
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk) WgmmaRS<T, 0>::run(acc, a[kk], desc_at(b, kmajor_step(kk, BROWS)), kk > 0);
}

// acc (64 x 64) += A B over KSTEPS k-steps, both k-major in shared memory: A in panels of AROWS rows,
// B as B^T (64 rows, its panels of BROWS rows). The caller fences, commits and waits.
template <typename T, int KSTEPS, int AROWS, int BROWS>
__device__ __forceinline__ void wgmma_kmajor_times_kmajor(float* acc, u64 a, u64 b) {
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk)
    WgmmaSS<T, 0, 0>::run(acc, desc_at(a, kmajor_step(kk, AROWS)), desc_at(b, kmajor_step(kk, BROWS)), 1);
}

// A chunked state update, S (MT row tiles of 64 rows) += K^T V over ROWS tokens, both in shared
// memory, mn-major: K (ROWS x 64 MT; row tile mt is its panel mt), V (ROWS x 64). The caller fences,
// commits and waits.
template <typename T, int MT, int ROWS>
__device__ __forceinline__ void wgmma_state_update(float (&S)[MT][32], u64 k, u64 v) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
      WgmmaSS<T, 1, 1>::run(S[mt], desc_at(k, mt * ROWS * 64 + mnmajor_step(kk)), desc_at(v, mnmajor_step(kk)), 1);
}

// The same update with K^T from registers: a[mt][kk], the warp's 16 rows of row tile mt at k-step
// kk (its tokens already scaled as the caller needs), V mn-major in shared memory.
template <typename T, int MT, int ROWS>
__device__ __forceinline__ void wgmma_state_update(float (&S)[MT][32], const u32 (&a)[MT][ROWS / 16][4], u64 v) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk) WgmmaRS<T, 1>::run(S[mt], a[mt][kk], desc_at(v, mnmajor_step(kk)), 1);
}
