/* Gated DeltaNet recurrence (Qwen 3.5 linear-attention layers), one token after another.
 *
 * For each token t and head h, with state S (dk x dv, float32):
 *   q, k <- q / sqrt(sum q^2 + eps), k / sqrt(sum k^2 + eps); q <- q * scale
 *   S <- exp(g) S;  kv = k^T S;  S <- S + k (beta (v - kv))^T;  o = q^T S   (o uses the updated state)
 * One (token, head) is always the same float operations, in the same order, whatever the number of tokens in
 * the call, the token's place in it or the threads (threads only take whole heads): decode and verify give
 * bit-identical states and outputs. Columns of the state are independent, so each block of columns runs all the
 * tokens of the call while it sits in L1 (one token: in place in the live state; several: on a padded copy, see
 * DN_LD), in one pass over the block per token (its update, output and the next token's kv) after a first pass for
 * the first token's kv; with snapshots, the state after token t < T-1 is also stored to snaps[t] as it is produced
 * (no extra pass over the state). Two passes per token, each storing the block (before), cost 1.19 / 2.32 ms for 1 / 4
 * tokens of 16 heads x 128 x 128 x 18 layers from memory, this 1.01 / 1.96 ms (AVX-512, 2 threads, no snapshots). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuca.h"
#include "ops.h"
#include "pool.h"
#include "vmath.h"

/* 1 / sqrt(sum x^2 + eps): products in float, sum in double, one fixed order */
static float dn_inv_norm(const float *x, int n, float eps) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += (double)(x[i] * x[i]);
    return 1.0f / sqrtf((float)s + eps);
}

/* One token of one head on columns [j0, j1) of the state S (dk x dv, rows of dv floats), in place, one column
 * at a time: the same float operations, column by column, as the vector path. snap: NULL or where the updated
 * columns are copied too. */
static void dn_cols_scalar(const float *v, float e, float beta, float *S, float *snap, float *o, int dk, int dv,
                           int j0, int j1, const float *qn, const float *kn) {
    for (int j = j0; j < j1; ++j) {
        float kv = 0.0f;
        for (int i = 0; i < dk; ++i) {
            const float s = S[(size_t)i * dv + j] * e;
            S[(size_t)i * dv + j] = s;
            kv = kv + kn[i] * s;
        }
        const float d = beta * (v[j] - kv);
        float acc = 0.0f;
        for (int i = 0; i < dk; ++i) {
            const float s = S[(size_t)i * dv + j] + kn[i] * d;
            S[(size_t)i * dv + j] = s;
            if (snap) snap[(size_t)i * dv + j] = s;
            acc = acc + qn[i] * s;
        }
        o[j] = acc;
    }
}

#define DN_NV 4            /* vectors of columns per block: their kv / delta / o stay in registers */

/* snapshot store: non-temporal when the address allows it (snapshots are read back only on a rollback, so they
 * should not evict the live state from the caches nor cost a read for ownership) */
static inline void dn_store_snap(float *p, vf x) {
#if VL == 16
    if (((uintptr_t)p & 63) == 0) {
        _mm512_stream_ps(p, x);
        return;
    }
#elif VL == 8 && defined(__AVX2__) /* not the portable struct vf */
    if (((uintptr_t)p & 31) == 0) {
        _mm256_stream_ps(p, x);
        return;
    }
#endif
    v_store(p, x);
}
#define DN_BW (DN_NV * VL) /* columns per block */

/* kv of one token on the block of DN_BW columns at S (row stride ld) before its update: a[u] = sum_i k[i] (S[i] e),
 * in row order. The decayed state is not stored: the update pass recomputes S[i] e, the same float product. */
static void dn_kv(vf ev, const float *S, int ld, int dk, const float *kn, vf *a) {
    for (int u = 0; u < DN_NV; ++u) a[u] = v_zero();
    for (int i = 0; i < dk; ++i) {
        const float *r = S + (size_t)i * ld;
        const vf ki = v_set1(kn[i]);
        for (int u = 0; u < DN_NV; ++u) a[u] = v_add(a[u], v_mul(ki, v_mul(v_load(r + u * VL), ev)));
    }
}

/* One token of one head on the block of DN_BW columns at S (row stride ld floats), in place, given its kv (a); snap
 * rows: stride dv. With a next token (kn1 != NULL, decay ev1), the same pass sums that token's kv into a from the
 * updated rows: one pass over the block per token, in the same float operations and order as dn_kv then this. */
static void dn_block(const float *v, vf ev, vf bv, float *S, int ld, float *snap, float *o, int dk, int dv,
                     const float *qn, const float *kn, const float *kn1, vf ev1, vf *a) {
    vf d[DN_NV], ao[DN_NV];
    for (int u = 0; u < DN_NV; ++u) {
        d[u] = v_mul(bv, v_sub(v_load(v + u * VL), a[u]));
        ao[u] = a[u] = v_zero();
    }
    for (int i = 0; i < dk; ++i) {
        float *r = S + (size_t)i * ld;
        const vf ki = v_set1(kn[i]), qi = v_set1(qn[i]);
        vf s[DN_NV];
        for (int u = 0; u < DN_NV; ++u) {
            s[u] = v_add(v_mul(v_load(r + u * VL), ev), v_mul(ki, d[u]));
            v_store(r + u * VL, s[u]);
            if (snap) dn_store_snap(snap + (size_t)i * dv + u * VL, s[u]);
            ao[u] = v_add(ao[u], v_mul(qi, s[u]));
        }
        if (kn1) {
            const vf k1 = v_set1(kn1[i]);
            for (int u = 0; u < DN_NV; ++u) a[u] = v_add(a[u], v_mul(k1, v_mul(s[u], ev1)));
        }
    }
    for (int u = 0; u < DN_NV; ++u) v_store(o + u * VL, ao[u]);
}

