/* Row-wise small ops: RMS norm (and a block's residual step around it), RoPE, SiLU/GELU gating.
 * Each output row is computed by the same operations wherever it sits and whatever the thread count;
 * threads only split whole rows. */
#include <math.h>
#include <stdlib.h>

#include "cuca.h"
#include "ops.h"
#include "pool.h"
#include "vmath.h"

/* rows x floats below which a call stays on one thread */
#define OPS_PAR_MIN 32768

static inline int ops_threads(int n_threads, int64_t rows, int64_t n) {
    if (rows < 2 || rows * n < OPS_PAR_MIN) return 1;
    int nt = n_threads > 0 ? n_threads : cuca_pool_default_threads();
    return rows < nt ? (int)rows : nt;
}

/* the rows over nt threads, one run of rows per claim: claiming short rows one at a time has the threads take turns
 * on the pool's counter (silu_mul on 4 x 16 rows of 128: 8.5 us on 2 threads, 3.0 us on 1; AVX-512) */
static void ops_run(int nt, int64_t rows, cuca_item_fn fn, void *ctx) {
    cuca_pool_run(nt, rows, (rows + nt - 1) / nt, fn, ctx);
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

typedef struct {
    const float *x;
    cuca_rows xs;
    const float *w;
    float eps;
    float *out;
    cuca_rows os;
    int64_t n1, n;
} rms_job;

static void rms_item(void *ctx, int64_t r, int tid) {
    const rms_job *J = (const rms_job *)ctx;
    (void)tid;
    ops_rms_row(row_c(J->x, J->xs, r, J->n1), J->w, J->eps, row_m(J->out, J->os, r, J->n1), J->n);
}

int cuca_rms_norm_f32(const float *x, cuca_rows xs, const float *w, float eps, float *out, cuca_rows os,
                      int64_t n0, int64_t n1, int64_t n, int n_threads) {
    if (n0 < 0 || n1 < 0 || n <= 0) return CUCA_EINVAL;
    const int64_t rows = n0 * n1;
    rms_job J = {x, xs, w, eps, out, os, n1, n};
    ops_run(ops_threads(n_threads, rows, n), rows, rms_item, &J);
    return CUCA_OK;
}

/* x += rms_norm(y) * w_y (y itself without norm_y), x *= scale, then out = rms_norm(x) * w_out (norm_out): the same
 * float operations as those calls one after another, so a fused residual gives their bits. out serves as the row's
 * scratch for the normed y. */
static void residual_item(void *ctx, int64_t r, int tid) {
    const cuca_residual_args *A = (const cuca_residual_args *)ctx;
    (void)tid;
    float *xr = row_m(A->x, A->xs, r, A->n1), *o = row_m(A->out, A->os, r, A->n1);
    const float *t = row_c(A->y, A->ys, r, A->n1);
    const int64_t n = A->n;
    if (A->norm_y) {
        ops_rms_row(t, A->w_y, A->eps, o, n);
        t = o;
    }
    const vf sv = v_set1(A->scale);
    const int scaled = A->scale != 1.0f;
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf v = v_add(v_load(xr + i), v_load(t + i));
        v_store(xr + i, scaled ? v_mul(v, sv) : v);
    }
    if (i < n) {
        const int k = (int)(n - i);
        vf v = v_add(v_load_n(xr + i, k), v_load_n(t + i, k));
        v_store_n(xr + i, scaled ? v_mul(v, sv) : v, k);
    }
    if (A->norm_out) ops_rms_row(xr, A->w_out, A->eps, o, n);
}

int cuca_residual_norm_f32(const cuca_residual_args *a) {
    if (a->n0 < 0 || a->n1 < 0 || a->n <= 0) return CUCA_EINVAL;
    const int64_t rows = a->n0 * a->n1;
    ops_run(ops_threads(a->n_threads, rows, a->n), rows, residual_item, (void *)a);
    return CUCA_OK;
}

typedef struct {
    float *x;
    cuca_rows xs;
    const int32_t *pos;
    int64_t n_head;
    int half, neox;
    float theta_scale, freq_scale;
    const float *freq_factors;
    float *scratch; /* 2 * half floats per thread: the row's cosines and sines */
} rope_job;

