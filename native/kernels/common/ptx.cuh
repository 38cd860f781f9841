// Small PTX helpers shared by every kernel family: 16-bit types, conversions, warp-level mma.sync,
// ldmatrix, setmaxnreg. Compiled by NVRTC (no CUDA headers).
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

struct bf16_tag {};
struct f16_tag {};

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

#define CULA_LOG2E 1.4426950408889634f  // log2(e): natural-log decays to the exp2 units of fast_exp2

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float fast_rcp(float x) {  // (0 for |x| past 2^126)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<bf16_tag>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> __device__ __forceinline__ u32 pack2<f16_tag>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <typename T> __device__ __forceinline__ float to_float(u16 x);
template <> __device__ __forceinline__ float to_float<bf16_tag>(u16 x) {
  return __uint_as_float(((u32)x) << 16);
}
template <> __device__ __forceinline__ float to_float<f16_tag>(u16 x) {
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x));
  return r;
}

template <typename T> __device__ __forceinline__ u32 scale2(u32 x, float lo, float hi) {
  return pack2<T>(to_float<T>((u16)(x & 0xffffu)) * lo, to_float<T>((u16)(x >> 16)) * hi);
}

// D = A * B + D, m16n8k16, fp32 accumulate.
template <typename T> __device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1);
template <> __device__ __forceinline__ void mma<bf16_tag>(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma<f16_tag>(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix and stmatrix take shared-memory addresses (SwizzledTile::at).
__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Registers per thread of the calling warpgroup from here on (every thread of it must execute the
// same instruction): dec returns some to the CTA's pool, inc waits until the pool has them.
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N) : "memory");
}

// Programmatic dependent launch (sm_90 on; the host's launch(..., early)): a kernel launched so waits
// in grid_dependency_wait until the kernel before it has finished and its writes are visible (at once
// when launched the ordinary way), and that kernel's grid_dependents_launch lets it start early, once
// every CTA of that grid has issued it or exited.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void grid_dependents_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// D = A * B + D, m16n8k8 in tf32 (fp32 operands rounded to 10-bit mantissas, fp32 accumulate):
// a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); b0 (k t, n g), b1 (k t+4, n g); c as m16n8k16.
// The rounding is to nearest even (cvt.rn, sm_90 on): one F2FP instruction on sm_90a and sm_100f,
// where cvt.rna (ties away from zero) is emulated by three (an infinity test, an add, a mask).
__device__ __forceinline__ u32 to_tf32(float x) {
  u32 r;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ void mma_tf32(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory accesses by 32-bit address (SwizzledTile::at).
__device__ __forceinline__ u32 lds_u32(u32 addr) {
  u32 r;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(r) : "r"(addr) : "memory");
  return r;
}
__device__ __forceinline__ void sts_u32(u32 addr, u32 x) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ uint2 lds_u32x2(u32 addr) {
  uint2 r;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(addr) : "memory");
  return r;
}
__device__ __forceinline__ uint4 lds_u32x4(u32 addr) {
  uint4 r;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr) : "memory");
  return r;
}
__device__ __forceinline__ void sts_u32x2(u32 addr, uint2 x) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(addr), "r"(x.x), "r"(x.y) : "memory");
}
__device__ __forceinline__ void sts_zero16(u32 addr) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0u) : "memory");
}
__device__ __forceinline__ u16 lds_u16(u32 addr) {
  u16 r;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(r) : "r"(addr) : "memory");
  return r;
}
__device__ __forceinline__ float lds_f32(u32 addr) {
  float r;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(r) : "r"(addr) : "memory");
  return r;
}
__device__ __forceinline__ float2 lds_f32x2(u32 addr) {
  float2 r;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(r.x), "=f"(r.y) : "r"(addr) : "memory");
  return r;
}
__device__ __forceinline__ void sts_f32(u32 addr, float x) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ void sts_f32x2(u32 addr, float2 x) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x.x), "f"(x.y) : "memory");
}
__device__ __forceinline__ void sts_f32x4(u32 addr, float4 x) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(x.x), "f"(x.y), "f"(x.z), "f"(x.w)
               : "memory");
}

// 16 bytes global -> shared without registers (sm_80+); bytes = 0 fills the 16 bytes with zeros
// (src must still be a valid address). Completion by groups: commit, then wait until at most N of
// the thread's groups are in flight.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Named barriers of the chunked delta-rule kernels (a chain warpgroup of threads 0..127 and an
// output warpgroup of threads 128..255; the gated delta rule's one-launch kernel has a system
// warpgroup between them): each warpgroup's own (1: the chain's, 6: the output's, 8: the system's),
// and the hand-overs between two warpgroups (2 + b: chunk c's U (and boxes, where the chain loads
// them) are ready, b = c % 2; 4 + b: the output warpgroup is done with chunk c's buffers (and, in
// the gated delta rule's walking kernel, has loaded chunk c+2's boxes); 7: the next chunk's A is formed for
// the chain's solve, where a kernel does that; 9: the chain has solved chunk c, for the system
// warpgroup; 10 + b: chunk c's boxes and gates are in, for the system warpgroup; in the gated
// delta rule's one-item kernel, whose fourth warpgroup loads them: 12 + b, every warpgroup is done
// with the buffers chunk c goes into, for the loader; 14 + b, chunk c's boxes and gates are in,
// for the chain). A hand-over is bar.arrive by one warpgroup and bar.sync by the other.
__device__ __forceinline__ void chain_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }
__device__ __forceinline__ void output_sync() { asm volatile("bar.sync 6, 128;" ::: "memory"); }
__device__ __forceinline__ void system_sync() { asm volatile("bar.sync 8, 128;" ::: "memory"); }
// A named barrier of N threads (a multiple of 32) that some warps only arrive at: the hand-overs
// (two warpgroups), and in the prep kernels of common/chunk_kda.cuh id 1 of the whole CTA
// (CULA_PREP_STORE_BAR: the chunk's [W | U0] is written, for warp 0, which stores it) besides
// __syncthreads.
template <int N> __device__ __forceinline__ void cta_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void cta_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(N) : "memory");
}
__device__ __forceinline__ void handover_arrive(int id) { cta_arrive<256>(id); }
__device__ __forceinline__ void handover_sync(int id) { cta_sync<256>(id); }
#define CULA_PREP_STORE_BAR 1
#define CULA_CHUNK_READY_BAR 2
#define CULA_CHUNK_DONE_BAR 4
#define CULA_CHUNK_SOLVE_BAR 7
#define CULA_CHUNK_SYSTEM_BAR 9
#define CULA_CHUNK_BOXES_BAR 10
#define CULA_CHUNK_FREE_BAR 12
#define CULA_CHUNK_LOADED_BAR 14
// The gated delta rule's one-item kernel holds A twice (TWO): chunk c's SOLVE and SYSTEM hand-overs
// by c % 2 on 7 / 6 and 9 / 0 (that kernel has no output_sync and no __syncthreads).
template <bool TWO> __device__ __forceinline__ int solve_bar(int c) {
  return TWO && (c & 1) ? 6 : CULA_CHUNK_SOLVE_BAR;
}
template <bool TWO> __device__ __forceinline__ int system_bar(int c) {
  return TWO && (c & 1) ? 0 : CULA_CHUNK_SYSTEM_BAR;
}
