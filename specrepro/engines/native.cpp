// The native CPU pass of a Llama-family decoder: one C++ call runs every layer for 1-64 new tokens.
//
// Built on first use by specrepro/engines/native.py (torch.utils.cpp_extension, -O3 -march=native), so the
// instructions are those of the machine it runs on: AVX512-BF16's dot product where the CPU has it, else
// the portable loop below, which the compiler vectorises for AVX2 or AVX512F.
//
// Numbers: weights in bfloat16 (the runner's dtype), the activations entering each matrix product rounded to
// bfloat16 as a bfloat16 runner's are, products accumulated in float32; the residual stream, norms, RoPE,
// attention over the float32 KV cache and the SiLU gate stay in float32.
//
// Weights are packed once (native.py) as int32 [blocks, K / 2, 16]: each int32 holds the bfloat16 pair
// (w[n][2k] low, w[n][2k + 1] high) of output n = 16 * block + lane. One 64-byte load then feeds 16
// outputs x 2 inputs, the layout AVX512-BF16's vdpbf16ps reads, and the weights stream through once per
// pass whatever the number of rows.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define SPECREPRO_AVX512 1
#if defined(__AVX512BF16__)
#define SPECREPRO_DPBF16 1
#endif
#endif

namespace {

constexpr int kLanes = 16;  // outputs per packed block
constexpr int kMaxRows = 12;
// Software prefetch of the weights PF_AHEAD cache lines ahead, for tiles of more than PF_ROWS rows: their
// products are slow enough that the hardware prefetcher falls behind (1 thread, after 300 tokens: a pass over
// 9 tokens 21.8 -> 20.8 ms, over 17 tokens 38.5 -> 35.6; over 2-5 tokens prefetching made it slower).
#ifndef PF_AHEAD
#define PF_AHEAD 16
#endif
#ifndef PF_ROWS
#define PF_ROWS 6
#endif  // rows per kernel call (accumulators: rows x blocks <= 24 registers)

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

// exp for the softmax and SiLU: Cephes' polynomial after range reduction, about 2 ulp; written with
// arithmetic and bit casts only so that `#pragma omp simd` loops vectorise it. Below -86 it returns 0
// (e^-86 < 1e-37): results near the smallest normal float would make the products that use them denormal,
// which x86 computes far more slowly.
inline float fast_exp(float x) {
  if (x < -86.0f) return 0.0f;
  x = std::min(x, 88.3f);
  float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * bits_to_float(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
}

#ifdef SPECREPRO_AVX512
// fast_exp on 16 lanes, the same steps
inline __m512 fast_exp16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-86.0f), _CMP_GE_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}
#endif

// out[i] = exp(x[i] - shift) for i < len; returns their sum
inline float exp_shifted(float* x, int64_t len, float shift) {
  int64_t i = 0;
  float total = 0.f;
#ifdef SPECREPRO_AVX512
  __m512 sum = _mm512_setzero_ps();
  const __m512 s = _mm512_set1_ps(shift);
  for (; i + 16 <= len; i += 16) {
    const __m512 e = fast_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  total = _mm512_reduce_add_ps(sum);
#endif
#pragma omp simd reduction(+ : total)
  for (int64_t k = i; k < len; ++k) {
    x[k] = fast_exp(x[k] - shift);
    total += x[k];
  }
  return total;
}

// SiLU(gate) * up over len values
inline void silu_mul(const float* gate, const float* up, float* out, int64_t len) {
  int64_t i = 0;
#ifdef SPECREPRO_AVX512
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= len; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = fast_exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
#endif
  for (; i < len; ++i) out[i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
}

inline float dot(const float* a, const float* b, int64_t d) {
  int64_t c = 0;
  float s = 0.f;
#ifdef SPECREPRO_AVX512
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (; c + 32 <= d; c += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + c), _mm512_loadu_ps(b + c), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + c + 16), _mm512_loadu_ps(b + c + 16), acc1);
  }
  for (; c + 16 <= d; c += 16) acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + c), _mm512_loadu_ps(b + c), acc0);
  s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#endif
