// The native CPU pass of a Llama-family decoder: one C++ call runs every layer for 1-64 new tokens.
//
// Built on first use by specrepro/engines/native.py (torch.utils.cpp_extension, -O3 -march=native
// -ffp-contract=off), so the instructions are those of the machine it runs on. Three kernel families, chosen
// at build time from the compiler's target flags: AVX512-BF16 (vdpbf16ps products), AVX512F or AVX2 + FMA
// (bfloat16 weights widened to float32 by shifts, FMA products), and a portable one for any other CPU.
//
// Numbers: weights in bfloat16 (the runner's dtype), the activations entering each matrix product rounded to
// bfloat16 as a bfloat16 runner's are, products accumulated in float32; the residual stream, norms, RoPE,
// attention over the float32 KV cache and the SiLU gate stay in float32.
//
// Batch invariance: a token's logits are the same bits whatever else shares its pass (1-64 rows, a chain or
// a tree) and whichever pass wrote the cache entries it reads. Every reduction has one order per output that
// depends on nothing but that output's own length: a product sums its inputs in order into one accumulator
// per output (threads and tiles split outputs, never the inputs); an RMSNorm sums its row in fixed lanes; a
// query's scores, softmax and value sum run over the keys it sees, in position order, with lanes fixed by the
// key's index among them (a tree's hidden keys are skipped, not zero-weighted). -ffp-contract=off keeps the
// compiler from fusing a multiply and an add in one copy of an inlined loop and not in another.
//
// A second target takes int8 weights instead (Packed::int8, llama.cpp's Q8_0: one float32 scale per output and 32
// inputs; the products' input rows quantised alone per 32 as the pass runs; integer block sums, float32 across
// blocks in order): see "int8 products" below. One model holds one kind; the rest of the pass is shared.
//
// Weights are packed once (native.py) as int32 [blocks, K / 2, 16]: each int32 holds the bfloat16 pair
// (w[n][2k] low, w[n][2k + 1] high) of output n = 16 * block + lane. One 64-byte load then feeds 16
// outputs x 2 inputs, the layout AVX512-BF16's vdpbf16ps reads, and the weights stream through once per
// pass whatever the number of rows.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <sys/mman.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

// ---- The instruction sets this module was compiled for (-march=native plus $SPECREPRO_NATIVE_CFLAGS), checked
// against the CPU when the library is loaded, before any code that may use them runs: a module built with
// flags the CPU lacks is refused at import with the missing features named, instead of dying by SIGILL in
// its first pass. The check runs as the library's first constructor and is compiled for baseline x86-64.
// $SPECREPRO_NATIVE_ASSUME_CPU (a comma-separated feature list) replaces the CPU's answers: the tests' way to
// exercise the refusal on a CPU that has every feature the build used.
namespace cpu_check {
char compiled_for[512];  // comma-separated names, as __builtin_cpu_supports spells them
char missing[512];       // those this CPU lacks

void append(char* list, const char* name) {
  const size_t used = std::strlen(list), len = std::strlen(name);
  if (used + len + 2 >= 512) return;
  if (used) list[used] = ',', list[used + 1] = '\0';
  std::strcat(list, name);
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("arch=x86-64"))) bool listed(const char* list, const char* name) {
  const size_t len = std::strlen(name);
  for (const char* p = list; *p;) {
    const char* end = p;
    while (*end && *end != ',' && *end != ' ') ++end;
    if (static_cast<size_t>(end - p) == len && std::strncmp(p, name, len) == 0) return true;
    p = *end ? end + 1 : end;
  }
  return false;
}

__attribute__((target("arch=x86-64"))) void need(const char* name, int supported) {
  const char* assumed = std::getenv("SPECREPRO_NATIVE_ASSUME_CPU");
  append(compiled_for, name);
  if (!(assumed ? listed(assumed, name) : supported != 0)) append(missing, name);
}

#define SPECREPRO_NEED(name) need(name, __builtin_cpu_supports(name))
__attribute__((constructor(101), target("arch=x86-64"))) void check() {
  __builtin_cpu_init();
#ifdef __SSE3__
  SPECREPRO_NEED("sse3");
#endif
#ifdef __SSSE3__
  SPECREPRO_NEED("ssse3");
#endif
#ifdef __SSE4_1__
  SPECREPRO_NEED("sse4.1");
#endif
#ifdef __SSE4_2__
  SPECREPRO_NEED("sse4.2");
#endif
#ifdef __POPCNT__
  SPECREPRO_NEED("popcnt");
#endif
#ifdef __AVX__
  SPECREPRO_NEED("avx");
#endif
#ifdef __AVX2__
  SPECREPRO_NEED("avx2");
#endif
#ifdef __FMA__
  SPECREPRO_NEED("fma");
#endif
#ifdef __F16C__
  SPECREPRO_NEED("f16c");
#endif
#ifdef __BMI__
  SPECREPRO_NEED("bmi");
#endif
#ifdef __BMI2__
  SPECREPRO_NEED("bmi2");
#endif
#ifdef __LZCNT__
  SPECREPRO_NEED("lzcnt");
#endif
#ifdef __MOVBE__
  SPECREPRO_NEED("movbe");
#endif
#ifdef __AES__
  SPECREPRO_NEED("aes");
#endif
#ifdef __PCLMUL__
  SPECREPRO_NEED("pclmul");
#endif
#ifdef __SHA__
  SPECREPRO_NEED("sha");
#endif
#ifdef __ADX__
  SPECREPRO_NEED("adx");
#endif
#ifdef __GFNI__
  SPECREPRO_NEED("gfni");
#endif
#ifdef __VAES__
  SPECREPRO_NEED("vaes");
#endif
#ifdef __VPCLMULQDQ__
  SPECREPRO_NEED("vpclmulqdq");
#endif
#ifdef __AVX512F__
  SPECREPRO_NEED("avx512f");
#endif
#ifdef __AVX512BW__
  SPECREPRO_NEED("avx512bw");
#endif
#ifdef __AVX512VL__
  SPECREPRO_NEED("avx512vl");
#endif
#ifdef __AVX512DQ__
  SPECREPRO_NEED("avx512dq");
#endif
#ifdef __AVX512CD__
  SPECREPRO_NEED("avx512cd");
#endif
#ifdef __AVX512BF16__
  SPECREPRO_NEED("avx512bf16");
#endif
#ifdef __AVX512VNNI__
  SPECREPRO_NEED("avx512vnni");
#endif
#ifdef __AVX512VBMI__
  SPECREPRO_NEED("avx512vbmi");
#endif
#ifdef __AVX512VBMI2__
  SPECREPRO_NEED("avx512vbmi2");
#endif
#ifdef __AVX512IFMA__
  SPECREPRO_NEED("avx512ifma");
#endif
#ifdef __AVX512BITALG__
  SPECREPRO_NEED("avx512bitalg");
#endif
#ifdef __AVX512VPOPCNTDQ__
  SPECREPRO_NEED("avx512vpopcntdq");
#endif
#ifdef __AVX512FP16__
  SPECREPRO_NEED("avx512fp16");
#endif
#ifdef __AVXVNNI__
  SPECREPRO_NEED("avxvnni");
#endif
}
#undef SPECREPRO_NEED
#endif
}  // namespace cpu_check

#if defined(__AVX512F__)
#include <immintrin.h>
#define SPECREPRO_AVX512 1
#if defined(__AVX512BF16__)
#define SPECREPRO_DPBF16 1
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECREPRO_AVX2 1
#endif

namespace {

constexpr int kLanes = 16;  // outputs per packed block


// Denormal floats flushed to zero (FTZ) and read as zero (DAZ) while the pass runs, on the calling thread and on
// every worker thread of its parallel regions (MXCSR is per thread): x86 computes with denormals far more slowly,
// and the AVX512-BF16 products flush them regardless, so every family gives them the same zeros. The previous
// mode is restored on leaving, so the process's other computations see no change.
struct FlushDenormals {
#if defined(__x86_64__) || defined(__i386__)
  unsigned int saved;
  FlushDenormals() : saved(_mm_getcsr()) { _mm_setcsr(saved | 0x8040u); }  // FTZ (bit 15) | DAZ (bit 6)
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

// f() on this thread with denormals flushed. Parallel regions flush inside each worker's part instead, never
// around the region: a worker thread created inside a flushed region would inherit the mode and keep it.
template <class F>
inline void serial(F&& f) {
  const FlushDenormals flush;
  f();
}
// Software prefetch of the weights PF_AHEAD cache lines ahead, for tiles of more than PF_ROWS rows: their
// products are slow enough that the hardware prefetcher falls behind (1 thread, after 300 tokens: a pass over
// 9 tokens 21.8 -> 20.8 ms, over 17 tokens 38.5 -> 35.6; over 2-5 tokens prefetching made it slower).
#ifndef PF_AHEAD
#define PF_AHEAD 16
#endif
#ifndef PF_ROWS
#define PF_ROWS 6
#endif

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// float32 -> bfloat16 bits, round to nearest even (torch's rounding; NaN stays NaN)
inline uint32_t to_bf16(float f) {
  uint32_t b = float_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (b >> 16) | 0x40u;
  return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}


// ---- One vector type per kernel family: kW float32 lanes and the few operations the pass needs. Horizontal
// sums add the lanes in one fixed tree (lane i + lane i + kW/2 first, and so on down).
#if defined(SPECREPRO_AVX512)
constexpr int kW = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset(float f) { return _mm512_set1_ps(f); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline float vhsum(vf v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
// the bfloat16 pairs of kW packed int32s as float32: even inputs (low halves), odd inputs (high halves)
inline void vbf16(const uint32_t* p, vf& even, vf& odd) {
  const __m512i w = _mm512_loadu_si512(p);
  even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  odd = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline vf vfnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf vfloor(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
// 2^n for whole n in the float range's exponents (other n: lanes vexp drops)
inline vf vpow2(vf n) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23)); }
// a * b where x >= c, else 0 (and 0 where x is NaN)
inline vf vmul_where_ge(vf x, float c, vf a, vf b) {
  return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(c), _CMP_GE_OQ), a, b);
}
// out[i] = scale * (the lanes of a_i summed), i < 4; each sum's tree is that of its own vector only
inline void vsum4(vf a0, vf a1, vf a2, vf a3, float scale, float* out) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
  _mm_storeu_ps(out, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), _mm_set1_ps(scale)));
}
#elif defined(SPECREPRO_AVX2)
constexpr int kW = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset(float f) { return _mm256_set1_ps(f); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline float vhsum(vf v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
inline void vbf16(const uint32_t* p, vf& even, vf& odd) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline vf vfnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
inline vf vfloor(vf a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline vf vpow2(vf n) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)); }
inline vf vmul_where_ge(vf x, float c, vf a, vf b) {
  return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(c), _CMP_GE_OQ), _mm256_mul_ps(a, b));
}
inline void vsum4(vf a0, vf a1, vf a2, vf a3, float scale, float* out) {
  const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  _mm_storeu_ps(out, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)), _mm_set1_ps(scale)));
}
#else
constexpr int kW = 8;
struct vf {
  float x[kW];
};
#define SPECREPRO_LANEWISE(expr) \
  vf r;                          \
  for (int i = 0; i < kW; ++i) r.x[i] = (expr); \
  return r;
