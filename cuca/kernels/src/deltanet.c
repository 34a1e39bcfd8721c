/* Gated DeltaNet recurrence (Qwen 3.5 linear-attention layers), one token after another.
 *
 * For each token t and head h, with state S (dk x dv, float32):
 *   q, k <- q / sqrt(sum q^2 + eps), k / sqrt(sum k^2 + eps); q <- q * scale
 *   S <- exp(g) S;  kv = k^T S;  S <- S + k (beta (v - kv))^T;  o = q^T S   (o uses the updated state)
 * One (token, head) is always the same float operations, in the same order, whatever the number of tokens in
 * the call, the token's place in it or the threads (threads only split heads): decode and verify give
 * bit-identical states and outputs. With snapshots, the state after token t < T-1 is written to snaps[t]
 * instead of overwriting the live state (token t+1 reads it from there), and the last token writes the live
 * state: keeping every intermediate state costs no extra pass over memory. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cuca.h"
#include "ops.h"

/* 1 / sqrt(sum x^2 + eps): products in float, sum in double, one fixed order */
static float dn_inv_norm(const float *x, int n, float eps) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += (double)(x[i] * x[i]);
    return 1.0f / sqrtf((float)s + eps);
}

/* one token of one head: src -> dst state (they may be the same buffer) */
static void dn_step(const float *q, const float *k, const float *v, float g, float beta, const float *src,
                    float *dst, float *o, int dk, int dv, float eps, float scale, float *qn, float *kn, float *kv) {
    const float iq = dn_inv_norm(q, dk, eps), ik = dn_inv_norm(k, dk, eps);
    for (int i = 0; i < dk; ++i) {
        qn[i] = (q[i] * iq) * scale;
        kn[i] = k[i] * ik;
    }
    const float e = expf(g);
    for (int j = 0; j < dv; ++j) kv[j] = 0.0f;
    for (int i = 0; i < dk; ++i) {
        const float *sr = src + (size_t)i * dv;
        float *dr = dst + (size_t)i * dv;
        const float ki = kn[i];
        for (int j = 0; j < dv; ++j) {
            const float s = sr[j] * e;
            dr[j] = s;
            kv[j] += ki * s;
        }
    }
    for (int j = 0; j < dv; ++j) {
        kv[j] = beta * (v[j] - kv[j]); /* kv now holds delta */
        o[j] = 0.0f;
    }
    for (int i = 0; i < dk; ++i) {
        float *dr = dst + (size_t)i * dv;
        const float ki = kn[i], qi = qn[i];
        for (int j = 0; j < dv; ++j) {
            const float s = dr[j] + ki * kv[j];
            dr[j] = s;
            o[j] += qi * s;
        }
    }
}

int cuca_deltanet_f32(const float *q, ptrdiff_t q_s0, ptrdiff_t q_s1, const float *k, ptrdiff_t k_s0, ptrdiff_t k_s1,
                      const float *v, ptrdiff_t v_s0, ptrdiff_t v_s1, const float *g, ptrdiff_t g_s0,
                      const float *beta, ptrdiff_t b_s0, float *state, float *snaps, float *out, ptrdiff_t o_s0,
                      ptrdiff_t o_s1, int T, int H, int dk, int dv, float eps, float scale, int n_threads) {
    if (T < 0 || H < 0 || dk < 1 || dv < 1) return CUCA_EINVAL;
    if (T == 0 || H == 0) return CUCA_OK;
    const size_t hs = (size_t)dk * dv, ts = hs * (size_t)H;
    int nt = n_threads > 0 ? n_threads : omp_get_max_threads();
    if (nt > H) nt = H;
    if ((double)T * (double)ts < 65536.0) nt = 1;
    int err = 0;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *buf = (float *)malloc(sizeof(float) * (size_t)(2 * dk + dv));
        if (!buf) {
#pragma omp atomic write
            err = 1;
        }
#pragma omp for schedule(static)
        for (int h = 0; h < H; ++h) {
            if (!buf) continue;
            float *live = state + (size_t)h * hs;
            for (int t = 0; t < T; ++t) {
                const float *src = (snaps && t > 0) ? snaps + (size_t)(t - 1) * ts + (size_t)h * hs : live;
                float *dst = (snaps && t < T - 1) ? snaps + (size_t)t * ts + (size_t)h * hs : live;
                dn_step(q + t * q_s0 + h * q_s1, k + t * k_s0 + h * k_s1, v + t * v_s0 + h * v_s1, g[t * g_s0 + h],
                        beta[t * b_s0 + h], src, dst, out + t * o_s0 + h * o_s1, dk, dv, eps, scale, buf,
                        buf + dk, buf + 2 * dk);
            }
        }
        free(buf);
    }
    return err ? CUCA_ENOMEM : CUCA_OK;
}