#pragma omp simd reduction(+ : s)
  for (int64_t k = c; k < d; ++k) s += a[k] * b[k];
  return s;
}

#ifdef SPECREPRO_AVX512
// [sum(a0), sum(a1), sum(a2), sum(a3)]: per 128-bit lane the four partial sums, then the four lanes added
inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#endif

// out[j] = scale * q . keys[j * d ..] for j < len
inline void attention_scores(const float* q, const float* keys, int64_t len, int64_t d, float scale, float* out) {
  int64_t j = 0;
#ifdef SPECREPRO_AVX512
  if (d % 16 == 0 && d <= 256) {  // four keys at a time, their four sums reduced together
    const int64_t chunks = d / 16;
    __m512 qv[16];
    for (int64_t c = 0; c < chunks; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
    for (; j + 4 <= len; j += 4) {
      const float* k = keys + j * d;
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) {
        a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), a0);
        a1 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + d + 16 * c), a1);
        a2 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 2 * d + 16 * c), a2);
        a3 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 3 * d + 16 * c), a3);
      }
      _mm_storeu_ps(out + j, _mm_mul_ps(sum4(a0, a1, a2, a3), _mm_set1_ps(scale)));
    }
  }
#endif
  for (; j < len; ++j) out[j] = dot(q, keys + j * d, d) * scale;
}

// out[0..d) = sum_j w[j] * v[j * d ..] over j < len with w[j] != 0
inline void weighted_sum(const float* w, const float* v, int64_t len, int64_t d, float* out) {
#ifdef SPECREPRO_AVX512
  if (d % 16 == 0 && d <= 256) {  // two accumulator sets (even and odd keys): half the FMA latency chain
    __m512 acc[2][16];
    const int64_t chunks = d / 16;
    for (int64_t c = 0; c < chunks; ++c) acc[0][c] = acc[1][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; ++j) {
      if (w[j] == 0.f) continue;
      const __m512 e = _mm512_set1_ps(w[j]);
      const float* vj = v + j * d;
      __m512* a = acc[j & 1];
      for (int64_t c = 0; c < chunks; ++c) a[c] = _mm512_fmadd_ps(e, _mm512_loadu_ps(vj + 16 * c), a[c]);
    }
    for (int64_t c = 0; c < chunks; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_add_ps(acc[0][c], acc[1][c]));
    return;
  }
#endif
  std::fill(out, out + d, 0.f);
  for (int64_t j = 0; j < len; ++j) {
    if (w[j] == 0.f) continue;
    const float* vj = v + j * d;
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) out[c] += w[j] * vj[c];
  }
}

#ifdef SPECREPRO_AVX512
constexpr int kMaxQueries = 12;  // queries of one kv head per attention task