inline vf vzero() { SPECREPRO_LANEWISE(0.f) }
inline vf vset(float f) { SPECREPRO_LANEWISE(f) }
inline vf vload(const float* p) { SPECREPRO_LANEWISE(p[i]) }
inline void vstore(float* p, vf v) { std::memcpy(p, v.x, sizeof(v.x)); }
inline vf vfma(vf a, vf b, vf c) { SPECREPRO_LANEWISE(a.x[i] * b.x[i] + c.x[i]) }
inline vf vadd(vf a, vf b) { SPECREPRO_LANEWISE(a.x[i] + b.x[i]) }
inline vf vsub(vf a, vf b) { SPECREPRO_LANEWISE(a.x[i] - b.x[i]) }
inline vf vmul(vf a, vf b) { SPECREPRO_LANEWISE(a.x[i] * b.x[i]) }
inline vf vdiv(vf a, vf b) { SPECREPRO_LANEWISE(a.x[i] / b.x[i]) }
inline vf vfnma(vf a, vf b, vf c) { SPECREPRO_LANEWISE(c.x[i] - a.x[i] * b.x[i]) }
inline vf vmin(vf a, vf b) { SPECREPRO_LANEWISE(std::min(a.x[i], b.x[i])) }
inline vf vfloor(vf a) { SPECREPRO_LANEWISE(std::floor(a.x[i])) }
// (n clamped to [-127, 128] first: a float out of int32's range has no defined conversion in C++)
inline vf vpow2(vf n) {
  SPECREPRO_LANEWISE(bits_to_float(static_cast<uint32_t>(static_cast<int32_t>(n.x[i] > -127.f ? std::min(n.x[i], 128.f) : -127.f) + 127) << 23))
}
inline vf vmul_where_ge(vf x, float c, vf a, vf b) { SPECREPRO_LANEWISE(x.x[i] >= c ? a.x[i] * b.x[i] : 0.f) }
inline void vbf16(const uint32_t* p, vf& even, vf& odd) {
  for (int i = 0; i < kW; ++i) {
    even.x[i] = bits_to_float(p[i] << 16);
    odd.x[i] = bits_to_float(p[i] & 0xffff0000u);
  }
}
#undef SPECREPRO_LANEWISE
inline float vhsum(vf v) {
  float q[4];
  for (int i = 0; i < 4; ++i) q[i] = v.x[i] + v.x[i + 4];
  return (q[0] + q[2]) + (q[1] + q[3]);
}
inline void vsum4(vf a0, vf a1, vf a2, vf a3, float scale, float* out) {
  out[0] = vhsum(a0) * scale, out[1] = vhsum(a1) * scale, out[2] = vhsum(a2) * scale, out[3] = vhsum(a3) * scale;
}
#endif

// exp for the softmax and SiLU, written once over the helpers above: Cephes' polynomial after range reduction,
// about 2 ulp. Below -86 it returns 0 (e^-86 < 1e-37): results near the smallest normal float would make the
// products that use them denormal. (The portable family's vfma is a multiply and an add, the others' one FMA.)
inline vf vexp(vf x) {
  const vf xc = vmin(x, vset(88.3f));
  const vf n = vfloor(vfma(xc, vset(1.44269504088896341f), vset(0.5f)));
  vf r = vfnma(n, vset(0.693359375f), xc);
  r = vfma(n, vset(2.12194440e-4f), r);
  vf p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vadd(vfma(vmul(p, r), r, r), vset(1.0f));
  return vmul_where_ge(x, -86.0f, p, vpow2(n));
}

// the first len < kW values at p, the other lanes `fill`
inline vf vload_part(const float* p, int64_t len, float fill) {
  float t[kW];
  for (int i = 0; i < kW; ++i) t[i] = i < len ? p[i] : fill;
  return vload(t);
}

inline void vstore_part(float* p, vf v, int64_t len) {
  float t[kW];
  vstore(t, v);
  std::memcpy(p, t, len * sizeof(float));
}

// x[i] = exp(x[i] - shift) for i < len; returns their sum, added in lanes fixed by i
inline float exp_shifted(float* x, int64_t len, float shift) {
  vf sum = vzero();
  const vf s = vset(shift);
  int64_t i = 0;
  for (; i + kW <= len; i += kW) {
    const vf e = vexp(vsub(vload(x + i), s));
    vstore(x + i, e);
    sum = vadd(sum, e);
  }
  if (i < len) {  // the missing lanes hold exp(-inf) = 0
    const vf e = vexp(vsub(vload_part(x + i, len - i, -INFINITY), s));
    vstore_part(x + i, e, len - i);
    sum = vadd(sum, e);
  }
  return vhsum(sum);
}

// SiLU(gate) * up over len values
inline void silu_mul(const float* gate, const float* up, float* out, int64_t len) {
  const vf one = vset(1.0f);
  int64_t i = 0;
  for (; i + kW <= len; i += kW) {
    const vf g = vload(gate + i);
    vstore(out + i, vmul(vdiv(g, vadd(one, vexp(vsub(vzero(), g)))), vload(up + i)));
  }
  if (i < len) {
    const vf g = vload_part(gate + i, len - i, 0.f);
    vstore_part(out + i, vmul(vdiv(g, vadd(one, vexp(vsub(vzero(), g)))), vload_part(up + i, len - i, 0.f)), len - i);
  }
}

// sum of x[i]^2, i < len, in lanes fixed by i
inline float sum_squares(const float* x, int64_t len) {
  vf acc = vzero();
  int64_t i = 0;
  for (; i + kW <= len; i += kW) {
    const vf v = vload(x + i);
    acc = vfma(v, v, acc);
  }
  if (i < len) {
    const vf v = vload_part(x + i, len - i, 0.f);
    acc = vfma(v, v, acc);
  }
  return vhsum(acc);
}

// ---- Attention. A task is up to kMaxQueries queries that read one kv head: each key and value row is loaded
// once for all of them. Key i of a task is the cache row at(i) (idx[i], or i itself when idx is null), i < len;
// query r sees keys i < lim[r]. Query r's scores, softmax and weighted sum take the same steps for the same
// keys whatever the other queries of its task are, so a token's attention does not depend on the pass.
constexpr int kMaxQueries = 12;

// scratch floats a task needs
inline int64_t attend_scratch(int64_t len) { return kMaxQueries * (len + 4); }

#if defined(SPECREPRO_AVX512)
constexpr int kSumQueries = 6;  // queries whose value sums share the registers (6 x 4 accumulators at d = 64)
constexpr int kSumVectors = 16;  // value vectors per key summed in one sweep over the keys (all of them)
constexpr int kFewQueries = 0;  // tasks of up to this many queries sum them one at a time
#elif defined(SPECREPRO_AVX2)
// 6 queries x 2 vectors (one cache line of each value row) per sweep: 12 accumulators of AVX2's 16 registers.
// Each query then reads its kv head's values once per six queries instead of once each, from L2. A task of up
// to 3 queries (a one-token pass's) sums them one by one, whole rows per sweep: its values sit in L1 or L2
// either way, and fewer sweeps cost less
constexpr int kSumQueries = 6;
constexpr int kSumVectors = 2;
constexpr int kFewQueries = 3;
#else
constexpr int kSumQueries = 1;
constexpr int kSumVectors = 16;
constexpr int kFewQueries = 0;
#endif

