/* One decode step of Llama attention for a batch, after the fused q/k/v matmul: RoPE on q and k, the new
 * key and value appended to the KV cache, softmax attention of each query over its row's cache, and the
 * output written row-major (N, H * D), ready for the o_proj matmul. Built and loaded by native.py.
 *
 * Why by hand: for one query per row, PyTorch runs this as four or five ops (complex multiply, a strided
 * copy into the cache, SDPA, a transposing copy of its output), and its flash-attention kernel has a fixed
 * cost per (row, head) that dominates at the short lengths of RL rollouts (~100 ns per key at 14 keys on
 * the tiny model). No library we can depend on ships a CPU decode-attention kernel for PyTorch tensors.
 *
 * Layouts (float32):
 *   qkv   (N, (H + 2 Hkv) D), row stride qkv_rs: q heads, k heads, v heads; within a q/k head, RoPE pairs
 *         (x_i, x_{i + D/2}) are adjacent (llama_forward.rope_pair_rows), so RoPE is a complex multiply.
 *   rot   (N, D/2, 2): cos and sin of each row's position, interleaved.
 *   k, v  (N, Hkv, T, D) caches; this step's key and value go to position `at`, keys 0..at are attended.
 *   keep  (N, T) bytes or NULL: key j of row n is visible iff keep[n * T + j] (NULL: all visible).
 *   out   (N, H * D), row stride out_rs.
 * q and k in qkv are rotated in place, as the PyTorch path does.
 */
#include <math.h>
#include <stdint.h>

/* exp(x) for x <= 0 as 2^n * p(r), |r| <= ln(2)/2, with Cephes' expf polynomial (relative error ~1e-7).
 * Written out because libm's expf does not vectorize without -ffast-math, which we avoid (it changes the
 * handling of infinities and, linked into a shared library, the whole process's denormal mode). */
static inline float exp_neg(float x) {
  x = x < -87.0f ? -87.0f : x;
  float n = __builtin_rintf(x * 1.44269504088896341f); /* rint, not round: only rint vectorizes (vroundps) */
  float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { float f; int32_t i; } two_n;
  two_n.i = ((int32_t)n + 127) << 23;
  return p * two_n.f;
}

static inline void rope(float* x, const float* rot, int64_t half) {
  for (int64_t i = 0; i < half; i++) {
    float a = x[2 * i], b = x[2 * i + 1], c = rot[2 * i], s = rot[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = a * s + b * c;
  }
}

/* softmax(q . k_j * scale over visible j <= at) @ v for one head, kh and vh (T, D) its keys and values. D is a
 * compile-time constant in the specialised copies below (always_inline), so the compiler unrolls the loops
 * over it and keeps the output accumulator in vector registers. */
static inline __attribute__((always_inline)) void attend(const float* q, const float* kh, const float* vh,
                                                         const uint8_t* vis, float* dst, float* s, int64_t len,
                                                         const int64_t D, float scale) {
  float m = -INFINITY;
  for (int64_t j = 0; j < len; j++) {
    const float* kj = kh + j * D;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; d++) dot += q[d] * kj[d];
    s[j] = (vis && !vis[j]) ? -INFINITY : dot * scale;
    m = s[j] > m ? s[j] : m;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < len; j++) {
    const float e = s[j] == -INFINITY ? 0.0f : exp_neg(s[j] - m);
    s[j] = e;
    sum += e;
  }
  float o[D];
  for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
  for (int64_t j = 0; j < len; j++) {
    const float p = s[j], *vj = vh + j * D;
#pragma omp simd
    for (int64_t d = 0; d < D; d++) o[d] += p * vj[d];
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < D; d++) dst[d] = o[d] * inv;
}

void frl_decode_attention(float* qkv, int64_t qkv_rs, const float* rot, float* k, float* v, int64_t at,
                          const uint8_t* keep, float* out, int64_t out_rs, int64_t n_rows, int64_t heads,
                          int64_t kv_heads, int64_t cache_len, int64_t head_dim, float scale, int n_threads) {
  const int64_t D = head_dim, T = cache_len, len = at + 1, group = heads / kv_heads;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (int64_t n = 0; n < n_rows; n++) {
    float* row = qkv + n * qkv_rs;
    for (int64_t h = 0; h < heads + kv_heads; h++) rope(row + h * D, rot + n * D, D / 2);
    for (int64_t g = 0; g < kv_heads; g++) { /* append this step's key and value */
      float* kc = k + ((n * kv_heads + g) * T + at) * D;
      float* vc = v + ((n * kv_heads + g) * T + at) * D;
      const float *kn = row + (heads + g) * D, *vn = row + (heads + kv_heads + g) * D;
      for (int64_t d = 0; d < D; d++) {
        kc[d] = kn[d];
        vc[d] = vn[d];
      }
    }
    const uint8_t* vis = keep ? keep + n * T : 0;
    float s[len];
    for (int64_t h = 0; h < heads; h++) {
      const int64_t g = n * kv_heads + h / group;
      const float *q = row + h * D, *kh = k + g * T * D, *vh = v + g * T * D;
      float* dst = out + n * out_rs + h * D;
      switch (D) { /* the common head sizes get their own copy; others run the generic one */
        case 32: attend(q, kh, vh, vis, dst, s, len, 32, scale); break;
        case 64: attend(q, kh, vh, vis, dst, s, len, 64, scale); break;
        case 128: attend(q, kh, vh, vis, dst, s, len, 128, scale); break;
        default: attend(q, kh, vh, vis, dst, s, len, D, scale);
      }
    }
  }
}
