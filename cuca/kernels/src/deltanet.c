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
 * tokens of 16 heads x 128 x 128 x 18 layers from memory, this 1.01 / 1.96 ms (AVX-512, 2 threads, no snapshots).
 * Deferred commit (cuca_deltanet_args.pend / rec / defer, the CPU's rollback): a token's record is its normalised k,
 * d = beta (v - kv) and exp(g); pending records are applied to a block first (S = exp(g) S + k d^T, the float
 * operations of the token's own update, so the state is the same bits), then the new tokens run and leave their
 * records, and with defer their state is dropped with the block: a rollback keeps fewer records, a snapshot of 1
 * MiB per layer and token no longer written (Qwen 3.5 0.8B, 4 tokens, 18 layers: 5.6 ms with snapshots, 2.6 ms with
 * 2 pending records; AVX2 Zen 3, 2 threads). */
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

/* One head's view of a call: per token its normalised q, k (dk apart), exp(g) and beta; v and out of this head at
 * token 0 (v_t / o_t floats per token); its first pending record and first new record (rec_t floats per token, k at
 * 0, d at dk, exp(g) at dk + dv) or NULL; its state in snapshot 0 (snap_t floats per token) or NULL. */
typedef struct {
    int T, P, dk, dv, defer;
    ptrdiff_t v_t, o_t, rec_t;
    size_t snap_t;
    const float *v, *qn, *kn, *ex, *bt, *pend;
    float *rec, *snaps, *out;
} dn_head;

/* Column j of one head, alone (the columns the vector blocks leave), on col (dk floats of scratch): the pending
 * records applied, then every token; the same float operations, column by column, as the vector path. */
static void dn_col_scalar(const dn_head *D, float *live, int j, float *col) {
    const int dk = D->dk, dv = D->dv;
    for (int i = 0; i < dk; ++i) col[i] = live[(size_t)i * dv + j];
    for (int p = 0; p < D->P; ++p) {
        const float *r = D->pend + p * D->rec_t;
        const float e = r[dk + dv], d = r[dk + j];
        for (int i = 0; i < dk; ++i) col[i] = col[i] * e + r[i] * d;
    }
    if (D->P && D->defer)
        for (int i = 0; i < dk; ++i) live[(size_t)i * dv + j] = col[i];
    for (int t = 0; t < D->T; ++t) {
        const float *kn = D->kn + (size_t)t * dk, *qn = D->qn + (size_t)t * dk;
        float *snap = D->snaps && t < D->T - 1 ? D->snaps + t * D->snap_t : NULL;
        float kv = 0.0f;
        for (int i = 0; i < dk; ++i) {
            const float s = col[i] * D->ex[t];
            col[i] = s;
            kv = kv + kn[i] * s;
        }
        const float d = D->bt[t] * (D->v[t * D->v_t + j] - kv);
        float acc = 0.0f;
        for (int i = 0; i < dk; ++i) {
            const float s = col[i] + kn[i] * d;
            col[i] = s;
            if (snap) snap[(size_t)i * dv + j] = s;
            acc = acc + qn[i] * s;
        }
        D->out[t * D->o_t + j] = acc;
        if (D->rec) D->rec[t * D->rec_t + dk + j] = d;
    }
    if (!D->defer)
        for (int i = 0; i < dk; ++i) live[(size_t)i * dv + j] = col[i];
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

/* A pending record r (dk + dv + 1 floats) applied to the block of DN_BW columns j0.. at S (row stride ld):
 * S = exp(g) S + k d^T, the float operations of the token's own update in dn_block. With kn1 (the last record
 * before new tokens), the same pass sums the first new token's kv into a, as dn_kv would (decay ev1). */
static void dn_apply(float *S, int ld, int dk, int dv, const float *r, int j0, const float *kn1, vf ev1, vf *a) {
    const vf ev = v_set1(r[dk + dv]);
    vf d[DN_NV];
    for (int u = 0; u < DN_NV; ++u) d[u] = v_load(r + dk + j0 + u * VL);
    if (kn1)
        for (int u = 0; u < DN_NV; ++u) a[u] = v_zero();
    for (int i = 0; i < dk; ++i) {
        float *row = S + (size_t)i * ld;
        const vf ki = v_set1(r[i]);
        vf s[DN_NV];
        for (int u = 0; u < DN_NV; ++u) {
            s[u] = v_add(v_mul(v_load(row + u * VL), ev), v_mul(ki, d[u]));
            v_store(row + u * VL, s[u]);
        }
        if (kn1) {
            const vf k1 = v_set1(kn1[i]);
            for (int u = 0; u < DN_NV; ++u) a[u] = v_add(a[u], v_mul(k1, v_mul(s[u], ev1)));
        }
    }
}

/* One token of one head on the block of DN_BW columns at S (row stride ld floats), in place, given its kv (a); snap
 * rows: stride dv; drec: NULL or where the block's d goes. With a next token (kn1 != NULL, decay ev1), the same pass sums that token's kv into a from the
 * updated rows: one pass over the block per token, in the same float operations and order as dn_kv then this. */
static void dn_block(const float *v, vf ev, vf bv, float *S, int ld, float *snap, float *o, int dk, int dv,
                     const float *qn, const float *kn, const float *kn1, vf ev1, vf *a, float *drec) {
    vf d[DN_NV], ao[DN_NV];
    for (int u = 0; u < DN_NV; ++u) {
        d[u] = v_mul(bv, v_sub(v_load(v + u * VL), a[u]));
        ao[u] = a[u] = v_zero();
        if (drec) v_store(drec + u * VL, d[u]);
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

/* item h: every token of head h (after its pending records) */
static void dn_head_item(void *ctx, int64_t hh, int tid) {
    const dn_job *J = (const dn_job *)ctx;
    const cuca_deltanet_args *a = J->a;
    const float *q = a->q, *k = a->k, *g = a->g, *beta = a->beta;
    const int T = a->T, P = a->P, H = a->H, dk = a->dk, dv = a->dv, h = (int)hh, defer = a->defer;
    const size_t hs = (size_t)dk * dv, W = (size_t)dk + (size_t)dv + 1;
    /* per token: the normalised q and k, exp(g) and beta of this head; then the padded block (64-byte aligned) */
    float *buf = J->bufs + (size_t)tid * J->per_thread;
    float *qn = buf, *kn = buf + (size_t)T * dk, *ex = kn + (size_t)T * dk, *bt = ex + T;
    float *pad = bt + T + 16 - ((uintptr_t)(bt + T) / sizeof(float)) % 16;
    for (int t = 0; t < T; ++t) {
        const float *qt = q + t * a->q_s0 + h * a->q_s1, *kt = k + t * a->k_s0 + h * a->k_s1;
        const float iq = dn_inv_norm(qt, dk, a->eps), ik = dn_inv_norm(kt, dk, a->eps);
        for (int i = 0; i < dk; ++i) {
            qn[(size_t)t * dk + i] = (qt[i] * iq) * a->scale;
            kn[(size_t)t * dk + i] = kt[i] * ik;
        }
        ex[t] = expf(g[t * a->g_s0 + h]);
        bt[t] = beta[t * a->b_s0 + h];
        if (a->rec) {
            float *r = a->rec + ((size_t)t * H + h) * W;
            memcpy(r, kn + (size_t)t * dk, sizeof(float) * (size_t)dk);
            r[dk + dv] = ex[t];
        }
    }
    const dn_head D = {
        .T = T, .P = P, .dk = dk, .dv = dv, .defer = defer, .v_t = a->v_s0, .o_t = a->o_s0,
        .rec_t = (ptrdiff_t)(H * W), .snap_t = hs * (size_t)H, .v = a->v + h * a->v_s1, .qn = qn, .kn = kn, .ex = ex,
        .bt = bt, .pend = a->pend ? a->pend + (size_t)h * W : NULL, .rec = a->rec ? a->rec + (size_t)h * W : NULL,
        .snaps = a->snaps ? a->snaps + (size_t)h * hs : NULL, .out = a->out + h * a->o_s1};
    float *live = a->state + (size_t)h * hs;
    /* columns are independent: each block of columns runs every token while it sits in L1 */
    int j0 = 0;
    for (; j0 + DN_BW <= dv; j0 += DN_BW) {
        /* one token and nothing pending: in place (the block is read once anyway); else on the padded copy */
        const int padded = T > 1 || P > 0 || defer;
        float *S = padded ? pad : live + j0;
        const int ld = padded ? DN_LD : dv;
        if (padded)
            for (int i = 0; i < dk; ++i) memcpy(pad + (size_t)i * DN_LD, live + (size_t)i * dv + j0, sizeof(float) * DN_BW);
        vf kv[DN_NV] = {v_zero(), v_zero(), v_zero(), v_zero()}; /* token 0's kv: the last record's pass, or dn_kv */
        for (int p = 0; p < P; ++p)
            dn_apply(S, ld, dk, dv, D.pend + p * D.rec_t, j0, p == P - 1 && T > 0 ? kn : NULL,
                     v_set1(T > 0 ? ex[0] : 0.0f), kv);
        if (P > 0 && defer) /* the pending records are committed; the new tokens' state is not */
            for (int i = 0; i < dk; ++i) memcpy(live + (size_t)i * dv + j0, pad + (size_t)i * DN_LD, sizeof(float) * DN_BW);
        if (T > 0) {
            if (P == 0) dn_kv(v_set1(ex[0]), S, ld, dk, kn, kv);
            for (int t = 0; t < T; ++t)
                dn_block(D.v + t * D.v_t + j0, v_set1(ex[t]), v_set1(bt[t]), S, ld,
                         D.snaps && t < T - 1 ? D.snaps + t * D.snap_t + j0 : NULL, D.out + t * D.o_t + j0, dk, dv,
                         qn + (size_t)t * dk, kn + (size_t)t * dk, t + 1 < T ? kn + (size_t)(t + 1) * dk : NULL,
                         v_set1(t + 1 < T ? ex[t + 1] : 0.0f), kv, D.rec ? D.rec + t * D.rec_t + dk + j0 : NULL);
        }
        if (padded && !defer)
            for (int i = 0; i < dk; ++i) memcpy(live + (size_t)i * dv + j0, pad + (size_t)i * DN_LD, sizeof(float) * DN_BW);
    }
    for (int j = j0; j < dv; ++j) dn_col_scalar(&D, live, j, pad);
#if VL == 16 || (VL == 8 && defined(__AVX2__))
    if (D.snaps) _mm_sfence(); /* this thread's non-temporal snapshot stores are visible before the job ends */
#endif
}

int cuca_deltanet_f32(const cuca_deltanet_args *a) {
    const int T = a->T, H = a->H, dk = a->dk, dv = a->dv, n_threads = a->n_threads;
    if (T < 0 || H < 0 || dk < 1 || dv < 1 || a->P < 0 || (a->P > 0 && !a->pend)) return CUCA_EINVAL;
    if ((a->pend || a->rec || a->defer) && a->snaps) return CUCA_EINVAL;
    if ((T == 0 && a->P == 0) || H == 0) return CUCA_OK;
    const size_t ts = (size_t)dk * dv * (size_t)H;
    int nt = n_threads > 0 ? n_threads : cuca_pool_default_threads();
    if (nt > H) nt = H;
    if ((double)(T + a->P) * (double)ts < 65536.0) nt = 1;
    const size_t per = (size_t)T * (size_t)(2 * dk + 2) + 16 + (size_t)dk * DN_LD;
    dn_job J = {a, (float *)malloc(sizeof(float) * (size_t)nt * per), per};
    if (!J.bufs) return CUCA_ENOMEM;
    cuca_pool_run(nt, H, 1, dn_head_item, &J);
    free(J.bufs);
    return CUCA_OK;
}