// out[r] = softmax(scores) . values for query r, given scores sc[r * len + i] (i < lim[r]); sc becomes the weights.
// The value vectors are summed CC at a time, one sweep over the keys per CC: each lane's sum is the same steps
// whatever CC and R are.
template <int C, int R>
void weighted_sums(float* sc, int64_t len, const int64_t* lim, const float* vals, const int32_t* idx, float* const* out) {
  constexpr int64_t d = C * kW;
  float inv[R];
  int64_t most = 0;
  for (int r = 0; r < R; ++r) {
    float* s = sc + r * len;
    float top = -INFINITY;
    for (int64_t i = 0; i < lim[r]; ++i) top = std::max(top, s[i]);
    inv[r] = lim[r] > 0 ? 1.0f / exp_shifted(s, lim[r], top) : 0.f;  // the top key's weight is 1: the sum >= 1
    most = std::max(most, lim[r]);
  }
  constexpr int CC = R == 1 ? C : C % kSumVectors == 0 ? kSumVectors : C < kSumVectors ? C : 1;
  for (int c0 = 0; c0 < C; c0 += CC) {
    vf acc[R][CC];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CC; ++c) acc[r][c] = vzero();
    for (int64_t i = 0; i < most; ++i) {
      const float* v = vals + (idx ? idx[i] : i) * d + c0 * kW;
      for (int r = 0; r < R; ++r) {
        if (i >= lim[r]) continue;
        const vf e = vset(sc[r * len + i]);
        for (int c = 0; c < CC; ++c) acc[r][c] = vfma(e, vload(v + c * kW), acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < CC; ++c) vstore(out[r] + (c0 + c) * kW, vmul(acc[r][c], vset(inv[r])));
  }
}

template <int C>
void attend(const float* const* q, const int64_t* lim, int nq, const float* keys, const float* vals,
            const int32_t* idx, int64_t len, float scale, float* sc, float* const* out) {
  constexpr int64_t d = C * kW;
  // scores, four keys at a time; a short last block repeats its last key and stores only what it owns
  for (int64_t j = 0; j < len; j += 4) {
    const float* k[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t at = std::min(j + i, len - 1);
      k[i] = keys + (idx ? idx[at] : at) * d;
    }
    constexpr bool held = 4 * C <= 16;  // the four keys stay in registers across the queries
    vf kv[held ? 4 : 1][held ? C : 1];
    if (held)
      for (int i = 0; i < 4; ++i)
        for (int c = 0; c < C; ++c) kv[i][c] = vload(k[i] + c * kW);
    for (int r = 0; r < nq; ++r) {
      if (j >= lim[r]) continue;
      vf a[4] = {vzero(), vzero(), vzero(), vzero()};
      for (int c = 0; c < C; ++c) {
        const vf qc = vload(q[r] + c * kW);
        for (int i = 0; i < 4; ++i) a[i] = vfma(qc, held ? kv[held ? i : 0][held ? c : 0] : vload(k[i] + c * kW), a[i]);
      }
      float s[4];
      vsum4(a[0], a[1], a[2], a[3], scale, s);
      std::memcpy(sc + r * len + j, s, std::min<int64_t>(4, len - j) * sizeof(float));
    }
  }
  const int per = nq <= kFewQueries ? 1 : kSumQueries;
  for (int r0 = 0; r0 < nq; r0 += per) {
    const int nr = std::min(per, nq - r0);
    float* w = sc + r0 * len;
    switch (nr) {
#if defined(SPECREPRO_AVX512) || defined(SPECREPRO_AVX2)
      case 2: weighted_sums<C, 2>(w, len, lim + r0, vals, idx, out + r0); break;
      case 3: weighted_sums<C, 3>(w, len, lim + r0, vals, idx, out + r0); break;
      case 4: weighted_sums<C, 4>(w, len, lim + r0, vals, idx, out + r0); break;
      case 5: weighted_sums<C, 5>(w, len, lim + r0, vals, idx, out + r0); break;
      case 6: weighted_sums<C, 6>(w, len, lim + r0, vals, idx, out + r0); break;
#endif
      default: weighted_sums<C, 1>(w, len, lim + r0, vals, idx, out + r0); break;
    }
  }
}

// the same for any head size d (not a multiple of kW, or larger than the kernels above take): plain loops
void attend_any(const float* const* q, const int64_t* lim, int nq, const float* keys, const float* vals,
                const int32_t* idx, int64_t len, int64_t d, float scale, float* sc, float* const* out) {
  for (int r = 0; r < nq; ++r) {
    float* s = sc + r * len;
    float top = -INFINITY;
    for (int64_t i = 0; i < lim[r]; ++i) {
      const float* k = keys + (idx ? idx[i] : i) * d;
      float dot = 0.f;
      for (int64_t c = 0; c < d; ++c) dot += q[r][c] * k[c];
      s[i] = dot * scale;
      top = std::max(top, s[i]);
    }
    const float inv = lim[r] > 0 ? 1.0f / exp_shifted(s, lim[r], top) : 0.f;
    float* o = out[r];
    std::fill(o, o + d, 0.f);
    for (int64_t i = 0; i < lim[r]; ++i) {
      const float* v = vals + (idx ? idx[i] : i) * d;
      for (int64_t c = 0; c < d; ++c) o[c] += s[i] * v[c];
    }
    for (int64_t c = 0; c < d; ++c) o[c] *= inv;
  }
}

using AttendFn = void (*)(const float* const*, const int64_t*, int, const float*, const float*, const int32_t*, int64_t,
                          float, float*, float* const*);
AttendFn attend_kernel(int64_t d) {
  if (d % kW != 0) return nullptr;
  switch (d / kW) {
    case 1: return &attend<1>;
    case 2: return &attend<2>;
    case 3: return &attend<3>;
    case 4: return &attend<4>;
    case 6: return &attend<6>;
    case 8: return &attend<8>;
    case 16: return &attend<16>;
    default: return nullptr;
  }
}


// The packed weights live in 2 MiB-aligned chunks the kernel is asked to back with huge pages
// (madvise(MADV_HUGEPAGE): this project's machines run transparent huge pages in "madvise" mode): a pass streams
// ~270 MB, and with 4 KiB pages that is ~66,000 TLB misses. A chunk is freed with the last tensor in it.
struct Chunk {
  char* base;
  size_t size, used = 0;
  Chunk(char* b, size_t s) : base(b), size(s) {}
  ~Chunk() { std::free(base); }
};

at::Tensor huge_page_copy(const at::Tensor& src) {
  static std::mutex lock;
  static std::shared_ptr<Chunk> current;
  constexpr size_t kHuge = size_t(2) << 20, kChunk = size_t(64) << 20;
  const size_t bytes = (src.nbytes() + 63) / 64 * 64;
  std::shared_ptr<Chunk> chunk;
  char* dst = nullptr;
  {
    std::lock_guard<std::mutex> guard(lock);
    if (!current || current->used + bytes > current->size) {
      const size_t size = std::max(kChunk, (bytes + kHuge - 1) / kHuge * kHuge);
      void* p = nullptr;
      if (posix_memalign(&p, kHuge, size) != 0) return src.clone();  // no aligned memory: an ordinary copy
#ifdef MADV_HUGEPAGE
      madvise(p, size, MADV_HUGEPAGE);  // advice only: without huge pages the copy works the same
#endif
      current = std::make_shared<Chunk>(static_cast<char*>(p), size);
    }
    chunk = current;
    dst = chunk->base + chunk->used;
    chunk->used += bytes;
  }
  std::memcpy(dst, src.data_ptr(), src.nbytes());
  return at::from_blob(dst, src.sizes(), [chunk](void*) mutable { chunk.reset(); }, src.options());
}

constexpr int64_t kQBlock = 32;  // inputs per int8 quantisation block (one scale per output and block)

// One weight matrix, packed once: bfloat16 pairs (int8 false), or int8 weights (int8 true) with one float32 scale
// per output and block of 32 inputs (llama.cpp's Q8_0): w int32 [blocks, K' / 4, 16], each int32 the four int8
// weights of inputs 4k..4k + 3 of output 16 * block + lane, K' = K rounded up to 32 with zero weights; scales
// float32 [blocks, K' / 32, 16].
struct Packed {
  at::Tensor w;       // int32 [blocks, kp, 16]
  at::Tensor bias;    // float32 [n] or undefined
  at::Tensor scales;  // int8 only: float32 [blocks, nkb, 16]
  int64_t n, k, blocks, kp;
  bool int8 = false;
  int64_t nkb = 0;  // int8 only: blocks of 32 inputs

  // int8 weights: w int32 [blocks, 8 * nkb, 16], scales float32 [blocks, nkb, 16], nkb = ceil(k / 32)
  static Packed quantised(const at::Tensor& w_, const at::Tensor& scales_, std::optional<at::Tensor> bias_, int64_t n_,
                          int64_t k_) {
    TORCH_CHECK(n_ >= 1 && k_ >= 1, "an int8 weight needs at least one output and one input, got ", n_, " x ", k_);
    const int64_t blocks = (n_ + kLanes - 1) / kLanes, nkb = (k_ + kQBlock - 1) / kQBlock;
    TORCH_CHECK(w_.scalar_type() == at::kInt && w_.dim() == 3 && w_.is_contiguous() && w_.size(0) == blocks &&
                    w_.size(1) == nkb * kQBlock / 4 && w_.size(2) == kLanes,
                "int8 weight must be a contiguous int32 [", blocks, ", ", nkb * kQBlock / 4, ", 16] tensor for a ", n_,
                " x ", k_, " matrix, got ", w_.scalar_type(), " ", w_.sizes());
    TORCH_CHECK(scales_.scalar_type() == at::kFloat && scales_.dim() == 3 && scales_.is_contiguous() &&
                    scales_.size(0) == blocks && scales_.size(1) == nkb && scales_.size(2) == kLanes,
                "int8 scales must be a contiguous float32 [", blocks, ", ", nkb, ", 16] tensor for a ", n_, " x ", k_,
                " matrix, got ", scales_.scalar_type(), " ", scales_.sizes());
    Packed p(at::zeros({0, 0, kLanes}, at::kInt), std::move(bias_), 0, 0);
    TORCH_CHECK(!p.bias.defined() || p.bias.numel() == n_, "bias has ", p.bias.numel(), " elements for ", n_, " outputs");
    p.n = n_, p.k = k_, p.blocks = blocks, p.kp = nkb * kQBlock / 4, p.nkb = nkb, p.int8 = true;
    p.w = huge_page_copy(w_);
    p.scales = huge_page_copy(scales_);
    return p;
  }
  const char* kind() const { return int8 ? "int8" : "bfloat16"; }

  Packed(const at::Tensor& w_, std::optional<at::Tensor> bias_, int64_t n_, int64_t k_) : n(n_), k(k_) {
    TORCH_CHECK(w_.scalar_type() == at::kInt && w_.dim() == 3 && w_.size(2) == kLanes && w_.is_contiguous(),
                "packed weight must be a contiguous int32 [blocks, K/2, 16] tensor");
    w = w_.numel() ? huge_page_copy(w_) : w_;
    blocks = w.size(0);
    kp = w.size(1);
    TORCH_CHECK((n >= 1 && k >= 1) || (n == 0 && k == 0), "a packed weight needs at least one output and one input, "
                "got ", n, " x ", k);  // 0 x 0: the model's "no LM head yet"
    TORCH_CHECK(blocks == (n + kLanes - 1) / kLanes && kp == (k + 1) / 2, "packed weight is [", blocks, ", ", kp,
                ", 16], a ", n, " x ", k, " matrix packs to [", (n + kLanes - 1) / kLanes, ", ", (k + 1) / 2, ", 16]");
    if (bias_.has_value()) {
      bias = bias_->to(at::kFloat).contiguous();
      TORCH_CHECK(n == 0 || bias.numel() == n, "bias has ", bias.numel(), " elements for ", n, " outputs");
    }
  }
  int64_t width() const { return blocks * kLanes; }  // row stride of the outputs
};


// y[m][16 b + j] = sum_k W[16 b + j][k] x[m][k] for NB blocks from `w` and MB rows of x: each output's sum runs
// over k in order in one accumulator, whatever MB and NB are (the tile shape never changes a result). x comes
// as bfloat16 pairs (xp, the AVX512-BF16 kernels) or as the same values widened to float32 (xf, the others).
template <int MB, int NB>
void tile(const uint32_t* w, int64_t kp, int64_t k0, int64_t k1, const uint32_t* xp, const float* xf, int64_t ldx,
          float* y, int64_t ldy, bool resume, bool pf) {
#ifdef SPECREPRO_DPBF16
  (void)xf;
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = resume ? _mm512_loadu_ps(y + m * ldy + b * kLanes) : _mm512_setzero_ps();
  for (int64_t k = k0; k < k1; ++k) {
    __m512bh wv[NB];
    for (int b = 0; b < NB; ++b) {
      if (pf) _mm_prefetch(reinterpret_cast<const char*>(w + (b * kp + k + PF_AHEAD) * kLanes), _MM_HINT_T0);
      wv[b] = (__m512bh)_mm512_loadu_si512(w + (b * kp + k) * kLanes);
    }
    for (int m = 0; m < MB; ++m) {
      __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * ldx + k]));
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], wv[b], xv);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(y + m * ldy + b * kLanes, acc[m][b]);
#else
  (void)xp;
  constexpr int H = kLanes / kW;  // vectors per block
  vf acc[MB][NB * H];
  for (int m = 0; m < MB; ++m)
    for (int b = 0; b < NB * H; ++b) acc[m][b] = resume ? vload(y + m * ldy + b * kW) : vzero();
  for (int64_t k = k0; k < k1; ++k) {
    for (int b = 0; b < NB; ++b) {
      const uint32_t* wk = w + (b * kp + k) * kLanes;
      if (pf) __builtin_prefetch(wk + PF_AHEAD * kLanes);
      for (int h = 0; h < H; ++h) {
        vf even, odd;
        vbf16(wk + h * kW, even, odd);
        for (int m = 0; m < MB; ++m) {
          const float* x = xf + m * 2 * ldx + 2 * k;
          acc[m][b * H + h] = vfma(odd, vset(x[1]), vfma(even, vset(x[0]), acc[m][b * H + h]));
        }
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int b = 0; b < NB * H; ++b) vstore(y + m * ldy + b * kW, acc[m][b]);
#endif
}

using TileFn = void (*)(const uint32_t*, int64_t, int64_t, int64_t, const uint32_t*, const float*, int64_t, float*,
                       int64_t, bool, bool);

// Rows per tile call and blocks per tile for a tile of `rows` rows: accumulators = rows x blocks x (16 / kW)
// vectors, in registers (32 of AVX512's, 16 of AVX2's) with room for the weights and inputs.
#if defined(SPECREPRO_AVX512)
#ifndef WIDE_ROWS  // tiles of up to this many rows take four blocks (4 x 4 or, with 6, 6 x 4 accumulators)
#define WIDE_ROWS 4
#endif
constexpr int kMaxRows = 12;
inline int blocks_for(int rows) { return rows <= WIDE_ROWS ? 4 : 2; }
#else
#ifndef AVX2_ROWS
#define AVX2_ROWS 3
#endif
constexpr int kMaxRows = AVX2_ROWS;
#if AVX2_ROWS == 3
inline int blocks_for(int rows) { return rows == 1 ? 4 : 2; }
#else
inline int blocks_for(int rows) { return rows == 1 ? 4 : rows == 2 ? 2 : 1; }
#endif
#endif
// k-slabs: a thread's four blocks are walked SLAB pairs at a time, every row tile over one slab before the
// next, so that the slab's weights come from DRAM once and stay in L1 for the other row tiles
#ifndef SLAB
#if defined(SPECREPRO_DPBF16)
#define SLAB 0
#else
#define SLAB 128
#endif
#endif
#ifndef PF_FIRST
#if defined(SPECREPRO_DPBF16)
#define PF_FIRST 0
#else
#define PF_FIRST 2
#endif
#endif

// The tile functions of one kernel family by row count (1..Family::kRows) and blocks per tile (1, 2 or 4):
// Family names its function type Fn, kRows and at<rows, blocks>(), the instantiated tile.
template <typename Family, int NB, int... MB>
constexpr std::array<typename Family::Fn, sizeof...(MB)> tile_row(std::integer_sequence<int, MB...>) {
  return {Family::template at<MB + 1, NB>()...};
}

template <typename Family>
struct TileTable {
  using Rows = std::make_integer_sequence<int, Family::kRows>;
  static constexpr auto one = tile_row<Family, 1>(Rows{});
  static constexpr auto two = tile_row<Family, 2>(Rows{});
  static constexpr auto four = tile_row<Family, 4>(Rows{});
  static typename Family::Fn pick(int rows, int nb) {
    if (nb == 4) return four[rows - 1];
    return nb == 2 ? two[rows - 1] : one[rows - 1];
  }
};

struct BF16Tiles {
  using Fn = TileFn;
  static constexpr int kRows = kMaxRows;
  template <int M, int NB>
  static constexpr Fn at() { return &tile<M, NB>; }
};

TileFn pick(int rows, int nb) { return TileTable<BF16Tiles>::pick(rows, nb); }

// The float32 inputs of the kernels without bfloat16 products: one buffer per calling thread, reused by every
// call, with kPadRows zero rows after the last row. The padding is there because GCC 12 vectorizes the portable
// family's tile<4, 1> (its loops over the plain `vf` struct) into 8-byte loads that take x from rows 4 and 5 as
// well, then discard them (found in the core dumps of the portable build's intermittent SIGSEGV: a 64-row pass,
// last tile, loads from rows 64 and 65 of a 64-row buffer). Past the end of a heap buffer that ends at the top of
// the heap those loads fault; inside the padding they read zeros nobody uses.
// $SPECREPRO_NATIVE_GUARD_PAGE=1 (read once) puts the buffer's end against an unreadable page, so that any read
// past the padding faults every time instead of once in a while (the tests run the portable family that way).
constexpr int64_t kPadRows = 8;

float* widened_inputs(int64_t floats) {
  static const bool guard = [] {
    const char* v = std::getenv("SPECREPRO_NATIVE_GUARD_PAGE");
    return v != nullptr && v[0] == '1';
  }();
  thread_local std::vector<float> plain;
  thread_local char* mapped = nullptr;
  thread_local size_t mapped_bytes = 0;
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (!guard) {
    if (plain.size() < static_cast<size_t>(floats)) plain.resize(floats);
    return plain.data();
  }
  const size_t page = 4096, usable = (bytes + page - 1) / page * page;
  if (mapped == nullptr || mapped_bytes < usable + page) {
    if (mapped != nullptr) munmap(mapped, mapped_bytes);
    mapped_bytes = usable + page;
    void* m = mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(m != MAP_FAILED, "no memory for the kernel inputs");
    mapped = static_cast<char*>(m);
    TORCH_CHECK(mprotect(mapped + mapped_bytes - page, page, PROT_NONE) == 0, "mprotect failed");
  }
  return reinterpret_cast<float*>(mapped + mapped_bytes - page - bytes);  // ends where the unreadable page starts
}

// Y [rows, p.width()] = X W^T (+ bias), X as bfloat16 pairs [rows, ldx >= p.kp]. The threads split the outputs
// (blocks of 16) in even contiguous ranges; each walks its range four blocks at a time, all rows per four.
void gemv(const Packed& p, const uint32_t* x, int64_t rows, int64_t ldx, float* y) {
  const auto* w = reinterpret_cast<const uint32_t*>(p.w.data_ptr<int32_t>());
  const int64_t ldy = p.width();
  const float* xf = nullptr;  // the kernels without bfloat16 products read the inputs as float32
#ifndef SPECREPRO_DPBF16
  float* wide = widened_inputs((rows + kPadRows) * 2 * ldx);
  for (int64_t i = 0; i < rows * ldx; ++i) {
    wide[2 * i] = bits_to_float(x[i] << 16);
    wide[2 * i + 1] = bits_to_float(x[i] & 0xffff0000u);
  }
  std::fill(wide + rows * 2 * ldx, wide + (rows + kPadRows) * 2 * ldx, 0.f);
  xf = wide;
#endif
  at::parallel_for(0, p.blocks, 1, [&](int64_t first, int64_t last) {
    const FlushDenormals flush;
    const int64_t slab = SLAB > 0 && rows > kMaxRows ? SLAB : p.kp;
    for (int64_t b0 = first; b0 < last; b0 += 4) {
      const int64_t b1 = std::min(b0 + 4, last);
      for (int64_t k0 = 0; k0 < p.kp; k0 += slab) {
        const int64_t k1 = std::min(k0 + slab, p.kp);
        for (int64_t m0 = 0; m0 < rows; m0 += kMaxRows) {  // the four blocks' weights stay in cache across rows
          const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, rows - m0));
          const bool pf = mb > PF_ROWS || (PF_FIRST > 0 && m0 == 0 && rows >= PF_FIRST);
          for (int64_t b = b0; b < b1;) {
            int nb = blocks_for(mb);
            while (nb > b1 - b) nb /= 2;
            pick(mb, nb)(w + b * p.kp * kLanes, p.kp, k0, k1, x + m0 * ldx, xf + m0 * 2 * ldx, ldx,
                         y + m0 * ldy + b * kLanes, ldy, k0 > 0, pf);
            b += nb;
          }
        }
      }
    }
  });
  if (p.bias.defined()) {
    const FlushDenormals flush;
    const float* bias = p.bias.data_ptr<float>();
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t j = 0; j < p.n; ++j) y[m * ldy + j] += bias[j];
  }
}