// out[r] = inv[r] * sum_j w[r * len + j] * vals[j], r < R, d = 16 * C: each value row loaded once for R queries
template <int C, int R>
void weighted_sums(const float* w, int64_t len, const float* vals, const float* inv, float* const* out) {
  constexpr int64_t d = 16 * C;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < len; ++j) {
    __m512 v[C];
    for (int c = 0; c < C; ++c) v[c] = _mm512_loadu_ps(vals + j * d + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 e = _mm512_set1_ps(w[r * len + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(e, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out[r] + 16 * c, _mm512_mul_ps(acc[r][c], _mm512_set1_ps(inv[r])));
}

// Attention of nq <= kMaxQueries queries that read the same kv head, d = 16 * C: each key and value row is
// loaded once for all of them (per query head, the loads alone outran the arithmetic). Query r sees keys
// j < lim[r] that allowed[r] (if not null) allows; sc: scratch [nq, len], len = max lim.
template <int C>
void attend_shared(const float* const* q, const int64_t* lim, const bool* const* allowed, int nq, const float* keys,
                   const float* vals, int64_t len, float scale, float* sc, float* const* out) {
  constexpr int64_t d = 16 * C;
  int64_t j = 0;
  for (; j + 4 <= len; j += 4) {
    __m512 k[4][C];
    for (int i = 0; i < 4; ++i)
      for (int c = 0; c < C; ++c) k[i][c] = _mm512_loadu_ps(keys + (j + i) * d + 16 * c);
    for (int r = 0; r < nq; ++r) {
      __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int c = 0; c < C; ++c) {
        const __m512 qc = _mm512_loadu_ps(q[r] + 16 * c);
        for (int i = 0; i < 4; ++i) a[i] = _mm512_fmadd_ps(qc, k[i][c], a[i]);
      }
      _mm_storeu_ps(sc + r * len + j, _mm_mul_ps(sum4(a[0], a[1], a[2], a[3]), _mm_set1_ps(scale)));
    }
  }
  for (; j < len; ++j)
    for (int r = 0; r < nq; ++r) sc[r * len + j] = dot(q[r], keys + j * d, d) * scale;
  float inv[kMaxQueries];
  for (int r = 0; r < nq; ++r) {  // softmax over what query r sees; every other weight 0
    float* s = sc + r * len;
    const int64_t seen = lim[r];
    if (allowed[r])
      for (int64_t jj = 0; jj < seen; ++jj) s[jj] = allowed[r][jj] ? s[jj] : -INFINITY;
    float top = -INFINITY;
    for (int64_t jj = 0; jj < seen; ++jj) top = std::max(top, s[jj]);
    if (top == -INFINITY) {  // sees no key (a bad tree mask): zeros
      std::fill(s, s + len, 0.f);
      inv[r] = 0.f;
      continue;
    }
    inv[r] = 1.0f / exp_shifted(s, seen, top);
    std::fill(s + seen, s + len, 0.f);
  }
  for (int r0 = 0; r0 < nq; r0 += 6) {  // weighted sums, six queries' accumulators (in registers) at a time
    const int nr = std::min(6, nq - r0);
    const float* w = sc + r0 * len;
    float* const* o = out + r0;
    switch (nr) {
      case 1: weighted_sums<C, 1>(w, len, vals, inv + r0, o); break;
      case 2: weighted_sums<C, 2>(w, len, vals, inv + r0, o); break;
      case 3: weighted_sums<C, 3>(w, len, vals, inv + r0, o); break;
      case 4: weighted_sums<C, 4>(w, len, vals, inv + r0, o); break;
      case 5: weighted_sums<C, 5>(w, len, vals, inv + r0, o); break;
      default: weighted_sums<C, 6>(w, len, vals, inv + r0, o); break;
    }
  }
}

using SharedFn = void (*)(const float* const*, const int64_t*, const bool* const*, int, const float*, const float*,
                          int64_t, float, float*, float* const*);
SharedFn shared_kernel(int64_t d) {
  switch (d) {
    case 16: return &attend_shared<1>;
    case 32: return &attend_shared<2>;
    case 48: return &attend_shared<3>;
    case 64: return &attend_shared<4>;
    default: return nullptr;
  }
}
#endif

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

struct Packed {
  at::Tensor w;     // int32 [blocks, kp, 16]
  at::Tensor bias;  // float32 [n] or undefined
  int64_t n, k, blocks, kp;

  Packed(const at::Tensor& w_, std::optional<at::Tensor> bias_, int64_t n_, int64_t k_) : n(n_), k(k_) {
    TORCH_CHECK(w_.scalar_type() == at::kInt && w_.dim() == 3 && w_.size(2) == kLanes && w_.is_contiguous(),
                "packed weight must be a contiguous int32 [blocks, K/2, 16] tensor");
    w = w_.numel() ? huge_page_copy(w_) : w_;
    blocks = w.size(0);
    kp = w.size(1);
    TORCH_CHECK(blocks * kLanes >= n && kp * 2 >= k, "packed weight is smaller than its ", n, " x ", k, " matrix");
    if (bias_.has_value()) {
      bias = bias_->to(at::kFloat).contiguous();
      TORCH_CHECK(bias.numel() == n, "bias has ", bias.numel(), " elements for ", n, " outputs");
    }
  }
  int64_t width() const { return blocks * kLanes; }  // row stride of the outputs
};

// y[m][16 b + j] = sum_k W[16 b + j][k] x[m][k] for NB blocks from `w` and MB rows of x (bfloat16 pairs).
template <int MB, int NB>
void tile(const uint32_t* w, int64_t kp, const uint32_t* x, int64_t ldx, float* y, int64_t ldy) {
#ifdef SPECREPRO_DPBF16
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kp; ++k) {
    __m512bh wv[NB];
    for (int b = 0; b < NB; ++b) {
      if (MB > PF_ROWS) _mm_prefetch(reinterpret_cast<const char*>(w + (b * kp + k + PF_AHEAD) * kLanes), _MM_HINT_T0);
      wv[b] = (__m512bh)_mm512_loadu_si512(w + (b * kp + k) * kLanes);
    }
    for (int m = 0; m < MB; ++m) {
      __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * ldx + k]));
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], wv[b], xv);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(y + m * ldy + b * kLanes, acc[m][b]);
#else
  float acc[MB][NB][kLanes] = {};
  for (int64_t k = 0; k < kp; ++k) {
    for (int m = 0; m < MB; ++m) {
      const uint32_t xp = x[m * ldx + k];
      const float x0 = bits_to_float(xp << 16), x1 = bits_to_float(xp & 0xffff0000u);
      for (int b = 0; b < NB; ++b) {
        const uint32_t* wk = w + (b * kp + k) * kLanes;
#pragma omp simd
        for (int j = 0; j < kLanes; ++j)
          acc[m][b][j] += bits_to_float(wk[j] << 16) * x0 + bits_to_float(wk[j] & 0xffff0000u) * x1;
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int b = 0; b < NB; ++b) std::memcpy(y + m * ldy + b * kLanes, acc[m][b], sizeof(acc[m][b]));
#endif
}

using TileFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t);

