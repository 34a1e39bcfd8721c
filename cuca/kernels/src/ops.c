/* Row-wise small ops: RMS norm (optionally fused with the residual add), RoPE, SiLU/GELU gating.
 * Each output row is computed by the same operations wherever it sits and whatever the thread count;
 * threads only split whole rows. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cuca.h"
#include "ops.h"
#include "vmath.h"

/* rows x floats below which a call stays on one thread */
#define OPS_PAR_MIN 32768

static inline int ops_threads(int n_threads, int64_t rows, int64_t n) {
    if (rows < 2 || rows * n < OPS_PAR_MIN) return 1;
    int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
    return rows < nt ? (int)rows : nt;
}

static inline const float *row_c(const float *base, cuca_rows s, int64_t r, int64_t n1) {
    return base + (r / n1) * s.s0 + (r % n1) * s.s1;
}
static inline float *row_m(float *base, cuca_rows s, int64_t r, int64_t n1) {
    return base + (r / n1) * s.s0 + (r % n1) * s.s1;
}

/* sum of x[i]*x[i] (products in float, sum in double, one fixed order) */
static double ops_sumsq(const float *x, int64_t n) {
    int64_t i = 0;
    double s = 0.0;
#if defined(__AVX512F__)
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m512 sq = _mm512_mul_ps(v, v);
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sq), 1))));
    }
    __m512d a = _mm512_add_pd(a0, a1);
    __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(a), _mm512_extractf64x4_pd(a, 1));
    __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
    s = _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
#elif defined(__AVX2__) && defined(__FMA__)
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 sq = _mm256_mul_ps(v, v);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d q = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    s = _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
#endif
    double t = 0.0;
    for (; i < n; ++i) t += (double)(x[i] * x[i]);
    return s + t;
}

/* y = (x * scale) * w, elementwise (y may be x) */
static void ops_scale_row(const float *x, float scale, const float *w, float *y, int64_t n) {
    const vf sv = v_set1(scale);
    int64_t i = 0;
    if (w) {
        for (; i + VL <= n; i += VL) v_store(y + i, v_mul(v_mul(v_load(x + i), sv), v_load(w + i)));
        if (i < n) {
            int t = (int)(n - i);
            v_store_n(y + i, v_mul(v_mul(v_load_n(x + i, t), sv), v_load_n(w + i, t)), t);
        }
    } else {
        for (; i + VL <= n; i += VL) v_store(y + i, v_mul(v_load(x + i), sv));
        if (i < n) {
            int t = (int)(n - i);
            v_store_n(y + i, v_mul(v_load_n(x + i, t), sv), t);
        }
    }
}

static void ops_rms_row(const float *x, const float *w, float eps, float *y, int64_t n) {
    const float mean = (float)(ops_sumsq(x, n) / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    ops_scale_row(x, scale, w, y, n);
}

int cuca_rms_norm_f32(const float *x, cuca_rows xs, const float *w, float eps, float *out, cuca_rows os,
                      int64_t n0, int64_t n1, int64_t n, int n_threads) {
    if (n0 < 0 || n1 < 0 || n <= 0) return CUCA_EINVAL;
    const int64_t rows = n0 * n1;
    const int nt = ops_threads(n_threads, rows, n);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t r = 0; r < rows; ++r) ops_rms_row(row_c(x, xs, r, n1), w, eps, row_m(out, os, r, n1), n);
    return CUCA_OK;
}

int cuca_add_rms_norm_f32(float *x, cuca_rows xs, const float *y, cuca_rows ys, const float *w, float eps,
                          float *out, cuca_rows os, int64_t n0, int64_t n1, int64_t n, int n_threads) {
    if (n0 < 0 || n1 < 0 || n <= 0) return CUCA_EINVAL;
    const int64_t rows = n0 * n1;
    const int nt = ops_threads(n_threads, rows, n);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float *xr = row_m(x, xs, r, n1);
        const float *yr = row_c(y, ys, r, n1);
        int64_t i = 0;
        for (; i + VL <= n; i += VL) v_store(xr + i, v_add(v_load(xr + i), v_load(yr + i)));
        if (i < n) {
            int t = (int)(n - i);
            v_store_n(xr + i, v_add(v_load_n(xr + i, t), v_load_n(yr + i, t)), t);
        }
        ops_rms_row(xr, w, eps, row_m(out, os, r, n1), n);
    }
    return CUCA_OK;
}