// rows of float32 [rows, ld] (first k used) -> bfloat16 pairs [rows, kp]
void to_pairs(const float* src, int64_t rows, int64_t ld, int64_t k, uint32_t* dst, int64_t kp) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* s = src + m * ld;
    uint32_t* d = dst + m * kp;
    for (int64_t i = 0; i < k / 2; ++i) d[i] = to_bf16(s[2 * i]) | (to_bf16(s[2 * i + 1]) << 16);
    if (k % 2) d[k / 2] = to_bf16(s[k - 1]);
    for (int64_t i = (k + 1) / 2; i < kp; ++i) d[i] = 0;
  }
}

// ---- int8 products (weights packed by native.py's pack_int8; Packed::int8). Each row of X is quantised alone,
// per block of 32 inputs: d = max |x| / 127, q = round-to-nearest-even(x * (1 / d)) (q = 0 where d = 0). Output n
// of row m is then, over the blocks b in order, y = y + float(sum_i q_w[n][i] q_x[m][i]) * (d_w[n][b] * d_x[m][b]),
// three float32 roundings per block (a multiply, a multiply, an add: no FMA) after an exact integer sum. Every
// family computes exactly these steps, so the three give the same bits, and a row's outputs are the same whatever
// shares its call. The integer sums: AVX512-VNNI vpdpbusd over (q_x + 128) as unsigned bytes, less 128 x the
// weights' sum (also a vpdpbusd); AVX2 vpmaddubsw over |q_x| and the weights with q_x's signs (no int16
// saturation: |q| <= 127), then vpmaddwd; portable: plain int32 sums.
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(SPECREPRO_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SPECREPRO_I8_VNNI 1
#elif defined(__AVX2__)
#define SPECREPRO_I8_AVX2 1
#endif

// A row's quantised inputs: kpad = 32 * nkb bytes of q, then kpad bytes of |q| (what the AVX2 kernels read); the
// scales d apart, nkb floats per row.
inline int64_t quantised_row_bytes(int64_t nkb) { return 2 * nkb * kQBlock; }

void quantise_rows(const float* src, int64_t rows, int64_t ld, int64_t k, int64_t nkb, int8_t* q, float* d) {
  const int64_t kpad = nkb * kQBlock;
  for (int64_t m = 0; m < rows; ++m) {
    const float* x = src + m * ld;
    int8_t* qm = q + m * 2 * kpad;
    for (int64_t b = 0; b < nkb; ++b) {
      const int64_t i0 = b * kQBlock, i1 = std::min(i0 + kQBlock, k);
#if defined(__AVX2__)
      if (i1 - i0 == kQBlock) {  // a whole block: the same steps in vectors (a max, a multiply, round to even)
        __m256 v[4], top = _mm256_setzero_ps();
        const __m256 sign = _mm256_set1_ps(-0.f);
        for (int j = 0; j < 4; ++j) {
          v[j] = _mm256_loadu_ps(x + i0 + 8 * j);
          top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        t = _mm_max_ps(t, _mm_movehl_ps(t, t));
        const float amax = std::max(_mm_cvtss_f32(t), _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1)));
        const float dm = amax / 127.f;
        const __m256 id = _mm256_set1_ps(dm != 0.f ? 1.f / dm : 0.f);
        d[m * nkb + b] = dm;
        __m256i r[4];
        for (int j = 0; j < 4; ++j) {
          const __m256 q = _mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          r[j] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_set1_ps(-127.f), _mm256_min_ps(_mm256_set1_ps(127.f), q)));
        }
        const __m256i bytes = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3])),
            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qm + i0), bytes);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qm + kpad + i0), _mm256_abs_epi8(bytes));
        continue;
      }
#endif
      float amax = 0.f;
      for (int64_t i = i0; i < i1; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float dm = amax / 127.f;
      const float id = dm != 0.f ? 1.f / dm : 0.f;
      d[m * nkb + b] = dm;
      for (int64_t i = i0; i < i0 + kQBlock; ++i) {
        const float v = i < i1 ? std::nearbyint(x[i] * id) : 0.f;
        const int r = static_cast<int>(std::max(-127.f, std::min(127.f, v)));
        qm[i] = static_cast<int8_t>(r);
        qm[kpad + i] = static_cast<int8_t>(r < 0 ? -r : r);
      }
    }
  }
}

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// y[m][16 b + j] over the 32-input blocks kb0..kb1 of NB output blocks and MB rows (y holds the sums of the
// earlier blocks when `resume`). w: NB blocks' int8 weights (block stride kp int32 x 16), ws their scales (stride
// nkb x 16); xq: rows of quantised inputs (stride ldq bytes, kpad of q then |q|), xd their scales (stride nkb).
template <int MB, int NB>
void tile8(const uint32_t* w, const float* ws, int64_t kp, int64_t nkb, int64_t kb0, int64_t kb1, const int8_t* xq,
           int64_t ldq, const float* xd, float* y, int64_t ldy, bool resume, bool pf) {
  const int64_t kpad = nkb * kQBlock;
  if (!resume)
    for (int m = 0; m < MB; ++m) std::fill(y + m * ldy, y + m * ldy + NB * kLanes, 0.f);
#if defined(SPECREPRO_I8_VNNI)
  (void)kpad;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    __m512i acc[MB][NB], corr[NB];
    for (int b = 0; b < NB; ++b) {
      corr[b] = _mm512_setzero_si512();
      for (int m = 0; m < MB; ++m) acc[m][b] = _mm512_setzero_si512();
    }
    for (int64_t k = kb * 8; k < kb * 8 + 8; ++k) {
      __m512i wv[NB];
      for (int b = 0; b < NB; ++b) {
        if (pf) _mm_prefetch(reinterpret_cast<const char*>(w + (b * kp + k + PF_AHEAD) * kLanes), _MM_HINT_T0);
        wv[b] = _mm512_loadu_si512(w + (b * kp + k) * kLanes);
        corr[b] = _mm512_dpbusd_epi32(corr[b], offset, wv[b]);  // 128 x the weights' sum
      }
      for (int m = 0; m < MB; ++m) {
        const __m512i xv = _mm512_xor_si512(_mm512_set1_epi32(load4(xq + m * ldq + 4 * k)), offset);  // q + 128
        for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbusd_epi32(acc[m][b], xv, wv[b]);
      }
    }
    for (int m = 0; m < MB; ++m) {
      const __m512 dx = _mm512_set1_ps(xd[m * nkb + kb]);
      for (int b = 0; b < NB; ++b) {
        const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(ws + (b * nkb + kb) * kLanes), dx);
        const __m512 c = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m][b], corr[b])), s);
        float* ym = y + m * ldy + b * kLanes;
        _mm512_storeu_ps(ym, _mm512_add_ps(_mm512_loadu_ps(ym), c));
      }
    }
  }
