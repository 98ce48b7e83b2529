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

#define STACK_SCORES 4096

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
      float m = -INFINITY;
      for (int64_t t = 0; t < T; ++t) {
        const float *k = K + t * D;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
        s[t] = acc * scale;
        m = s[t] > m ? s[t] : m;
      }
      float total = 0.f;
      for (int64_t t = 0; t < T; ++t) {
        s[t] = expf(s[t] - m);
        total += s[t];
      }
      float *o = out + r * H * D + head * D;
      for (int64_t d = 0; d < D; ++d) o[d] = 0.f;
      for (int64_t t = 0; t < T; ++t) {
        const float *v = V + t * D;
        const float p = s[t];
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
      }
      const float inv = 1.f / total;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
    if (s != stack) free(s);
  }
}