template <int NB, int... MB>
constexpr std::array<TileFn, sizeof...(MB)> tiles(std::integer_sequence<int, MB...>) {
  return {&tile<MB + 1, NB>...};
}

const auto kTiles1 = tiles<1>(std::make_integer_sequence<int, kMaxRows>{});
const auto kTiles2 = tiles<2>(std::make_integer_sequence<int, kMaxRows>{});
const auto kTiles4 = tiles<4>(std::make_integer_sequence<int, 4>{});

TileFn pick(int rows, int nb) {
  if (nb == 4) return kTiles4[rows - 1];
  return nb == 2 ? kTiles2[rows - 1] : kTiles1[rows - 1];
}

// Y [rows, p.width()] = X W^T (+ bias), X as bfloat16 pairs [rows, ldx >= p.kp]
void gemv(const Packed& p, const uint32_t* x, int64_t rows, int64_t ldx, float* y) {
  const auto* w = reinterpret_cast<const uint32_t*>(p.w.data_ptr<int32_t>());
  const int64_t group = rows <= 4 ? 4 : 2;  // blocks per task: more independent accumulators for few rows
  const int64_t groups = (p.blocks + group - 1) / group;
  const int64_t ldy = p.width();
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t b0 = g * group;
      int64_t left = std::min(group, p.blocks - b0);
      for (int64_t b = b0; left > 0;) {  // 4 or 2 blocks at a time, then the remainder one by one
        const int nb = left >= group ? static_cast<int>(group) : 1;
        for (int64_t m0 = 0; m0 < rows; m0 += kMaxRows) {  // the group's weights stay in cache across rows
          const int mb = static_cast<int>(std::min<int64_t>(kMaxRows, rows - m0));
          if (nb == 4 && mb <= 4) {
            pick(mb, 4)(w + b * p.kp * kLanes, p.kp, x + m0 * ldx, ldx, y + m0 * ldy + b * kLanes, ldy);
          } else if (nb == 4) {
            pick(mb, 2)(w + b * p.kp * kLanes, p.kp, x + m0 * ldx, ldx, y + m0 * ldy + b * kLanes, ldy);
            pick(mb, 2)(w + (b + 2) * p.kp * kLanes, p.kp, x + m0 * ldx, ldx, y + m0 * ldy + (b + 2) * kLanes, ldy);
          } else {
            pick(mb, nb)(w + b * p.kp * kLanes, p.kp, x + m0 * ldx, ldx, y + m0 * ldy + b * kLanes, ldy);
          }
        }
        b += nb;
        left -= nb;
      }
    }
  });
  if (p.bias.defined()) {
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

void rms_norm(const float* x, int64_t rows, int64_t h, const float* weight, float eps, float* out) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* xm = x + m * h;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < h; ++i) ss += xm[i] * xm[i];
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
#pragma omp simd
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