#elif defined(SPECREPRO_I8_AVX2)
  constexpr int V = 2 * NB;  // 8-output vectors
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    __m256i acc[MB][V];
    for (int m = 0; m < MB; ++m)
      for (int v = 0; v < V; ++v) acc[m][v] = _mm256_setzero_si256();
    for (int64_t k = kb * 8; k < kb * 8 + 8; ++k) {
      __m256i wv[V];
      for (int b = 0; b < NB; ++b) {
        const uint32_t* wk = w + (b * kp + k) * kLanes;
        if (pf) __builtin_prefetch(wk + PF_AHEAD * kLanes);
        wv[2 * b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk));
        wv[2 * b + 1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wk + 8));
      }
      for (int m = 0; m < MB; ++m) {
        const __m256i xs = _mm256_set1_epi32(load4(xq + m * ldq + 4 * k));
        const __m256i xa = _mm256_set1_epi32(load4(xq + m * ldq + kpad + 4 * k));
        for (int v = 0; v < V; ++v)
          acc[m][v] = _mm256_add_epi32(acc[m][v], _mm256_madd_epi16(_mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv[v], xs)), ones));
      }
    }
    for (int m = 0; m < MB; ++m) {
      const __m256 dx = _mm256_set1_ps(xd[m * nkb + kb]);
      for (int v = 0; v < V; ++v) {
        const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(ws + ((v / 2) * nkb + kb) * kLanes + (v % 2) * 8), dx);
        const __m256 c = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[m][v]), s);
        float* ym = y + m * ldy + v * 8;
        _mm256_storeu_ps(ym, _mm256_add_ps(_mm256_loadu_ps(ym), c));
      }
    }
  }
#else
  (void)pf;
  (void)kpad;
  for (int64_t kb = kb0; kb < kb1; ++kb)
    for (int b = 0; b < NB; ++b) {
      int32_t acc[MB][kLanes] = {};
      for (int64_t k = kb * 8; k < kb * 8 + 8; ++k) {
        const uint32_t* wk = w + (b * kp + k) * kLanes;
        for (int j = 0; j < kLanes; ++j) {
          int8_t wb[4];
          std::memcpy(wb, wk + j, 4);
          for (int m = 0; m < MB; ++m) {
            const int8_t* x = xq + m * ldq + 4 * k;
            acc[m][j] += wb[0] * x[0] + wb[1] * x[1] + wb[2] * x[2] + wb[3] * x[3];
          }
        }
      }
      for (int m = 0; m < MB; ++m) {
        const float dx = xd[m * nkb + kb];
        for (int j = 0; j < kLanes; ++j) {
          const float s = ws[(b * nkb + kb) * kLanes + j] * dx;
          const float c = static_cast<float>(acc[m][j]) * s;
          y[m * ldy + b * kLanes + j] = y[m * ldy + b * kLanes + j] + c;
        }
      }
    }
#endif
}

using Tile8Fn = void (*)(const uint32_t*, const float*, int64_t, int64_t, int64_t, int64_t, const int8_t*, int64_t,
                         const float*, float*, int64_t, bool, bool);

// rows per int8 tile call and blocks per tile: accumulators (rows x blocks x 16 / lanes int32 vectors) in registers
#if defined(SPECREPRO_I8_VNNI)
#ifndef I8_ROWS
#define I8_ROWS 8
#endif
inline int blocks8_for(int rows) { return rows <= 4 ? 4 : 2; }
#elif defined(SPECREPRO_I8_AVX2)
// 5 rows x 2 vectors: 10 accumulators of AVX2's 16 registers (products in cache, 1 thread, 9 rows: 53 G
// multiply-adds/s with 5-row tiles, 52 with 4, 35 with 3 and the pairs summed by shifts instead of vpmaddwd)
#ifndef I8_ROWS
#define I8_ROWS 5
#endif
inline int blocks8_for(int rows) { return rows == 1 ? 2 : 1; }
#else
#ifndef I8_ROWS
#define I8_ROWS 4
#endif
inline int blocks8_for(int rows) { return rows == 1 ? 2 : 1; }
#endif
constexpr int kMaxRows8 = I8_ROWS;
#ifndef I8_PF_FIRST  // prefetch in the first row tile of calls of at least this many rows (0: never)
#define I8_PF_FIRST 0
#endif
#ifndef I8_SLAB  // 32-input blocks per k-slab when a call has more than kMaxRows8 rows
#define I8_SLAB 8
#endif

struct Int8Tiles {
  using Fn = Tile8Fn;
  static constexpr int kRows = kMaxRows8;
  template <int M, int NB>
  static constexpr Fn at() { return &tile8<M, NB>; }
};

Tile8Fn pick8(int rows, int nb) { return TileTable<Int8Tiles>::pick(rows, nb); }

// Y [rows, p.width()] = X W^T (+ bias) for int8 weights, X quantised (quantise_rows: q [rows, ldq bytes], d
// [rows, p.nkb]). The threads split the outputs as gemv's do.
void gemv8(const Packed& p, const int8_t* xq, const float* xd, int64_t rows, int64_t ldq, float* y) {
  const auto* w = reinterpret_cast<const uint32_t*>(p.w.data_ptr<int32_t>());
  const float* ws = p.scales.data_ptr<float>();
  const int64_t ldy = p.width();
  at::parallel_for(0, p.blocks, 1, [&](int64_t first, int64_t last) {
    const FlushDenormals flush;
    const int64_t slab = rows > kMaxRows8 ? I8_SLAB : p.nkb;
    for (int64_t b0 = first; b0 < last; b0 += 4) {
      const int64_t b1 = std::min(b0 + 4, last);
      for (int64_t k0 = 0; k0 < p.nkb; k0 += slab) {
        const int64_t k1 = std::min(k0 + slab, p.nkb);
        for (int64_t m0 = 0; m0 < rows; m0 += kMaxRows8) {
          const int mb = static_cast<int>(std::min<int64_t>(kMaxRows8, rows - m0));
          const bool pf = mb > PF_ROWS || (I8_PF_FIRST > 0 && m0 == 0 && rows >= I8_PF_FIRST);
          for (int64_t b = b0; b < b1;) {
            int nb = blocks8_for(mb);
            while (nb > b1 - b) nb /= 2;
            pick8(mb, nb)(w + b * p.kp * kLanes, ws + b * p.nkb * kLanes, p.kp, p.nkb, k0, k1, xq + m0 * ldq, ldq,
                          xd + m0 * p.nkb, y + m0 * ldy + b * kLanes, ldy, k0 > 0, pf);
            b += nb;
          }
        }
      }
    }
  });
  if (p.bias.defined()) {
    const FlushDenormals flush;
    const float* bias = p.bias.data_ptr<float>();
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t j = 0; j < p.n; ++j) y[m * ldy + j] += bias[j];
  }
}

// The inputs of one product, in the form its weights take: bfloat16 pairs, or int8 blocks and their scales.
// Buffers sized once for a pass (the largest product) and reused by every product of it.
class Operand {
 public:
  Operand(int64_t rows, int64_t k_max) {
    const int64_t kp = (k_max + 1) / 2, nkb = (k_max + kQBlock - 1) / kQBlock;
    pairs_ = at::empty({rows, kp}, at::kInt);
    q_ = at::empty({rows, quantised_row_bytes(nkb)}, at::kChar);
    d_ = at::empty({rows, nkb}, at::kFloat);
  }
  // src rows [rows, ld] (first p.k used), as p's kernel reads them
  void set(const Packed& p, const float* src, int64_t rows, int64_t ld) {
    if (p.int8)
      quantise_rows(src, rows, ld, p.k, p.nkb, q_.data_ptr<int8_t>(), d_.data_ptr<float>());
    else
      to_pairs(src, rows, ld, p.k, reinterpret_cast<uint32_t*>(pairs_.data_ptr<int32_t>()), p.kp);
  }
  // y [rows, p.width()] = the rows set last, times p
  void multiply(const Packed& p, int64_t rows, float* y) const {
    if (p.int8)
      gemv8(p, q_.data_ptr<int8_t>(), d_.data_ptr<float>(), rows, quantised_row_bytes(p.nkb), y);
    else
      gemv(p, reinterpret_cast<const uint32_t*>(pairs_.data_ptr<int32_t>()), rows, p.kp, y);
  }

 private:
  at::Tensor pairs_, q_, d_;
};

void rms_norm(const float* x, int64_t rows, int64_t h, const float* weight, float eps, float* out) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* xm = x + m * h;
    const float scale = 1.0f / std::sqrt(sum_squares(xm, h) / static_cast<float>(h) + eps);
    for (int64_t i = 0; i < h; ++i) out[m * h + i] = weight[i] * (xm[i] * scale);
  }
}

