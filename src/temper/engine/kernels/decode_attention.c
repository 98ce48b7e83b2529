/* Fused decode attention for the native engine (float32, CPU).
 *
 * One call does, for every running row r and kv head j of one layer:
 *   1. write the new key and value (from the projection output) at position
 *      positions[r] of the slot cache;
 *   2. for each of the G query heads sharing kv head j, attend over cache
 *      positions 0..positions[r] (softmax of scaled dot products, then the
 *      weighted sum of values) and write the result to out.
 * It replaces the cache scatter, the query copy, the mask, two batched GEMMs
 * and the softmax of the PyTorch path, and reads each row's keys and values
 * once. Rows x kv heads are split across the OpenMP threads of the calling
 * thread (PyTorch's own runtime, which is already loaded).
 *
 * Layouts (all float32, C order):
 *   qkv  [B, H + 2*Hk, D] with row stride qkv_stride: query heads, key heads,
 *        value heads (RoPE already applied to q and k).
 *   kv   one layer of the cache: [2, R, Hk, P, D] (keys, then values).
 *   out  [B, H*D].
 * It does no masking beyond positions[r]: later positions hold stale values
 * and are never read.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#define STACK_SCORES 4096

/* exp(x) for x <= 0, in float32 to about 1 ulp (Cephes' expf: range reduction
 * by ln 2, degree-6 polynomial, exponent bits). Plain arithmetic, so the
 * softmax loop vectorizes without a vector math library. Inputs below -87.3
 * give exp(-87.3) ~ 1e-38 instead of a denormal or 0. */
static inline float exp_nonpositive(float x) {
  x = x < -87.3f ? -87.3f : x;
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
  return p * scale.f;
}

/* s[t] = scale * dot(q, K[t]) for t < T; returns the largest s[t]. With AVX2,
 * eight positions at a time: one accumulator per position, then one
 * transpose-and-add, instead of a horizontal sum per position. */
static float scores(const float *q, const float *K, int64_t T, int64_t D,
                    float scale, float *s) {
  float m = -INFINITY;
  int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (D % 8 == 0) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    const __m256 vscale = _mm256_set1_ps(scale);
    for (; t + 8 <= T; t += 8) {
      __m256 a[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int i = 0; i < 8; ++i)
          a[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(K + (t + i) * D + d), a[i]);
      }
      const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
      const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
      const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20),
                                       _mm256_permute2f128_ps(h0, h1, 0x31));
      const __m256 v = _mm256_mul_ps(sum, vscale);
      _mm256_storeu_ps(s + t, v);
      vmax = _mm256_max_ps(vmax, v);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; ++i) m = lanes[i] > m ? lanes[i] : m;
  }
#endif
  for (; t < T; ++t) {
    const float *k = K + t * D;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
    s[t] = acc * scale;
    m = s[t] > m ? s[t] : m;
  }
  return m;
}

void temper_decode_attention(const float *qkv, int64_t qkv_stride, float *kv,
                             const int64_t *positions, int64_t B, int64_t H,
                             int64_t Hk, int64_t D, int64_t R, int64_t P,
                             float scale, float *out) {
  const int64_t G = H / Hk;
  const int64_t plane = R * Hk * P * D; /* offset of the value plane */
#pragma omp parallel for schedule(static)
  for (int64_t item = 0; item < B * Hk; ++item) {
    const int64_t r = item / Hk, j = item % Hk;
    const int64_t pos = positions[r], T = pos + 1;
    const float *row = qkv + r * qkv_stride;
    float *K = kv + (r * Hk + j) * P * D;
    float *V = K + plane;
    memcpy(K + pos * D, row + (H + j) * D, D * sizeof(float));
    memcpy(V + pos * D, row + (H + Hk + j) * D, D * sizeof(float));
    float stack[STACK_SCORES];
    float *s = T <= STACK_SCORES ? stack : malloc(T * sizeof(float));
    for (int64_t g = 0; g < G; ++g) {
      const int64_t head = j * G + g;
      const float *q = row + head * D;
      const float m = scores(q, K, T, D, scale, s);
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t t = 0; t < T; ++t) {
        s[t] = exp_nonpositive(s[t] - m);
        total += s[t];
      }
      float acc[D];
      for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
      for (int64_t t = 0; t < T; ++t) {
        const float *v = V + t * D;
        const float p = s[t];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] += p * v[d];
      }
      const float inv = 1.f / total;
      float *o = out + r * H * D + head * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv;
    }
    if (s != stack) free(s);
  }
}
