/* The element-wise ops of the hybrid (Gated DeltaNet) layers: the depthwise causal conv with its window update,
 * the beta sigmoid and the softplus log-decay. Each output row is computed by the same operations wherever it
 * sits and whatever the thread count; threads split whole rows (the conv: blocks of channels). The conv is float
 * products and sums in tap order (the numpy form: out = raw[0]*t0, then out += raw[j]*tj); the gates are computed
 * in double. */
#include <math.h>
#include <string.h>

#include "cuca.h"
#include "ops.h"
#include "pool.h"
#include "vmath.h"

/* rows x floats below which a call stays on one thread */
#define HY_PAR_MIN 32768

static int hy_threads(int n_threads, int64_t rows, int64_t n) {
    if (rows < 2 || rows * n < HY_PAR_MIN) return 1;
    int nt = n_threads > 0 ? n_threads : cuca_pool_default_threads();
    return rows < nt ? (int)rows : nt;
}

/* channels per item of the conv: a few rows' conv is memory latency (the windows and taps of 18 layers come cold),
 * so the channels are shared out, each item doing its columns of the copies, the conv and the window update; a
 * column's result never depends on the split */
#define HY_CONV_CH 1024

static void conv_item(void *ctx, int64_t it, int tid) {
    const cuca_causal_conv_args *A = (const cuca_causal_conv_args *)ctx;
    (void)tid;
    const int64_t W = A->K - 1, c0 = it * HY_CONV_CH, c1 = c0 + HY_CONV_CH < A->C ? c0 + HY_CONV_CH : A->C;
    const size_t nb = sizeof(float) * (size_t)(c1 - c0);
    for (int64_t r = 0; r < W; ++r) memcpy(A->raw + r * A->r_s0 + c0, A->window + r * A->w_s0 + c0, nb);
    for (int64_t r = 0; r < A->M; ++r) memcpy(A->raw + (W + r) * A->r_s0 + c0, A->x + r * A->x_s0 + c0, nb);
    for (int64_t i = 0; i < A->M; ++i) {
        float *y = A->out + i * A->o_s0;
        for (int64_t c = c0; c < c1; c += VL) {
            const int t = c1 - c < VL ? (int)(c1 - c) : VL;
            vf acc = v_zero();
            for (int j = 0; j < A->K; ++j) {
                const float *r = A->raw + (i + j) * A->r_s0 + c, *w = A->taps + j * A->t_s0 + c;
                const vf p = t == VL ? v_mul(v_load(r), v_load(w)) : v_mul(v_load_n(r, t), v_load_n(w, t));
                acc = j == 0 ? p : v_add(acc, p);
            }
            if (t == VL)
                v_store(y + c, acc);
            else
                v_store_n(y + c, acc, t);
        }
    }
    for (int64_t r = 0; r < W; ++r) memcpy(A->window + r * A->w_s0 + c0, A->raw + (A->M + r) * A->r_s0 + c0, nb);
}

int cuca_causal_conv_f32(const cuca_causal_conv_args *a) {
    if (a->M < 0 || a->C < 1 || a->K < 1) return CUCA_EINVAL;
    const int64_t nch = (a->C + HY_CONV_CH - 1) / HY_CONV_CH;
    int nt = a->n_threads > 0 ? a->n_threads : cuca_pool_default_threads();
    if (nch < 2 || (a->M + a->K) * a->C < 8192) nt = 1; /* a few thousand floats: not worth a hand-off */
    cuca_pool_run(nt, nch, (nch + nt - 1) / nt, conv_item, (void *)a);
    return CUCA_OK;
}

/* log(1 + exp(y)) as numpy's logaddexp(0, y) computes it */
static inline double hy_softplus(double y) {
    if (y == 0.0) return 0.693147180559945309417232121458176568; /* log 2 */
    return y > 0.0 ? y + log1p(exp(-y)) : log1p(exp(y));
}

typedef struct {
    int kind; /* 0: sigmoid, 1: decay */
    const float *x, *a, *dt;
    ptrdiff_t x_s0, o_s0;
    float *out;
    int64_t n;
} gate_job;

static void gate_item(void *ctx, int64_t r, int tid) {
    const gate_job *J = (const gate_job *)ctx;
    (void)tid;
    const float *x = J->x + r * J->x_s0;
    float *y = J->out + r * J->o_s0;
    if (J->kind == 0)
        for (int64_t i = 0; i < J->n; ++i) y[i] = (float)(1.0 / (1.0 + exp(-(double)x[i])));
    else
        for (int64_t i = 0; i < J->n; ++i) y[i] = (float)((double)J->a[i] * hy_softplus((double)x[i] + (double)J->dt[i]));
}

int cuca_gate_sigmoid_f32(const float *x, ptrdiff_t x_s0, float *out, ptrdiff_t o_s0, int64_t M, int64_t n,
                          int n_threads) {
    if (M < 0 || n < 0) return CUCA_EINVAL;
    gate_job J = {0, x, NULL, NULL, x_s0, o_s0, out, n};
    cuca_pool_run(hy_threads(n_threads, M, n * 16), M, 1, gate_item, &J);
    return CUCA_OK;
}

int cuca_gate_decay_f32(const float *alpha, ptrdiff_t x_s0, const float *a, const float *dt, float *out,
                        ptrdiff_t o_s0, int64_t M, int64_t n, int n_threads) {
    if (M < 0 || n < 0) return CUCA_EINVAL;
    gate_job J = {1, alpha, a, dt, x_s0, o_s0, out, n};
    cuca_pool_run(hy_threads(n_threads, M, n * 32), M, 1, gate_item, &J);
    return CUCA_OK;
}