static void rope_item(void *ctx, int64_t i, int tid) {
    const rope_job *J = (const rope_job *)ctx;
    const int half = J->half;
    float *cs = J->scratch + (size_t)tid * 2 * (size_t)half, *sn = cs + half;
    /* angle of pair k: pos * base^(-2k/n_rot), built by repeated float products like ggml */
    float theta = (float)J->pos[i];
    for (int k = 0; k < half; ++k) {
        float t = J->freq_factors ? theta / J->freq_factors[k] : theta;
        t = J->freq_scale * t;
        cs[k] = cosf(t);
        sn[k] = sinf(t);
        theta *= J->theta_scale;
    }
    for (int64_t h = 0; h < J->n_head; ++h) {
        float *y = J->x + i * J->xs.s0 + h * J->xs.s1;
        if (J->neox) {
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

int cuca_rope_f32(float *x, cuca_rows xs, const int32_t *pos, int64_t M, int64_t n_head, int64_t hd, int n_rot,
                  float freq_base, int neox, const float *freq_factors, float freq_scale, int n_threads) {
    if (M < 0 || n_head < 0 || hd < 0 || n_rot < 0 || n_rot % 2 || n_rot > hd) return CUCA_EINVAL;
    if (M == 0 || n_head == 0 || n_rot == 0) return CUCA_OK;
    const int half = n_rot / 2;
    const int nt = ops_threads(n_threads, M, n_head * hd * 8);
    float *scratch = (float *)malloc(sizeof(float) * 2 * (size_t)half * (size_t)nt);
    if (!scratch) return CUCA_ENOMEM;
    rope_job J = {x, xs, pos, n_head, half, neox, powf(freq_base, -2.0f / (float)n_rot), freq_scale, freq_factors,
                  scratch};
    cuca_pool_run(nt, M, 1, rope_item, &J);
    free(scratch);
    return CUCA_OK;
}

/* silu(g) = g / (1 + exp(-g)) */
CUCA_INLINE vf ops_silu(vf g) { return v_div(g, v_add(v_set1(1.0f), v_exp(v_sub(v_zero(), g)))); }

/* gelu_tanh(g) = 0.5 g (1 + tanh(y)) = g / (1 + exp(-2y)), y = sqrt(2/pi) g (1 + 0.044715 g^2) */
CUCA_INLINE vf ops_gelu(vf g) {
    vf t = v_fma(v_mul(v_set1(0.044715f), g), g, v_set1(1.0f));        /* 1 + 0.044715 g^2 */
    vf y2 = v_mul(v_mul(v_set1(-1.5957691216057307f), g), t);          /* -2y */
    return v_div(g, v_add(v_set1(1.0f), v_exp(y2)));
}

typedef struct {
    int kind;
    const float *g;
    cuca_rows gs;
    const float *u;
    cuca_rows us;
    float *out;
    cuca_rows os;
    int64_t n1, n;
} act_job;

static void act_item(void *ctx, int64_t r, int tid) {
    const act_job *J = (const act_job *)ctx;
    (void)tid;
    const float *gr = row_c(J->g, J->gs, r, J->n1), *ur = row_c(J->u, J->us, r, J->n1);
    float *yr = row_m(J->out, J->os, r, J->n1);
    const int64_t n = J->n;
    int64_t i = 0;
    if (J->kind == 0) {
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

int cuca_act_mul_f32(int kind, const float *g, cuca_rows gs, const float *u, cuca_rows us, float *out,
                     cuca_rows os, int64_t n0, int64_t n1, int64_t n, int n_threads) {
    if (n0 < 0 || n1 < 0 || n < 0 || (kind != 0 && kind != 1)) return CUCA_EINVAL;
    const int64_t rows = n0 * n1;
    act_job J = {kind, g, gs, u, us, out, os, n1, n};
    ops_run(ops_threads(n_threads, rows, n * 8), rows, act_item, &J);
    return CUCA_OK;
}

/* ---- softcap: x = cap * tanh(x / cap) in place, lane by lane; a row is cut into chunks of OPS_CAP_CH floats (a
 * vocabulary-wide row of logits is shared out over the threads), so no element's value depends on the split */
#define OPS_CAP_CH 16384

typedef struct {
    float *x;
    cuca_rows xs;
    int64_t n1, n, nch;
    float cap;
} cap_job;

static void cap_item(void *ctx, int64_t u, int tid) {
    const cap_job *J = (const cap_job *)ctx;
    (void)tid;
    const int64_t lo = u % J->nch * OPS_CAP_CH, hi = lo + OPS_CAP_CH < J->n ? lo + OPS_CAP_CH : J->n;
    float *xr = row_m(J->x, J->xs, u / J->nch, J->n1);
    const vf c = v_set1(J->cap);
    int64_t i = lo;
    for (; i + VL <= hi; i += VL) v_store(xr + i, v_mul(c, v_tanh(v_div(v_load(xr + i), c))));
    if (i < hi) {
        const int t = (int)(hi - i);
        v_store_n(xr + i, v_mul(c, v_tanh(v_div(v_load_n(xr + i, t), c))), t);
    }
}

int cuca_softcap_f32(float *x, cuca_rows xs, int64_t n0, int64_t n1, int64_t n, float cap, int n_threads) {
    if (n0 < 0 || n1 < 0 || n < 0 || !(cap > 0.0f) || !isfinite(cap)) return CUCA_EINVAL;
    const int64_t rows = n0 * n1, nch = (n + OPS_CAP_CH - 1) / OPS_CAP_CH;
    if (rows == 0 || n == 0) return CUCA_OK;
    cap_job J = {x, xs, n1, n, nch, cap};
    const int nt = rows * n < 4 * OPS_PAR_MIN ? 1 : n_threads; /* tanh costs ~20 operations per 8 floats */
    cuca_pool_run(nt, rows * nch, 1, cap_item, &J);
    return CUCA_OK;
}