// HF's half-split RoPE of one head vector in place
void rotate(float* v, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// The attention of one pass over n tokens (heads query heads reading kv_heads kv heads of size d): its tasks are
// (kv head, up to kMaxQueries of its queries in token-major order). In a chain the query at token t sees cache
// slots 0..start + t; in a tree (mask [n, start + n]) those its mask row allows, listed in slot order
// (`visible`, `seen` of them per token), and a task then holds the queries of one token only.
class Attention {
 public:
  Attention(int64_t n, int64_t heads, int64_t kv_heads, int64_t d, int64_t start, const bool* mask)
      : n_(n), group_(heads / kv_heads), d_(d), start_(start), end_(start + n), tree_(mask != nullptr),
        kernel_(attend_kernel(d)) {
    const int64_t per_task = tree_ ? std::min<int64_t>(group_, kMaxQueries) : kMaxQueries;
    for (int64_t g = 0; g < kv_heads; ++g)
      for (int64_t first = 0; first < n * group_;) {
        const int64_t stop = tree_ ? (first / group_ + 1) * group_ : n * group_;
        const int nq = static_cast<int>(std::min(per_task, stop - first));
        tasks_.push_back(Task{g, first, nq});
        first += nq;
      }
    if (tree_) {
      visible_.resize(n * end_);
      seen_.assign(n, 0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < end_; ++j)
          if (mask[t * end_ + j]) visible_[t * end_ + seen_[t]++] = static_cast<int32_t>(j);
    }
  }

  // out rows [n, heads * d] (stride ldo) from query rows qs (stride ldq, heads * d used) and the cache rows of
  // the kv heads, keys and vals [kv_heads, capacity, d]
  void run(const float* qs, int64_t ldq, float* os, int64_t ldo, const float* keys, const float* vals,
           int64_t capacity) const {
    const int64_t d = d_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    at::parallel_for(0, static_cast<int64_t>(tasks_.size()), 1, [&](int64_t i0, int64_t i1) {
      const FlushDenormals flush;
      thread_local std::vector<float> scratch;
      for (int64_t i = i0; i < i1; ++i) {
        const Task& task = tasks_[i];
        const float* qp[kMaxQueries];
        float* op[kMaxQueries];
        int64_t lim[kMaxQueries], len = 0;
        for (int r = 0; r < task.nq; ++r) {
          const int64_t t = (task.first + r) / group_, hh = task.g * group_ + (task.first + r) % group_;
          qp[r] = qs + t * ldq + hh * d;
          op[r] = os + t * ldo + hh * d;
          lim[r] = tree_ ? seen_[t] : start_ + t + 1;
          len = std::max(len, lim[r]);
        }
        const int32_t* idx = tree_ ? visible_.data() + (task.first / group_) * end_ : nullptr;
        if (static_cast<int64_t>(scratch.size()) < attend_scratch(len)) scratch.resize(attend_scratch(len));
        const float* k = keys + task.g * capacity * d;
        const float* v = vals + task.g * capacity * d;
        if (kernel_)
          kernel_(qp, lim, task.nq, k, v, idx, len, scale, scratch.data(), op);
        else
          attend_any(qp, lim, task.nq, k, v, idx, len, d, scale, scratch.data(), op);
      }
    });
  }

 private:
  struct Task {
    int64_t g, first;
    int nq;
  };
  int64_t n_, group_, d_, start_, end_;
  bool tree_;
  AttendFn kernel_;
  std::vector<Task> tasks_;
  std::vector<int32_t> visible_;
  std::vector<int64_t> seen_;
};

// Attention alone, for tests: q [n, heads, d], keys and vals [kv_heads, capacity, d] float32; as in a pass at
// cache length `start` (mask: a tree's [n, start + n], or None: causal). Returns [n, heads, d].
at::Tensor attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& vals, int64_t start,
                     const std::optional<at::Tensor>& mask) {
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && vals.sizes() == keys.sizes() && q.size(2) == keys.size(2),
              "attention takes q [n, heads, d] and keys, vals [kv_heads, capacity, d]");
  const int64_t n = q.size(0), heads = q.size(1), kv_heads = keys.size(0), d = q.size(2);
  TORCH_CHECK(n >= 1 && heads >= 1 && kv_heads >= 1 && d >= 1, "attention needs at least one token, head, kv head and "
              "feature, got q ", q.sizes(), " and keys ", keys.sizes());
  TORCH_CHECK(heads % kv_heads == 0, heads, " query heads do not group over ", kv_heads, " kv heads");
  TORCH_CHECK(start >= 0 && start + n <= keys.size(1), "positions ", start, "..", start + n, " exceed the cache");
  at::Tensor qc = q.to(at::kFloat).contiguous(), kc = keys.to(at::kFloat).contiguous(), vc = vals.to(at::kFloat).contiguous();
  at::Tensor mc;
  if (mask.has_value()) {
    mc = mask->to(at::kBool).contiguous();
    TORCH_CHECK(mc.dim() == 2 && mc.size(0) == n && mc.size(1) == start + n, "mask must be [n, start + n]");
  }
  at::Tensor out = at::empty({n, heads, d}, at::kFloat);
  const Attention plan(n, heads, kv_heads, d, start, mask.has_value() ? mc.data_ptr<bool>() : nullptr);
  plan.run(qc.data_ptr<float>(), heads * d, out.data_ptr<float>(), heads * d, kc.data_ptr<float>(),
           vc.data_ptr<float>(), kc.size(1));
  return out;
}

struct Layer {
  at::Tensor ln1, ln2;  // float32 [H]
  Packed qkv, o, gate_up, down;
};

class Model {
 public:
  Model(at::Tensor embed, at::Tensor norm, double eps, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim)
      : embed_(std::move(embed)), norm_(norm.to(at::kFloat).contiguous()), eps_(static_cast<float>(eps)),
        heads_(n_heads), kv_heads_(n_kv_heads), head_dim_(head_dim) {
    TORCH_CHECK(n_heads >= 1 && n_kv_heads >= 1, "the native pass needs at least one query head and one kv head, got ",
                n_heads, " and ", n_kv_heads);
    TORCH_CHECK(n_heads % n_kv_heads == 0, n_heads, " query heads do not group over ", n_kv_heads, " kv heads");
    TORCH_CHECK(head_dim >= 2 && head_dim % 2 == 0, "head size must be even and >= 2 (RoPE rotates halves), got ",
                head_dim);
    TORCH_CHECK(embed_.dim() == 2 && embed_.size(0) >= 1 && embed_.size(1) >= 1,
                "the embedding must be [vocab, hidden], got ", embed_.sizes());
    hidden_ = embed_.size(1);
    TORCH_CHECK(norm_.numel() == hidden_, "final norm has ", norm_.numel(), " weights for hidden size ", hidden_);
  }

  void add_layer(at::Tensor ln1, const Packed& qkv, const Packed& o, at::Tensor ln2, const Packed& gate_up,
                 const Packed& down) {
    const int64_t h = hidden_, q = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
    TORCH_CHECK(qkv.k == h && qkv.n == q + 2 * kv, "q/k/v projection is ", qkv.n, " x ", qkv.k, ", expected ",
                q + 2 * kv, " x ", h);
    TORCH_CHECK(o.k == q && o.n == h, "o projection is ", o.n, " x ", o.k, ", expected ", h, " x ", q);
    TORCH_CHECK(gate_up.k == h && gate_up.n % 2 == 0, "gate/up projection is ", gate_up.n, " x ", gate_up.k);
    TORCH_CHECK(down.k == gate_up.n / 2 && down.n == h, "down projection is ", down.n, " x ", down.k);
    TORCH_CHECK(ln1.numel() == h && ln2.numel() == h, "layer ", layers_.size(), "'s norms have ", ln1.numel(), " and ",
                ln2.numel(), " weights for hidden size ", h);
    for (const auto& [name, p] : {std::pair<const char*, const Packed*>{"q/k/v projection", &qkv}, {"o projection", &o},
                                   {"gate/up projection", &gate_up}, {"down projection", &down}})
      check_kind(*p, std::string("layer ") + std::to_string(layers_.size()) + "'s " + name);
    TORCH_CHECK(layers_.empty() || gate_up.n == layers_.front().gate_up.n, "layer ", layers_.size(), "'s MLP is ",
                gate_up.n / 2, " wide, layer 0's ", layers_.front().gate_up.n / 2,
                ": layers of different shapes are not supported by the native pass");
    layers_.push_back(Layer{ln1.to(at::kFloat).contiguous(), ln2.to(at::kFloat).contiguous(), qkv, o, gate_up, down});
  }

  const char* kind() const { return kind_ ? kind_ : "none"; }

  void set_head(const Packed& head) {
    TORCH_CHECK(head.k == hidden_, "LM head reads ", head.k, " features, hidden size is ", hidden_);
    check_kind(head, "the LM head");
    head_ = head;
  }

  // An input projection (a draft fed with features, not token ids): forward_features(x [n, in]) runs it on x
  // (bfloat16-rounded inputs as every product) and feeds its [n, H] out to the first layer.
  void set_input(const Packed& input) {
    TORCH_CHECK(input.n == hidden_ && input.k >= 1, "input projection is ", input.n, " x ", input.k,
                ", expected ", hidden_, " outputs (the hidden size)");
    check_kind(input, "the input projection");
    input_ = input;
  }

  // Layers whose output (the residual stream after them) each pass also returns, in this order (EAGLE-3's
  // low, middle and top features); none by default.
  void set_taps(const std::vector<int64_t>& taps) {
    for (int64_t t : taps)
      TORCH_CHECK(t >= 0 && t < static_cast<int64_t>(layers_.size()), "tap layer ", t, " is not one of the model's ",
                  layers_.size(), " layers (add them before set_taps)");
    taps_ = taps;
  }