struct Layer {
  at::Tensor ln1, ln2;  // float32 [H]
  Packed qkv, o, gate_up, down;
};

class Model {
 public:
  Model(at::Tensor embed, at::Tensor norm, double eps, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim)
      : embed_(std::move(embed)), norm_(norm.to(at::kFloat).contiguous()), eps_(static_cast<float>(eps)),
        heads_(n_heads), kv_heads_(n_kv_heads), head_dim_(head_dim) {
    TORCH_CHECK(n_heads % n_kv_heads == 0, n_heads, " query heads do not group over ", n_kv_heads, " kv heads");
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
    layers_.push_back(Layer{ln1.to(at::kFloat).contiguous(), ln2.to(at::kFloat).contiguous(), qkv, o, gate_up, down});
  }

  void set_head(const Packed& head) {
    TORCH_CHECK(head.k == hidden_, "LM head reads ", head.k, " features, hidden size is ", hidden_);
    head_ = head;
  }

  // ids [n] int64; cos, sin float32 [n, head_dim] at the tokens' positions; mask bool [n, start + n] or None
  // (causal); caches float32 [layers, 1, kv_heads, capacity, head_dim], written at slots start..start + n.
  // Returns (hidden float32 [n, H] after the final norm, logits float32 [n, V] or None).
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& ids, int64_t start, const at::Tensor& cos,
                                             const at::Tensor& sin, const std::optional<at::Tensor>& mask,
                                             at::Tensor& k_cache, at::Tensor& v_cache, bool logits) {
    const int64_t n = ids.numel(), h = hidden_, d = head_dim_, end = start + n;
    const int64_t q_width = heads_ * d, kv_width = kv_heads_ * d, group = heads_ / kv_heads_;
    TORCH_CHECK(n >= 1, "no tokens to run");
    TORCH_CHECK(static_cast<int64_t>(layers_.size()) == k_cache.size(0), "cache has ", k_cache.size(0),
                " layers, the model ", layers_.size());
    TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
                    v_cache.is_contiguous() && k_cache.size(1) == 1,
                "the native pass needs contiguous float32 caches of batch 1");
    const int64_t capacity = k_cache.size(3);
    TORCH_CHECK(end <= capacity, "positions ", start, "..", end, " exceed the cache capacity ", capacity);
    TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.size(0) == n && cos.size(1) == d,
                "cos must be float32 [n, head_dim]");
    TORCH_CHECK(sin.scalar_type() == at::kFloat && sin.is_contiguous() && sin.size(0) == n && sin.size(1) == d,
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
    at::Tensor x = embed_.index_select(0, ids.to(at::kLong)).to(at::kFloat).contiguous();  // residual stream
    float* xs = x.data_ptr<float>();
    const Layer& l0 = layers_.front();
    const int64_t inter = l0.down.k;
    const int64_t kp_max = std::max({l0.qkv.kp, l0.o.kp, l0.down.kp, head_.kp});
    at::Tensor normed = at::empty({n, h}, f32), pairs = at::empty({n, kp_max}, f32.dtype(at::kInt));
    at::Tensor qkv = at::empty({n, l0.qkv.width()}, f32), proj = at::empty({n, std::max(l0.o.width(), l0.down.width())}, f32);
    at::Tensor gu = at::empty({n, l0.gate_up.width()}, f32), act = at::empty({n, inter}, f32);
    // attention scratch: a row per (token, head), or kMaxQueries rows per shared-kv task (at most n * heads of them)
    at::Tensor attn = at::empty({n, q_width}, f32), scores = at::empty({n * heads_ + 16 * kv_heads_, end}, f32);
    float *hn = normed.data_ptr<float>(), *qs = qkv.data_ptr<float>(), *ps = proj.data_ptr<float>();
    float *gs = gu.data_ptr<float>(), *as = act.data_ptr<float>(), *os = attn.data_ptr<float>();
    float* ss = scores.data_ptr<float>();
    auto* xp = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));

    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      TORCH_CHECK(L.qkv.width() <= qkv.size(1) && L.gate_up.width() <= gu.size(1) && L.down.k == inter,
                  "layers of different shapes are not supported by the native pass");
      // attention block
      rms_norm(xs, n, h, L.ln1.data_ptr<float>(), eps_, hn);
      to_pairs(hn, n, h, h, xp, L.qkv.kp);
      gemv(L.qkv, xp, n, L.qkv.kp, qs);
      const int64_t ldq = L.qkv.width();
      float* kl = kc + static_cast<int64_t>(li) * kv_heads_ * capacity * d;
      float* vl = vc + static_cast<int64_t>(li) * kv_heads_ * capacity * d;
      for (int64_t t = 0; t < n; ++t) {
        float* row = qs + t * ldq;
        for (int64_t hh = 0; hh < heads_ + kv_heads_; ++hh) rotate(row + hh * d, cs + t * d, sn + t * d, d);
        for (int64_t g = 0; g < kv_heads_; ++g) {
          std::memcpy(kl + (g * capacity + start + t) * d, row + q_width + g * d, d * sizeof(float));
          std::memcpy(vl + (g * capacity + start + t) * d, row + q_width + kv_width + g * d, d * sizeof(float));
        }
      }