/* A block of several tokens runs on a copy of its columns with rows DN_LD floats apart: rows 512 bytes apart (dv =
 * 128) put a row's stores 4 KiB below the loads 8 rows on, which the core takes for a store-to-load dependence */
#define DN_LD (DN_BW + 16)

typedef struct {
    const cuca_deltanet_args *a;
    float *bufs; /* per thread: T * (2 dk + 2) floats, then dk * DN_LD (the padded block) */
    size_t per_thread;
} dn_job;

/* item h: every token of head h */
static void dn_head_item(void *ctx, int64_t hh, int tid) {
    const dn_job *J = (const dn_job *)ctx;
    const cuca_deltanet_args *a = J->a;
    const float *q = a->q, *k = a->k, *v = a->v, *g = a->g, *beta = a->beta;
    const ptrdiff_t q_s0 = a->q_s0, q_s1 = a->q_s1, k_s0 = a->k_s0, k_s1 = a->k_s1, v_s0 = a->v_s0, v_s1 = a->v_s1;
    const ptrdiff_t g_s0 = a->g_s0, b_s0 = a->b_s0, o_s0 = a->o_s0, o_s1 = a->o_s1;
    float *state = a->state, *snaps = a->snaps, *out = a->out;
    const int T = a->T, H = a->H, dk = a->dk, dv = a->dv, h = (int)hh;
    const float eps = a->eps, scale = a->scale;
    const size_t hs = (size_t)dk * dv, ts = hs * (size_t)H;
    /* per token: the normalised q and k, exp(g) and beta of this head */
    float *buf = J->bufs + (size_t)tid * J->per_thread;
    float *qn = buf, *kn = buf + (size_t)T * dk, *ex = kn + (size_t)T * dk, *bt = ex + T;
    float *pad = bt + T + 16 - ((uintptr_t)(bt + T) / sizeof(float)) % 16; /* 64-byte aligned */
    for (int t = 0; t < T; ++t) {
        const float *qt = q + t * q_s0 + h * q_s1, *kt = k + t * k_s0 + h * k_s1;
        const float iq = dn_inv_norm(qt, dk, eps), ik = dn_inv_norm(kt, dk, eps);
        for (int i = 0; i < dk; ++i) {
            qn[(size_t)t * dk + i] = (qt[i] * iq) * scale;
            kn[(size_t)t * dk + i] = kt[i] * ik;
        }
        ex[t] = expf(g[t * g_s0 + h]);
        bt[t] = beta[t * b_s0 + h];
    }
    float *live = state + (size_t)h * hs;
    /* columns are independent: each block of columns runs every token while it sits in L1 */
    int j0 = 0;
    for (; j0 + DN_BW <= dv; j0 += DN_BW) {
        /* one token: in place (the block is read once anyway); several: on the padded copy */
        float *S = T > 1 ? pad : live + j0;
        const int ld = T > 1 ? DN_LD : dv;
        if (T > 1)
            for (int i = 0; i < dk; ++i) memcpy(pad + (size_t)i * DN_LD, live + (size_t)i * dv + j0, sizeof(float) * DN_BW);
        vf kv[DN_NV];
        dn_kv(v_set1(ex[0]), S, ld, dk, kn, kv);
        for (int t = 0; t < T; ++t)
            dn_block(v + t * v_s0 + h * v_s1 + j0, v_set1(ex[t]), v_set1(bt[t]), S, ld,
                     snaps && t < T - 1 ? snaps + (size_t)t * ts + (size_t)h * hs + j0 : NULL,
                     out + t * o_s0 + h * o_s1 + j0, dk, dv, qn + (size_t)t * dk, kn + (size_t)t * dk,
                     t + 1 < T ? kn + (size_t)(t + 1) * dk : NULL, v_set1(t + 1 < T ? ex[t + 1] : 0.0f), kv);
        if (T > 1)
            for (int i = 0; i < dk; ++i) memcpy(live + (size_t)i * dv + j0, pad + (size_t)i * DN_LD, sizeof(float) * DN_BW);
    }
    if (j0 < dv)
        for (int t = 0; t < T; ++t)
            dn_cols_scalar(v + t * v_s0 + h * v_s1, ex[t], bt[t], live,
                           snaps && t < T - 1 ? snaps + (size_t)t * ts + (size_t)h * hs : NULL,
                           out + t * o_s0 + h * o_s1, dk, dv, j0, dv, qn + (size_t)t * dk, kn + (size_t)t * dk);
#if VL == 16 || (VL == 8 && defined(__AVX2__))
    if (snaps) _mm_sfence(); /* this thread's non-temporal snapshot stores are visible before the job ends */
#endif
}

int cuca_deltanet_f32(const cuca_deltanet_args *a) {
    const int T = a->T, H = a->H, dk = a->dk, dv = a->dv, n_threads = a->n_threads;
    if (T < 0 || H < 0 || dk < 1 || dv < 1) return CUCA_EINVAL;
    if (T == 0 || H == 0) return CUCA_OK;
    const size_t ts = (size_t)dk * dv * (size_t)H;
    int nt = n_threads > 0 ? n_threads : cuca_pool_default_threads();
    if (nt > H) nt = H;
    if ((double)T * (double)ts < 65536.0) nt = 1;
    const size_t per = (size_t)T * (size_t)(2 * dk + 2) + 16 + (size_t)dk * DN_LD;
    dn_job J = {a, (float *)malloc(sizeof(float) * (size_t)nt * per), per};
    if (!J.bufs) return CUCA_ENOMEM;
    cuca_pool_run(nt, H, 1, dn_head_item, &J);
    free(J.bufs);
    return CUCA_OK;
}