  // ids [n] int64; cos, sin float32 [n, head_dim] at the tokens' positions; mask bool [n, start + n] or None
  // (causal); caches float32 [layers, 1, kv_heads, capacity, head_dim], written at slots start..start + n.
  // Returns (hidden float32 [n, H] after the final norm, logits float32 [n, V] or None, taps float32
  // [n, taps, H]).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& ids, int64_t start, const at::Tensor& cos,
                                                         const at::Tensor& sin, const std::optional<at::Tensor>& mask,
                                                         at::Tensor& k_cache, at::Tensor& v_cache, bool logits) {
    TORCH_CHECK(ids.dim() == 1 && ids.numel() >= 1, "ids must be a non-empty 1-D tensor, got shape ", ids.sizes());
    at::Tensor x = embed_.index_select(0, ids.to(at::kLong)).to(at::kFloat).contiguous();  // residual stream
    return run(x, start, cos, sin, mask, k_cache, v_cache, logits);
  }

  // As forward, from features [n, F] (float32) instead of token ids: through the input projection when one
  // is set, else F must be the hidden size and the features are the residual stream entering layer 0.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_features(const at::Tensor& features, int64_t start,
                                                                  const at::Tensor& cos, const at::Tensor& sin,
                                                                  const std::optional<at::Tensor>& mask,
                                                                  at::Tensor& k_cache, at::Tensor& v_cache,
                                                                  bool logits) {
    TORCH_CHECK(features.dim() == 2 && features.size(0) >= 1, "features must be [n, width] with n >= 1, got shape ",
                features.sizes());
    if (input_.n == 0) {
      TORCH_CHECK(features.size(1) == hidden_, "features are ", features.size(1), " wide, the hidden size is ", hidden_,
                  " (no input projection was set)");
      return run(features.to(at::kFloat).contiguous().clone(), start, cos, sin, mask, k_cache, v_cache, logits);
    }
    TORCH_CHECK(features.size(1) == input_.k, "features are ", features.size(1), " wide, the input projection reads ",
                input_.k);
    at::Tensor f = features.to(at::kFloat).contiguous();
    return run(project_input(f.data_ptr<float>(), features.size(0)), start, cos, sin, mask, k_cache, v_cache, logits);
  }

  // EAGLE-3's fused features for forward_draft: a row of the target's `taps` tapped layers beside its final hidden
  // state ([(taps + 1) H]) has each tapped block divided by its root mean square (drafts.feature.scaled_taps), then
  // `fuse` maps it to H.
  void set_fuse(const Packed& fuse, int64_t taps) {
    TORCH_CHECK(taps >= 1 && fuse.n == hidden_ && fuse.k == (taps + 1) * hidden_, "fuse projection is ", fuse.n, " x ",
                fuse.k, ", expected ", hidden_, " x ", (taps + 1) * hidden_, " for ", taps, " tapped layer(s)");
    check_kind(fuse, "the fuse projection");
    fuse_ = fuse;
    fuse_taps_ = taps;
  }

  // A feature draft's step in one call: features [n, H] (the draft's own, or the target's final hidden states) or
  // [n, (taps + 1) H] (the target's fused features, set_fuse), any floating dtype, and ids [n], the next tokens.
  // The input projection reads [feature ; the token's embedding]; then the layers, norm and head as forward's.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_draft(const at::Tensor& features, const at::Tensor& ids,
                                                               int64_t start, const at::Tensor& cos, const at::Tensor& sin,
                                                               const std::optional<at::Tensor>& mask,
                                                               at::Tensor& k_cache, at::Tensor& v_cache, bool logits) {
    const int64_t h = hidden_;
    TORCH_CHECK(input_.n > 0 && input_.k == 2 * h, "forward_draft needs an input projection over [feature ; embedding] (",
                2 * h, " inputs), got ", input_.k == 0 ? std::string("none") : std::to_string(input_.k) + " inputs");
    TORCH_CHECK(features.dim() == 2 && features.size(0) >= 1 && features.is_floating_point(),
                "features must be floating [n, width] with n >= 1, got ", features.scalar_type(), " ", features.sizes());
    const int64_t n = features.size(0), width = features.size(1);
    TORCH_CHECK(ids.dim() == 1 && ids.size(0) == n, "ids must be [", n, "] for ", n, " feature rows, got shape ",
                ids.sizes());
    const bool fused = fuse_.n > 0 && width == fuse_.k;
    TORCH_CHECK(width == h || fused, "features are ", width, " wide: the hidden size is ", h,
                fuse_.n > 0 ? ", the fused width " + std::to_string(fuse_.k) : std::string(" (no fuse projection set)"));
    at::Tensor tok = ids.to(at::kLong).contiguous();
    const int64_t vocab = embed_.size(0);
    const int64_t* tp = tok.data_ptr<int64_t>();
    for (int64_t t = 0; t < n; ++t)
      TORCH_CHECK(tp[t] >= 0 && tp[t] < vocab, "token id ", tp[t], " is outside the embedding's ", vocab, " rows");
    at::Tensor in = at::empty({n, 2 * h}, at::kFloat);  // [feature ; embedding] per row
    float* xs = in.data_ptr<float>();
    at::Tensor f = features.to(at::kFloat).contiguous();
    if (fused) {
      f = f.data_ptr() == features.data_ptr() ? f.clone() : f;  // scaled in place: never the caller's tensor
      float* fp = f.data_ptr<float>();
      serial([&] {
        for (int64_t t = 0; t < n; ++t)
          for (int64_t b = 0; b < fuse_taps_; ++b) {
            float* block = fp + t * width + b * h;
            const float scale = 1.0f / std::sqrt(sum_squares(block, h) / static_cast<float>(h) + 1e-6f);
            for (int64_t i = 0; i < h; ++i) block[i] *= scale;
          }
      });
      Operand fin(n, fuse_.k);
      serial([&] { fin.set(fuse_, fp, n, width); });
      at::Tensor g = at::empty({n, fuse_.width()}, at::kFloat);
      fin.multiply(fuse_, n, g.data_ptr<float>());
      const float* gp = g.data_ptr<float>();
      for (int64_t t = 0; t < n; ++t) std::memcpy(xs + t * 2 * h, gp + t * fuse_.width(), h * sizeof(float));
    } else {
      const float* fp = f.data_ptr<float>();
      for (int64_t t = 0; t < n; ++t) std::memcpy(xs + t * 2 * h, fp + t * h, h * sizeof(float));
    }
    at::Tensor e = embed_.index_select(0, tok).to(at::kFloat).contiguous();
    const float* ep = e.data_ptr<float>();
    for (int64_t t = 0; t < n; ++t) std::memcpy(xs + t * 2 * h + h, ep + t * h, h * sizeof(float));
    return run(project_input(xs, n), start, cos, sin, mask, k_cache, v_cache, logits);
  }

 private:
  // the input projection of rows x [n, input_.k] (float32): the residual stream entering layer 0, [n, H]
  at::Tensor project_input(const float* x, int64_t n) {
    Operand xin(n, input_.k);
    serial([&] { xin.set(input_, x, n, input_.k); });
    at::Tensor out = at::empty({n, input_.width()}, at::kFloat);
    xin.multiply(input_, n, out.data_ptr<float>());
    return input_.width() != hidden_ ? out.narrow(1, 0, hidden_).contiguous() : out;
  }

  // the pass from the residual stream x [n, H] (float32, contiguous, updated in place)
  std::tuple<at::Tensor, at::Tensor, at::Tensor> run(at::Tensor x, int64_t start, const at::Tensor& cos,
                                                     const at::Tensor& sin, const std::optional<at::Tensor>& mask,
                                                     at::Tensor& k_cache, at::Tensor& v_cache, bool logits) {
    const int64_t n = x.size(0), h = hidden_, d = head_dim_, end = start + n;
    const int64_t q_width = heads_ * d, kv_width = kv_heads_ * d;
    TORCH_CHECK(!layers_.empty(), "the model has no layers");
    TORCH_CHECK(start >= 0, "start must be >= 0, got ", start);
    TORCH_CHECK(k_cache.dim() == 5 && v_cache.sizes() == k_cache.sizes(), "caches must be [layers, 1, kv_heads, capacity, "
                "head_dim] and alike, got keys ", k_cache.sizes(), " and values ", v_cache.sizes());
    TORCH_CHECK(static_cast<int64_t>(layers_.size()) == k_cache.size(0), "cache has ", k_cache.size(0),
                " layers, the model ", layers_.size());
    TORCH_CHECK(k_cache.size(2) == kv_heads_ && k_cache.size(4) == d, "cache holds ", k_cache.size(2), " kv heads of size ",
                k_cache.size(4), ", the model ", kv_heads_, " of size ", d);
    TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
                    v_cache.is_contiguous() && k_cache.size(1) == 1,
                "the native pass needs contiguous float32 caches of batch 1");
    TORCH_CHECK(!logits || head_.n > 0, "no LM head was set");
    const int64_t capacity = k_cache.size(3);
    TORCH_CHECK(end <= capacity, "positions ", start, "..", end, " exceed the cache capacity ", capacity);
    TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.dim() == 2 && cos.size(0) == n && cos.size(1) == d,
                "cos must be float32 [n, head_dim]");
    TORCH_CHECK(sin.scalar_type() == at::kFloat && sin.is_contiguous() && sin.dim() == 2 && sin.size(0) == n && sin.size(1) == d,
                "sin must be float32 [n, head_dim]");
    const bool* mask_data = nullptr;
    at::Tensor mask_c;
    if (mask.has_value()) {
      mask_c = mask->to(at::kBool).contiguous();
      TORCH_CHECK(mask_c.dim() == 2 && mask_c.size(0) == n && mask_c.size(1) == end, "mask must be [n, start + n]");
      mask_data = mask_c.data_ptr<bool>();
    }
    const float* cs = cos.data_ptr<float>();
    const float* sn = sin.data_ptr<float>();
    float* kc = k_cache.data_ptr<float>();
    float* vc = v_cache.data_ptr<float>();

    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    float* xs = x.data_ptr<float>();
    at::Tensor tapped = at::empty({n, static_cast<int64_t>(taps_.size()), h}, f32);
    const Layer& l0 = layers_.front();
    const int64_t inter = l0.down.k;
    const int64_t k_max = std::max({l0.qkv.k, l0.o.k, l0.gate_up.k, l0.down.k, head_.k});
    Operand xin(n, k_max);  // the inputs of each product, as its weights' kind takes them
    at::Tensor normed = at::empty({n, h}, f32);
    at::Tensor qkv = at::empty({n, l0.qkv.width()}, f32), proj = at::empty({n, std::max(l0.o.width(), l0.down.width())}, f32);
    at::Tensor gu = at::empty({n, l0.gate_up.width()}, f32), act = at::empty({n, inter}, f32);
    at::Tensor attn = at::empty({n, q_width}, f32);
    float *hn = normed.data_ptr<float>(), *qs = qkv.data_ptr<float>(), *ps = proj.data_ptr<float>();
    float *gs = gu.data_ptr<float>(), *as = act.data_ptr<float>(), *os = attn.data_ptr<float>();

    const Attention attention(n, heads_, kv_heads_, d, start, mask_data);

    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      TORCH_CHECK(L.qkv.width() <= qkv.size(1) && L.gate_up.width() <= gu.size(1) && L.down.k == inter,
                  "layers of different shapes are not supported by the native pass");
      // attention block
      serial([&] {
        rms_norm(xs, n, h, L.ln1.data_ptr<float>(), eps_, hn);
        xin.set(L.qkv, hn, n, h);
      });
      xin.multiply(L.qkv, n, qs);
      const int64_t ldq = L.qkv.width();
      float* kl = kc + static_cast<int64_t>(li) * kv_heads_ * capacity * d;
      float* vl = vc + static_cast<int64_t>(li) * kv_heads_ * capacity * d;
      serial([&] {
      for (int64_t t = 0; t < n; ++t) {
        float* row = qs + t * ldq;
        for (int64_t hh = 0; hh < heads_ + kv_heads_; ++hh) rotate(row + hh * d, cs + t * d, sn + t * d, d);
        for (int64_t g = 0; g < kv_heads_; ++g) {
          std::memcpy(kl + (g * capacity + start + t) * d, row + q_width + g * d, d * sizeof(float));
          std::memcpy(vl + (g * capacity + start + t) * d, row + q_width + kv_width + g * d, d * sizeof(float));
        }
      }
      });
      attention.run(qs, ldq, os, q_width, kl, vl, capacity);
      serial([&] { xin.set(L.o, os, n, q_width); });
      xin.multiply(L.o, n, ps);
      serial([&] {
        for (int64_t t = 0; t < n; ++t)
#pragma omp simd
          for (int64_t i = 0; i < h; ++i) xs[t * h + i] += ps[t * L.o.width() + i];
        // MLP block
        rms_norm(xs, n, h, L.ln2.data_ptr<float>(), eps_, hn);
        xin.set(L.gate_up, hn, n, h);
      });
      xin.multiply(L.gate_up, n, gs);
      const int64_t ldg = L.gate_up.width();
      serial([&] {
        for (int64_t t = 0; t < n; ++t) {
          const float* gate = gs + t * ldg;
          const float* up = gate + inter;
          float* a = as + t * inter;
          silu_mul(gate, up, a, inter);
        }
        xin.set(L.down, as, n, inter);
      });
      xin.multiply(L.down, n, ps);
      serial([&] {
        for (int64_t t = 0; t < n; ++t)
#pragma omp simd
          for (int64_t i = 0; i < h; ++i) xs[t * h + i] += ps[t * L.down.width() + i];
        for (size_t j = 0; j < taps_.size(); ++j)
          if (taps_[j] == static_cast<int64_t>(li))
            for (int64_t t = 0; t < n; ++t)
              std::memcpy(tapped.data_ptr<float>() + (t * static_cast<int64_t>(taps_.size()) + j) * h, xs + t * h,
                          h * sizeof(float));
      });
    }
    at::Tensor hidden = at::empty({n, h}, f32);
    serial([&] { rms_norm(xs, n, h, norm_.data_ptr<float>(), eps_, hidden.data_ptr<float>()); });
    at::Tensor out;
    if (logits) {
      TORCH_CHECK(head_.n > 0, "no LM head was set");
      serial([&] { xin.set(head_, hidden.data_ptr<float>(), n, h); });
      out = at::empty({n, head_.width()}, f32);
      xin.multiply(head_, n, out.data_ptr<float>());
      if (head_.width() != head_.n) out = out.narrow(1, 0, head_.n);
    }
    return {hidden, out, tapped};
  }

  // One model, one kind of packed weights (bfloat16 or int8: two different targets): the first weight added sets it
  void check_kind(const Packed& p, const std::string& what) {
    if (!kind_) kind_ = p.kind();
    TORCH_CHECK(p.kind() == std::string(kind_), what, " is ", p.kind(), " but this model's weights are ", kind_,
                ": one native model takes one kind of packed weights");
  }

  const char* kind_ = nullptr;
  at::Tensor embed_, norm_;
  float eps_;
  int64_t heads_, kv_heads_, head_dim_, hidden_;
  std::vector<Layer> layers_;
  Packed head_{at::zeros({0, 0, kLanes}, at::kInt), std::nullopt, 0, 0};
  Packed input_{at::zeros({0, 0, kLanes}, at::kInt), std::nullopt, 0, 0};
  Packed fuse_{at::zeros({0, 0, kLanes}, at::kInt), std::nullopt, 0, 0};
  int64_t fuse_taps_ = 0;
  std::vector<int64_t> taps_;
};

