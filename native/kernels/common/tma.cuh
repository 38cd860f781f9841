// The Hopper tensor-copy engine and its mbarriers, and the 128-byte-swizzled boxes it fills (which
// ldmatrix, stmatrix and wgmma read without bank conflicts): the pieces of every TMA ring.
#pragma once

#include "common/ptx.cuh"
#include "params.h"

// Boxes of 128-byte rows x `rows` rows, 128-byte swizzle, of 16-bit elements (64 columns) or
// float32 (32 columns). at() is the shared-memory address of an element: 32-bit arithmetic. With
// generic pointers (64-bit) instead, the generic prefill took 0.305 ms instead of 0.234 at B2 T8192
// H32 (H200), and its sm_100f build spilled.
template <typename E>
struct Swizzled128 {
  static_assert(sizeof(E) == 2 || sizeof(E) == 4, "16- or 32-bit elements");
  static constexpr int kLogRow = sizeof(E) == 2 ? 6 : 5;  // log2 of the elements of a 128-byte row
  static constexpr int kLogPiece = kLogRow - 3;           // ... and of a 16-byte piece (the swizzle's unit)
  u32 base;
  int rows;
  __device__ __forceinline__ Swizzled128(const E* p, int rows_) : base(smem_addr(p)), rows(rows_) {}
  __device__ __forceinline__ u32 at(int r, int c) const {
    return base + (u32)sizeof(E) * (u32)((c >> kLogRow) * (rows << kLogRow) + (r << kLogRow) +
                                    ((((c >> kLogPiece) & 7) ^ (r & 7)) << kLogPiece) + (c & ((1 << kLogPiece) - 1)));
  }
};
using SwizzledTile = Swizzled128<u16>;
using SwizzledTileF32 = Swizzled128<float>;

// The first 1024-byte-aligned address of the dynamic shared memory `raw` (the 128-byte swizzle
// repeats every 1024 bytes: a swizzled box must start on that boundary), as a T.
template <typename T>
__device__ __forceinline__ T& smem_aligned_1024(unsigned char* raw) {
  const u32 a = smem_addr(raw);
  return *reinterpret_cast<T*>(raw + (((a + 1023u) & ~1023u) - a));
}

__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// After a thread's mbar_init calls, before the barrier that shows them to the CTA (and to the
// tensor-copy engine).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// One arrival that also announces `bytes` of tensor copies to come on the barrier (its phase ends
// when they have landed).
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// `bytes` more of tensor copies to come on the barrier, without an arrival (the phase still waits
// for its arrivals).
__device__ __forceinline__ void mbar_expect_tx_only(u32 bar, u32 bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity) {
  const u32 addr = smem_addr(bar);
  u32 done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
}
__device__ __forceinline__ void fence_async_smem() {  // generic-proxy writes -> tensor-core / TMA reads
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void tma_load_2d(void* dst, const CulaTensorMap* map, int x, int y, u32 bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_addr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared by the tensor-copy
// engine, completing on the mbarrier at shared address bar.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// A box (C rows, same swizzle as the loads: o of a chunk, the prep's W and U0) from shared memory to
// global by the tensor-copy engine, as a bulk group of the issuing thread.
__device__ __forceinline__ void tma_store_2d(const CulaTensorMap* map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(smem_addr(src)), "r"(x), "r"(y)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// Until the issuing thread's bulk stores have read their shared memory (its buffers are free again),
// or are complete.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