#ifdef SPECREPRO_AVX512
      if (SharedFn kernel = shared_kernel(d)) {  // tasks: (kv head, up to kMaxQueries of its queries)
        const int64_t per_head = n * group, chunks = (per_head + kMaxQueries - 1) / kMaxQueries;
        at::parallel_for(0, kv_heads_ * chunks, 1, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t g = i / chunks, first = (i % chunks) * kMaxQueries;
            const int nq = static_cast<int>(std::min<int64_t>(kMaxQueries, per_head - first));
            const float* qp[kMaxQueries];
            float* op[kMaxQueries];
            const bool* ap[kMaxQueries];
            int64_t lim[kMaxQueries], len = 0;
            for (int r = 0; r < nq; ++r) {  // query (token t, head g * group + r') in token-major order
              const int64_t t = (first + r) / group, hh = g * group + (first + r) % group;
              qp[r] = qs + t * ldq + hh * d;
              op[r] = os + t * q_width + hh * d;
              ap[r] = mask_data ? mask_data + t * end : nullptr;
              lim[r] = mask_data ? end : start + t + 1;
              len = std::max(len, lim[r]);
            }
            kernel(qp, lim, ap, nq, kl + g * capacity * d, vl + g * capacity * d, len, scale,
                   ss + i * kMaxQueries * end, op);
          }
        });
      } else
#endif
      {
        at::parallel_for(0, n * heads_, 1, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const int64_t t = i / heads_, hh = i % heads_, g = hh / group;
            const float* qv = qs + t * ldq + hh * d;
            const float* keys = kl + g * capacity * d;
            const float* vals = vl + g * capacity * d;
            float* sc = ss + i * end;
            const bool* allowed = mask_data ? mask_data + t * end : nullptr;
            const int64_t last = allowed ? end : start + t + 1;  // causal: keys 0..start + t
            attention_scores(qv, keys, last, d, scale, sc);
            if (allowed)  // a key the tree hides gets no weight (its score is not used)
              for (int64_t j = 0; j < last; ++j) sc[j] = allowed[j] ? sc[j] : -INFINITY;
            float top = -INFINITY;
            for (int64_t j = 0; j < last; ++j) top = std::max(top, sc[j]);
            float* out = os + t * q_width + hh * d;
            if (top == -INFINITY) {  // a row that sees no key (a bad tree mask) gives zeros
              std::fill(out, out + d, 0.f);
              continue;
            }
            const float total = exp_shifted(sc, last, top);  // hidden keys: exp(-inf) = 0
            weighted_sum(sc, vals, last, d, out);
            const float inv = 1.0f / total;  // total >= 1: the top key's weight is exp(0)
#pragma omp simd
            for (int64_t c = 0; c < d; ++c) out[c] *= inv;
          }
        });
      }
      to_pairs(os, n, q_width, q_width, xp, L.o.kp);
      gemv(L.o, xp, n, L.o.kp, ps);
      for (int64_t t = 0; t < n; ++t)