// Y = X W^T for one packed weight: the kernel alone, for tests and the per-op profile
at::Tensor linear(const at::Tensor& x, const Packed& p) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == p.k, "x must be [rows, ", p.k, "]");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t rows = x.size(0);
  TORCH_CHECK(rows >= 1 && p.n >= 1, "linear needs at least one row and one output");
  Operand xin(rows, p.k);
  serial([&] { xin.set(p, xf.data_ptr<float>(), rows, p.k); });
  at::Tensor y = at::empty({rows, p.width()}, at::kFloat);
  xin.multiply(p, rows, y.data_ptr<float>());
  return y.narrow(1, 0, p.n);
}

// vexp over a float32 tensor, for tests
at::Tensor exp_values(const at::Tensor& x) {
  at::Tensor out = x.to(at::kFloat).contiguous().clone();
  float* p = out.data_ptr<float>();
  const int64_t n = out.numel();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vstore(p + i, vexp(vload(p + i)));
  if (i < n) vstore_part(p + i, vexp(vload_part(p + i, n - i, 0.f)), n - i);
  return out;
}

// The tempered logit (x - a) / t - b: torch's x / t - max(x / t) with (a, b) = (0, max(x) / t), the row shifted
// first, (a, b) = (max(x), 0), where max(x) / t overflows (sampling._tempered); t = 1 divides exactly.
struct Tempered {
  float a, t, b;
  vf operator()(vf x) const { return vsub(vdiv(vsub(x, vset(a)), vset(t)), vset(b)); }
  float operator()(float x) const { return (x - a) / t - b; }
};

// sum over i < len of exp(arg(x[i])), added in lanes fixed by i
inline float exp_sum(const float* x, int64_t len, const Tempered& arg) {
  vf sum = vzero();
  int64_t i = 0;
  for (; i + kW <= len; i += kW) sum = vadd(sum, vexp(arg(vload(x + i))));
  if (i < len) sum = vadd(sum, vexp(arg(vload_part(x + i, len - i, -INFINITY))));
  return vhsum(sum);
}

// The `h` largest logits as (value, index), largest first, ties by the lower index (h <= len).
std::vector<std::pair<float, int64_t>> largest(const float* x, int64_t len, int64_t h) {
  // a min-heap of the best so far under "a worse than b": a smaller value, or the same value at a later index
  auto worse = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::vector<std::pair<float, int64_t>> heap;
  heap.reserve(h);
  for (int64_t i = 0; i < h; ++i) heap.emplace_back(x[i], i);
  std::make_heap(heap.begin(), heap.end(), worse);
  float floor_value = heap.front().first;
  for (int64_t i = h; i < len; ++i) {
    if (!(x[i] > floor_value)) continue;  // a later index never beats an equal value; NaN never enters
    std::pop_heap(heap.begin(), heap.end(), worse);
    heap.back() = {x[i], i};
    std::push_heap(heap.begin(), heap.end(), worse);
    floor_value = heap.front().first;
  }
  std::sort_heap(heap.begin(), heap.end(), worse);  // ascending under `worse`: the best first
  return heap;
}

// exp(x) for one value, by vexp (the lanes' rounding)
inline float exp_one(float x) {
  float t[kW];
  vstore(t, vexp(vset(x)));
  return t[0];
}

// Of n tokens (token(i), in CDF order, with probability prob(i)): the first whose float64 cumulative mass exceeds
// u times their total; where u * total rounds up to the total, the last one with mass.
template <class Prob, class Token>
int64_t invert_cdf(int64_t n, double u, Prob prob, Token token) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += prob(i);
  const double target = u * total;
  double cdf = 0;
  int64_t last_with_mass = token(0);
  for (int64_t i = 0; i < n; ++i) {
    cdf += prob(i);
    if (cdf > target) return token(i);
    if (prob(i) > 0) last_with_mass = token(i);
  }
  return last_with_mass;
}

// One token drawn from the nucleus of softmax(logits / temperature) at the uniform u in [0, 1), in one call: what
// sampling.sample draws from sampling.logits_to_probs(logits, temperature, None, top_p) with the same u. As there,
// a token is kept while the mass before it (in descending order, float32 sums of float64 running totals) is below
// top_p, the top one always (the head examined grows from 64 tokens until its mass reaches top_p; top_p = 1 keeps
// the whole row), and the draw is the first kept token, in vocabulary order, whose float64 cumulative mass exceeds
// u times the kept total. The probabilities are computed here (vexp, not torch's exp), so a u within float32
// rounding of a CDF boundary may pick the neighbouring token.
int64_t nucleus_sample(const at::Tensor& logits, double temperature, double top_p, double u) {
  TORCH_CHECK(logits.dim() == 1 && logits.numel() >= 1, "logits must be one non-empty row, got shape ",
              logits.sizes());
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              "logits must be a contiguous float32 CPU tensor");
  TORCH_CHECK(std::isfinite(temperature) && temperature > 0, "temperature must be finite and > 0, got ", temperature);
  TORCH_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got ", top_p);
  TORCH_CHECK(u >= 0 && u < 1, "u must be in [0, 1), got ", u);
  const float* x = logits.data_ptr<float>();
  const int64_t len = logits.numel();
  const float t = static_cast<float>(temperature), p_top = static_cast<float>(top_p);
  float top = -INFINITY;
  bool nan = false;
  for (int64_t i = 0; i < len; ++i) {
    top = x[i] > top ? x[i] : top;
    nan |= x[i] != x[i];
  }
  TORCH_CHECK(!nan, "logits hold NaN");
  TORCH_CHECK(std::isfinite(top), "logits must have a finite maximum, got ", top);
  const Tempered arg = std::isfinite(top / t) ? Tempered{0.f, t, top / t} : Tempered{top, t, 0.f};
  const float sum = exp_sum(x, len, arg);
  const float inv = 1.f / sum;  // probabilities are exp(...) * (1 / sum), as torch's softmax scales them
  if (p_top >= 1.f) {  // the whole row, in vocabulary order
    thread_local std::vector<float> probs;
    probs.resize(len);
    for (int64_t i = 0; i < len; i += kW) {
      const int64_t n = std::min<int64_t>(kW, len - i);
      vstore_part(probs.data() + i, vmul(vexp(arg(vload_part(x + i, n, -INFINITY))), vset(inv)), n);
    }
    return invert_cdf(len, u, [&](int64_t i) { return probs[i]; }, [](int64_t i) { return i; });
  }
  std::vector<std::pair<float, int64_t>> kept;  // (probability, token)
  for (int64_t h = std::min<int64_t>(64, len);; h = std::min(4 * h, len)) {
    kept.clear();
    double running = 0;
    float mass = 0.f;
    for (const auto& [value, token] : largest(x, len, h)) {
      const float p = exp_one(arg(value)) * inv;
      running += p;
      mass = static_cast<float>(running);
      if (kept.empty() || mass - p < p_top) kept.emplace_back(p, token);
    }
    if (mass >= p_top || h == len) break;  // else tokens beyond the head may belong too
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return invert_cdf(static_cast<int64_t>(kept.size()), u, [&](int64_t i) { return kept[i].first; },
                    [&](int64_t i) { return kept[i].second; });
}

// What the pass's structure costs on its own, in microseconds: (an empty parallel region as each product and
// attention opens one, at::parallel_for over 64 items at this thread count; an OpenMP barrier between threads
// that stay in one region, what a pass with one region per layer would pay between its phases instead), means
// over `rounds` of each after 100 unmeasured ones.
std::tuple<double, double> fork_join_cost(int64_t rounds) {
  TORCH_CHECK(rounds >= 1, "rounds must be >= 1, got ", rounds);
  std::vector<int64_t> hits(2 * 64, 0);
  const auto regions = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      at::parallel_for(0, 64, 1, [&](int64_t a, int64_t b) { hits[2 * a] += b - a; });
  };
  const auto barriers = [&](int64_t n) {
    const int threads = at::get_num_threads();
#pragma omp parallel num_threads(threads)
    for (int64_t i = 0; i < n; ++i) {
#pragma omp barrier
    }
  };
  using clock = std::chrono::steady_clock;
  regions(100);
  auto t0 = clock::now();
  regions(rounds);
  const double region = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / rounds;
  barriers(100);
  t0 = clock::now();
  barriers(rounds);
  const double barrier = std::chrono::duration<double, std::micro>(clock::now() - t0).count() / rounds;
  return {region, barrier};
}

const char* simd() {
#if defined(SPECREPRO_DPBF16)
  return "avx512_bf16";
#elif defined(SPECREPRO_AVX512)
  return "avx512";
#elif defined(SPECREPRO_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  if (cpu_check::missing[0])
    throw py::import_error(std::string("this CPU lacks ") + cpu_check::missing + ", which the native module was compiled for");
  py::class_<Packed>(m, "Packed")
      .def(py::init<at::Tensor, std::optional<at::Tensor>, int64_t, int64_t>())
      .def_readonly("n", &Packed::n)
      .def_readonly("k", &Packed::k)
      .def_property_readonly("kind", [](const Packed& p) { return std::string(p.kind()); })
      .def_static("int8", &Packed::quantised);
  py::class_<Model>(m, "Model")
      .def(py::init<at::Tensor, at::Tensor, double, int64_t, int64_t, int64_t>())
      .def("add_layer", &Model::add_layer)
      .def("set_head", &Model::set_head)
      .def("set_input", &Model::set_input)
      .def("set_taps", &Model::set_taps)
      .def("set_fuse", &Model::set_fuse)
      .def_property_readonly("kind", [](const Model& m) { return std::string(m.kind()); })
      .def("forward", &Model::forward, py::call_guard<py::gil_scoped_release>())
      .def("forward_features", &Model::forward_features, py::call_guard<py::gil_scoped_release>())
      .def("forward_draft", &Model::forward_draft, py::call_guard<py::gil_scoped_release>());
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>());
  m.def("attention", &attention, py::call_guard<py::gil_scoped_release>());
  m.def("simd", &simd);
  m.def("fork_join_cost", &fork_join_cost, py::call_guard<py::gil_scoped_release>());
  m.def("exp", &exp_values);
  m.def("nucleus_sample", &nucleus_sample);
  m.def("compiled_for", [] { return std::string(cpu_check::compiled_for); });
}