int cuca_rope_f32(float *x, cuca_rows xs, const int32_t *pos, int64_t M, int64_t n_head, int64_t hd, int n_rot,
                  float freq_base, int neox, const float *freq_factors, float freq_scale, int n_threads) {
    if (M < 0 || n_head < 0 || hd < 0 || n_rot < 0 || n_rot % 2 || n_rot > hd) return CUCA_EINVAL;
    if (M == 0 || n_head == 0 || n_rot == 0) return CUCA_OK;
    const int half = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    const int nt = ops_threads(n_threads, M, n_head * hd * 8);
    int err = 0;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *cs = (float *)malloc(sizeof(float) * 2 * (size_t)half);
        float *sn = cs ? cs + half : NULL;
        if (!cs) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < M; ++i) {
            if (!cs) continue;
            /* angle of pair k: pos * base^(-2k/n_rot), built by repeated float products like ggml */
            float theta = (float)pos[i];
            for (int k = 0; k < half; ++k) {
                float t = freq_factors ? theta / freq_factors[k] : theta;
                t = freq_scale * t;
                cs[k] = cosf(t);
                sn[k] = sinf(t);
                theta *= theta_scale;
            }
            for (int64_t h = 0; h < n_head; ++h) {
                float *y = x + i * xs.s0 + h * xs.s1;
                if (neox) {
                    for (int k = 0; k < half; ++k) {
                        const float x0 = y[k], x1 = y[k + half];
                        y[k] = x0 * cs[k] - x1 * sn[k];
                        y[k + half] = x0 * sn[k] + x1 * cs[k];
                    }
                } else {
                    for (int k = 0; k < half; ++k) {
                        const float x0 = y[2 * k], x1 = y[2 * k + 1];
                        y[2 * k] = x0 * cs[k] - x1 * sn[k];
                        y[2 * k + 1] = x0 * sn[k] + x1 * cs[k];
                    }
                }
            }
        }
        free(cs);
    }
    return err ? CUCA_ENOMEM : CUCA_OK;
}

/* silu(g) = g / (1 + exp(-g)) */
CUCA_INLINE vf ops_silu(vf g) { return v_div(g, v_add(v_set1(1.0f), v_exp(v_sub(v_zero(), g)))); }

/* gelu_tanh(g) = 0.5 g (1 + tanh(y)) = g / (1 + exp(-2y)), y = sqrt(2/pi) g (1 + 0.044715 g^2) */
CUCA_INLINE vf ops_gelu(vf g) {
    vf t = v_fma(v_mul(v_set1(0.044715f), g), g, v_set1(1.0f));        /* 1 + 0.044715 g^2 */
    vf y2 = v_mul(v_mul(v_set1(-1.5957691216057307f), g), t);          /* -2y */
    return v_div(g, v_add(v_set1(1.0f), v_exp(y2)));
}

int cuca_act_mul_f32(int kind, const float *g, cuca_rows gs, const float *u, cuca_rows us, float *out,
                     cuca_rows os, int64_t n0, int64_t n1, int64_t n, int n_threads) {
    if (n0 < 0 || n1 < 0 || n < 0 || (kind != 0 && kind != 1)) return CUCA_EINVAL;
    const int64_t rows = n0 * n1;
    const int nt = ops_threads(n_threads, rows, n * 8);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float *gr = row_c(g, gs, r, n1), *ur = row_c(u, us, r, n1);
        float *yr = row_m(out, os, r, n1);
        int64_t i = 0;
        if (kind == 0) {
            for (; i + VL <= n; i += VL) v_store(yr + i, v_mul(ops_silu(v_load(gr + i)), v_load(ur + i)));
            if (i < n) {
                int t = (int)(n - i);
                v_store_n(yr + i, v_mul(ops_silu(v_load_n(gr + i, t)), v_load_n(ur + i, t)), t);
            }
        } else {
            for (; i + VL <= n; i += VL) v_store(yr + i, v_mul(ops_gelu(v_load(gr + i)), v_load(ur + i)));
            if (i < n) {
                int t = (int)(n - i);
                v_store_n(yr + i, v_mul(ops_gelu(v_load_n(gr + i, t)), v_load_n(ur + i, t)), t);
            }
        }
    }
    return CUCA_OK;
}