#pragma omp simd
        for (int64_t i = 0; i < h; ++i) xs[t * h + i] += ps[t * L.o.width() + i];
      // MLP block
      rms_norm(xs, n, h, L.ln2.data_ptr<float>(), eps_, hn);
      to_pairs(hn, n, h, h, xp, L.gate_up.kp);
      gemv(L.gate_up, xp, n, L.gate_up.kp, gs);
      const int64_t ldg = L.gate_up.width();
      for (int64_t t = 0; t < n; ++t) {
        const float* gate = gs + t * ldg;
        const float* up = gate + inter;
        float* a = as + t * inter;
        silu_mul(gate, up, a, inter);
      }
      to_pairs(as, n, inter, inter, xp, L.down.kp);
      gemv(L.down, xp, n, L.down.kp, ps);
      for (int64_t t = 0; t < n; ++t)
#pragma omp simd
        for (int64_t i = 0; i < h; ++i) xs[t * h + i] += ps[t * L.down.width() + i];
    }
    at::Tensor hidden = at::empty({n, h}, f32);
    rms_norm(xs, n, h, norm_.data_ptr<float>(), eps_, hidden.data_ptr<float>());
    at::Tensor out;
    if (logits) {
      TORCH_CHECK(head_.n > 0, "no LM head was set");
      to_pairs(hidden.data_ptr<float>(), n, h, h, xp, head_.kp);
      out = at::empty({n, head_.width()}, f32);
      gemv(head_, xp, n, head_.kp, out.data_ptr<float>());
      if (head_.width() != head_.n) out = out.narrow(1, 0, head_.n);
    }
    return {hidden, out};
  }

 private:
  at::Tensor embed_, norm_;
  float eps_;
  int64_t heads_, kv_heads_, head_dim_, hidden_;
  std::vector<Layer> layers_;
  Packed head_{at::zeros({0, 0, kLanes}, at::kInt), std::nullopt, 0, 0};
};

// Y = X W^T for one packed weight: the kernel alone, for tests and the per-op profile
at::Tensor linear(const at::Tensor& x, const Packed& p) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == p.k, "x must be [rows, ", p.k, "]");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t rows = x.size(0);
  at::Tensor pairs = at::empty({rows, p.kp}, at::kInt);
  auto* xp = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
  to_pairs(xf.data_ptr<float>(), rows, p.k, p.k, xp, p.kp);
  at::Tensor y = at::empty({rows, p.width()}, at::kFloat);
  gemv(p, xp, rows, p.kp, y.data_ptr<float>());
  return y.narrow(1, 0, p.n);
}

const char* simd() {
#if defined(SPECREPRO_DPBF16)
  return "avx512_bf16";
#elif defined(SPECREPRO_AVX512)
  return "avx512";
#else
  return "portable";
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  py::class_<Packed>(m, "Packed")
      .def(py::init<at::Tensor, std::optional<at::Tensor>, int64_t, int64_t>())
      .def_readonly("n", &Packed::n)
      .def_readonly("k", &Packed::k);
  py::class_<Model>(m, "Model")
      .def(py::init<at::Tensor, at::Tensor, double, int64_t, int64_t, int64_t>())
      .def("add_layer", &Model::add_layer)
      .def("set_head", &Model::set_head)
      .def("forward", &Model::forward, py::call_guard<py::gil_scoped_release>());
  m.def("linear", &linear, py::call_guard<py::gil_scoped_release>());
  m.def("simd", &simd);
}
