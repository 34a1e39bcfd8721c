/* Causal / sliding-window grouped-query attention over a KV cache of float32 or IEEE half elements.
 *
 * How one (row, head) is computed, independently of everything else in the call:
 *   keys are cut into blocks of ATT_B absolute positions and blocks into superblocks of ATT_NB blocks;
 *   block partial:      scores s_j = scale * q.k_j (optionally soft-capped) for the visible keys of the block,
 *                       m_b = max s_j, p_j = exp(s_j - m_b), l_b = sum p_j, acc_b = sum_j p_j v_j (key order);
 *   superblock partial: (m_s, l_s, O_s) = the block partials merged in key order, starting from (-inf, 0, 0);
 *   result:             the superblock partials merged in key order, then O / l.
 * A merge of (m, l, O) with (m', l', O') is m'' = max(m, m'), a = exp(m - m''), b = exp(m' - m''),
 * l = l*a + l'*b, O = O*a + O'*b. Blocks or superblocks holding no visible key of the row are skipped.
 * Every dot product uses the same lane layout and reduction tree (whichever tile of queries and keys it is
 * computed in), so the sequence of float operations is fixed by the row's position, n_kv and window alone:
 * rows are bit-identical whatever the batch, their place in it or the threads. Keys a row cannot see get
 * probability exactly 0, so sharing a pass over V with rows that do see them leaves its sums unchanged.
 *
 * Work is split over (kv head, tile of rows, subset of the group's query heads); the rows and heads of one
 * item share every K/V load. When that gives fewer items than threads (decode), items are also split by block
 * of keys: each writes its block partials to scratch (for a block, what the single pass holds after it when it
 * is the first of its superblock) and a second pass merges them, blocks into their superblock and superblocks in
 * order: the very same merges as the single-pass path (att_merge is its in-superblock merge, operation for
 * operation). A block, not a superblock: at decode each thread then reads its share of a cache of up to 512
 * positions instead of all of it for a share of the heads: K / V from memory, 2 threads, M = 1, Gemma 3 / E2B
 * local / E2B global shapes 0.88 / 0.93 / 0.90x the time at position 200, 0.86 / - / 0.93x at 800, SmolLM2 0.98x,
 * E2B at 60 (one block) on par (AVX2 Zen 3, two builds alternated, the same bits). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuca.h"
#include "ops.h"
#include "pool.h"
#include "vmath.h"

#define ATT_B 128               /* keys per block */
#define ATT_NB 4                /* blocks per superblock */
#define ATT_S (ATT_B * ATT_NB)  /* keys per superblock */
#define ATT_RMAX 64             /* (row, head) pairs per work item */
#define ATT_RC 4                /* (row, head) pairs sharing one pass over V */
#define ATT_RSHARE 8            /* fewest (row, head) pairs per item when heads are split before keys */
#define ATT_PAR_MIN (1 << 19)   /* multiply-adds below which a call runs on one thread ... */
#define ATT_PAR_BYTES 65536     /* ... and K/V cache bytes (SmolLM2 decode reads 312 KiB a layer) */
#define ATT_PF_BYTES 65536     /* K/V bytes of a block up to which it is prefetched */
#define ATT_TK 4                /* keys per dot-product tile */
#define ATT_TQ (VL / ATT_TK)    /* queries per dot-product tile */
#define ATT_KC 16               /* keys per pass over the query tiles */
#if VL == 16
#define ATT_DS 4                /* vectors of V per pass */
#else
#define ATT_DS 2
#endif

/* AVX2 (16 registers): left free, GCC folds a V (or K) vector's load into every row's fma that uses it, so the
 * loads, not the fmas, bound the pass; an empty asm keeps the vector in a register for all the rows */
#if VL == 8 && defined(__AVX2__)
#define ATT_KEEP(v) __asm__("" : "+x"(v))
#else
#define ATT_KEEP(v) (void)0
#endif

typedef struct {
    const float *q;
    ptrdiff_t q_s0, q_s1;
    const void *k; /* float or IEEE half (kv16), as are v */
    ptrdiff_t k_s0;
    const void *v;
    ptrdiff_t v_s0;
    int kv16;
    const int32_t *pos;
    int M, H, Hkv, G, D, Dv, n_kv, window;
    float scale, softcap;
    float *out;
    ptrdiff_t o_s0, o_s1;
} att_args;

typedef struct {
    float *sc;   /* ATT_RMAX x ATT_B scores, then probabilities */
    float *zero; /* D zeros (of either element type): stands in for keys outside the computed range */
    const float *qp[ATT_RMAX];
    int lo[ATT_RMAX], hi[ATT_RMAX]; /* visible keys [lo, hi) of each (row, head) */
} att_ws;

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* visible keys [lo, hi) of row i; empty when hi <= lo */
static inline void att_range(const att_args *A, int i, int *lo, int *hi) {
    int64_t p = A->pos[i];
    int64_t h = p + 1 < A->n_kv ? p + 1 : A->n_kv;
    int64_t l = 0;
    if (A->window > 0) {
        l = p - A->window + 1;
        if (l < 0) l = 0;
    }
    if (h < l) h = l;
    *lo = (int)l;
    *hi = (int)h;
}

/* n bytes from p into the caches (T0): a block's K and V rows, which decode finds cold (the weight stream evicts
 * them between layers) */
static inline void att_prefetch(const char *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 3);
}

static inline int att_active(int lo, int hi, int s0, int s1) { return imax(lo, s0) < imin(hi, s1); }

/* VL cache elements from element offset c of a row (h: the cache holds halves) */
CUCA_INLINE vf att_ld(const void *row, ptrdiff_t c, const int h) {
    return h ? v_load_h((const uint16_t *)row + c) : v_load((const float *)row + c);
}
CUCA_INLINE vf att_ld_n(const void *row, ptrdiff_t c, int n, const int h) {
    return h ? v_load_h_n((const uint16_t *)row + c, n) : v_load_n((const float *)row + c, n);
}

/* VL dot products at once: lane a*ATT_TK + t = q_a . k_t (a < ATT_TQ, t < ATT_TK). Each is a chain of lane-wise
 * fused multiply-adds over D in order, then the one fixed reduction tree of v_reduce_t: the float operations of
 * a given (q, k) pair are the same whatever the other pairs of the tile are. */
CUCA_INLINE vf att_dot_tile(const float *const *qp, const void *const *kp, int D, const int h) {
    vf acc[VL];
#pragma GCC unroll 16
    for (int j = 0; j < VL; ++j) acc[j] = v_zero();
    int c = 0;
    for (; c + VL <= D; c += VL) {
        vf qv[ATT_TQ];
#pragma GCC unroll 4
        for (int a = 0; a < ATT_TQ; ++a) qv[a] = v_load(qp[a] + c);
#pragma GCC unroll 4
        for (int t = 0; t < ATT_TK; ++t) {
            vf kv = att_ld(kp[t], c, h);
            ATT_KEEP(kv);
#pragma GCC unroll 4
            for (int a = 0; a < ATT_TQ; ++a) acc[a * ATT_TK + t] = v_fma(qv[a], kv, acc[a * ATT_TK + t]);
        }
    }
    if (c < D) {
        const int n = D - c;
        vf qv[ATT_TQ];
        for (int a = 0; a < ATT_TQ; ++a) qv[a] = v_load_n(qp[a] + c, n);
        for (int t = 0; t < ATT_TK; ++t) {
            vf kv = att_ld_n(kp[t], c, n, h);
            for (int a = 0; a < ATT_TQ; ++a) acc[a * ATT_TK + t] = v_fma(qv[a], kv, acc[a * ATT_TK + t]);
        }
    }
    return v_reduce_t(acc);
}

/* acc_r = sum_j p_r[j] v_j over j in [j0, j1) for nr rows and nv vectors of V starting at column d0 (the last
 * one holding `tail` floats when tail > 0); then os_r = os_r*fa_r + acc_r*fb_r */
CUCA_INLINE void att_vpass(const int nr, const int nv, const int tail, const float *const *p, const void *vb,
                           int Dv, int d0, int j0, int j1, float *const *os, const float *fa, const float *fb,
                           const int h) {
    vf acc[ATT_RC][ATT_DS];
    for (int r = 0; r < nr; ++r)
        for (int t = 0; t < nv; ++t) acc[r][t] = v_zero();
    for (int j = j0; j < j1; ++j) {
        const ptrdiff_t e = (ptrdiff_t)j * Dv + d0;
        vf vv[ATT_DS];
        for (int t = 0; t < nv; ++t)
            vv[t] = (tail && t == nv - 1) ? att_ld_n(vb, e + t * VL, tail, h) : att_ld(vb, e + t * VL, h);
        if (nr > 1)
            for (int t = 0; t < nv; ++t) ATT_KEEP(vv[t]);
        for (int r = 0; r < nr; ++r) {
            vf pr = v_set1(p[r][j]);
            for (int t = 0; t < nv; ++t) acc[r][t] = v_fma(pr, vv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < nr; ++r) {
        vf a = v_set1(fa[r]), b = v_set1(fb[r]);
        for (int t = 0; t < nv; ++t) {
            float *dst = os[r] + d0 + t * VL;
            if (tail && t == nv - 1) {
                v_store_n(dst, v_fma(acc[r][t], b, v_mul(v_load_n(dst, tail), a)), tail);
            } else {
                v_store(dst, v_fma(acc[r][t], b, v_mul(v_load(dst), a)));
            }
        }
    }
}

/* one V block for nra pairs in chunks of ATT_RC; column slices outer so each slice of V is reused from L1 */
CUCA_INLINE void att_vblock(int nra, const float *const *p, const void *vb, int Dv, const int *j0s, const int *j1s,
                            float *const *os, const float *fa, const float *fb, const int h) {
#define ATT_VCHUNKS(NV, TAIL)                                                                    \
    for (int t0 = 0; t0 < nra; t0 += ATT_RC) {                                                   \
        const int nr = imin(ATT_RC, nra - t0), c = t0 / ATT_RC;                                  \
        const float *const *pc = p + t0;                                                         \
        float *const *oc = os + t0;                                                              \
        switch (nr) {                                                                            \
        case 1: att_vpass(1, NV, TAIL, pc, vb, Dv, d0, j0s[c], j1s[c], oc, fa + t0, fb + t0, h); break; \
        case 2: att_vpass(2, NV, TAIL, pc, vb, Dv, d0, j0s[c], j1s[c], oc, fa + t0, fb + t0, h); break; \
        case 3: att_vpass(3, NV, TAIL, pc, vb, Dv, d0, j0s[c], j1s[c], oc, fa + t0, fb + t0, h); break; \
        default: att_vpass(4, NV, TAIL, pc, vb, Dv, d0, j0s[c], j1s[c], oc, fa + t0, fb + t0, h); break; \
        }                                                                                        \
    }
    int d0 = 0;
    for (; d0 + ATT_DS * VL <= Dv; d0 += ATT_DS * VL) ATT_VCHUNKS(ATT_DS, 0)
    for (; d0 + VL <= Dv; d0 += VL) ATT_VCHUNKS(1, 0)
    if (d0 < Dv) {
        const int tail = Dv - d0;
        ATT_VCHUNKS(1, tail)
    }
#undef ATT_VCHUNKS
}

/* Superblock partials of the R (row, head) pairs set up in W (all reading kv head g), over the blocks of keys
[s0, s1) (a superblock, or one block of it). For each pair with a visible key there: ms/ls/os[r] get (m_s, l_s,
O_s); other pairs are left untouched. */
CUCA_INLINE void att_superblock_t(const att_args *A, att_ws *W, int g, int R, int s0, int s1, float *const *os,
                                  float *ms, float *ls, const int h) {
    const int D = A->D, Dv = A->Dv;
    const size_t es = h ? 2 : 4; /* bytes per cache element */
    const char *kh = (const char *)A->k + (ptrdiff_t)g * A->k_s0 * (ptrdiff_t)es;
    const char *vh = (const char *)A->v + (ptrdiff_t)g * A->v_s0 * (ptrdiff_t)es;
    const vf scale = v_set1(A->scale), cap = v_set1(A->softcap);
    const int softcap = A->softcap > 0.0f;

    for (int r = 0; r < R; ++r) {
        if (!att_active(W->lo[r], W->hi[r], s0, s1)) continue;
        ms[r] = -INFINITY;
        ls[r] = 0.0f;
        memset(os[r], 0, sizeof(float) * (size_t)Dv);
    }
    for (int bs = s0; bs < s1 && bs < A->n_kv; bs += ATT_B) {
        const int be = bs + ATT_B;
        int ra[ATT_RMAX], nra = 0, klo = INT_MAX, khi = INT_MIN;
        int blo[ATT_RMAX], bhi[ATT_RMAX];
        for (int r = 0; r < R; ++r) {
            int lo = imax(W->lo[r], bs), hi = imin(W->hi[r], be);
            if (lo >= hi) continue;
            ra[nra++] = r;
            blo[r] = lo;
            bhi[r] = hi;
            klo = imin(klo, lo);
            khi = imax(khi, hi);
        }
        if (nra == 0) continue;
        /* a small block's K and V rows requested up front: SmolLM2 decode (hd 64, 200-500 positions) 1.16x the
         * speed with the threads of ATT_PAR_BYTES alone, 1.15-1.21x with both; E2B's 256-512 KiB blocks ran 3-8%
         * slower at M = 4 with it (AVX-512, 2 threads, cuca vs cuca) */
        if ((size_t)(khi - klo) * (size_t)(D + Dv) * es <= ATT_PF_BYTES) {
            att_prefetch(kh + (ptrdiff_t)klo * D * (ptrdiff_t)es, (size_t)(khi - klo) * D * es);
            att_prefetch(vh + (ptrdiff_t)klo * Dv * (ptrdiff_t)es, (size_t)(khi - klo) * Dv * es);
        }

        /* raw dot products, ATT_TK keys x ATT_TQ pairs at a time, keys taken ATT_KC at a time so that both the
         * keys and the queries of a tile stay in L1. Keys outside [klo, khi) read a zero row; pairs past nra
         * repeat the last one (results dropped). */
        for (int kc = bs + (klo - bs) / ATT_TK * ATT_TK; kc < khi; kc += ATT_KC) {
            const int kc1 = imin(kc + ATT_KC, khi);
            for (int t0 = 0; t0 < nra; t0 += ATT_TQ) {
                const float *qp[ATT_TQ];
                int rlo = INT_MAX, rhi = INT_MIN;
                for (int a = 0; a < ATT_TQ; ++a) {
                    const int r = ra[imin(t0 + a, nra - 1)];
                    qp[a] = W->qp[r];
                    rlo = imin(rlo, blo[r]);
                    rhi = imax(rhi, bhi[r]);
                }
                for (int kq = kc; kq < kc1; kq += ATT_TK) {
                    if (rlo >= kq + ATT_TK || rhi <= kq) continue; /* no pair of the tile sees these keys */
                    const void *kp[ATT_TK];
                    for (int t = 0; t < ATT_TK; ++t) {
                        const int key = kq + t;
                        kp[t] = (key >= klo && key < khi) ? (const void *)(kh + (ptrdiff_t)key * D * (ptrdiff_t)es)
                                                          : (const void *)W->zero;
                    }
                    float res[VL];
                    v_store(res, att_dot_tile(qp, kp, D, h));
                    for (int a = 0; a < ATT_TQ && t0 + a < nra; ++a) {
                        float *dst = W->sc + ra[t0 + a] * ATT_B + (kq - bs);
                        for (int t = 0; t < ATT_TK; ++t) dst[t] = res[a * ATT_TK + t];
                    }
                }
            }
        }

        /* block softmax partial, and the factors merging it into the superblock partial */
        float fa[ATT_RMAX], fb[ATT_RMAX];
        for (int t = 0; t < nra; ++t) {
            const int r = ra[t];
            float *p = W->sc + r * ATT_B;
            const int a0 = blo[r] - bs, a1 = bhi[r] - bs;
            const int x0 = a0 / VL * VL, x1 = (a1 + VL - 1) / VL * VL;
            for (int x = x0; x < x1; x += VL) {
                vf sv = v_mul(v_load(p + x), scale);
                if (softcap) sv = v_mul(cap, v_tanh(v_div(sv, cap)));
                v_store(p + x, sv);
            }
            for (int x = x0; x < a0; ++x) p[x] = -INFINITY;
            for (int x = a1; x < x1; ++x) p[x] = -INFINITY;
            vf mx = v_set1(-INFINITY);
            for (int x = x0; x < x1; x += VL) mx = v_max(mx, v_load(p + x));
            const float m = v_hmax(mx);
            const vf mv = v_set1(m);
            vf sum = v_zero();
            for (int x = x0; x < x1; x += VL) {
                vf e = v_exp(v_sub(v_load(p + x), mv));
                v_store(p + x, e);
                sum = v_add(sum, e);
            }
            const float lb = v_hsum(sum);
            /* probabilities of this row are exactly 0 on the rest of the block range other rows read */
            for (int x = klo - bs; x < x0; ++x) p[x] = 0.0f;
            for (int x = x1; x < khi - bs; ++x) p[x] = 0.0f;
            const float mn = fmaxf(ms[r], m);
            fa[r] = s_exp(ms[r] - mn);
            fb[r] = s_exp(m - mn);
            ls[r] = ls[r] * fa[r] + lb * fb[r];
            ms[r] = mn;
        }

        /* acc_b = sum p_j v_j, merged into O_s; V rows are shared by ATT_RC pairs per pass */
        const float *pp[ATT_RMAX];
        float *op[ATT_RMAX];
        float ca[ATT_RMAX], cb[ATT_RMAX];
        int j0s[ATT_RMAX / ATT_RC + 1], j1s[ATT_RMAX / ATT_RC + 1];
        for (int t = 0; t < nra; ++t) {
            const int r = ra[t], c = t / ATT_RC;
            pp[t] = W->sc + r * ATT_B;
            op[t] = os[r];
            ca[t] = fa[r];
            cb[t] = fb[r];
            if (t % ATT_RC == 0) {
                j0s[c] = INT_MAX;
                j1s[c] = INT_MIN;
            }
            j0s[c] = imin(j0s[c], blo[r] - bs);
            j1s[c] = imax(j1s[c], bhi[r] - bs);
        }
        att_vblock(nra, pp, vh + (ptrdiff_t)bs * Dv * (ptrdiff_t)es, Dv, j0s, j1s, op, ca, cb, h);
    }
}

static void att_superblock_f32(const att_args *A, att_ws *W, int g, int R, int s0, int s1, float *const *os,
                               float *ms, float *ls) {
    att_superblock_t(A, W, g, R, s0, s1, os, ms, ls, 0);
}

static void att_superblock_f16(const att_args *A, att_ws *W, int g, int R, int s0, int s1, float *const *os,
                               float *ms, float *ls) {
    att_superblock_t(A, W, g, R, s0, s1, os, ms, ls, 1);
}

static void att_superblock(const att_args *A, att_ws *W, int g, int R, int s0, int s1, float *const *os, float *ms,
                           float *ls) {
    if (A->kv16)
        att_superblock_f16(A, W, g, R, s0, s1, os, ms, ls);
    else
        att_superblock_f32(A, W, g, R, s0, s1, os, ms, ls);
}

/* (m, l, O) <- merge with (ms, ls, Os) */
static void att_merge(float *O, float *m, float *l, const float *Os, float ms, float ls, int Dv) {
    const float mn = fmaxf(*m, ms);
    const float a = s_exp(*m - mn), b = s_exp(ms - mn);
    *l = *l * a + ls * b;
    *m = mn;
    const vf av = v_set1(a), bv = v_set1(b);
    int d = 0;
    for (; d + VL <= Dv; d += VL) v_store(O + d, v_fma(v_load(Os + d), bv, v_mul(v_load(O + d), av)));
    if (d < Dv) {
        const int n = Dv - d;
        v_store_n(O + d, v_fma(v_load_n(Os + d, n), bv, v_mul(v_load_n(O + d, n), av)), n);
    }
}

static void att_finish(float *O, float l, int Dv) {
    if (l == 0.0f) return; /* no visible key: O stays zero */
    const vf lv = v_set1(l);
    int d = 0;
    for (; d + VL <= Dv; d += VL) v_store(O + d, v_div(v_load(O + d), lv));
    if (d < Dv) v_store_n(O + d, v_div(v_load_n(O + d, Dv - d), lv), Dv - d);
}

/* set up the (row, head) pairs of rows [i0, i1) x group heads [h0, h1) of kv head g; returns R */
static int att_setup(const att_args *A, att_ws *W, int g, int i0, int i1, int h0, int h1, int *lo_all,
                     int *hi_all) {
    const int nh = h1 - h0;
    *lo_all = INT_MAX;
    *hi_all = INT_MIN;
    for (int i = i0; i < i1; ++i) {
        int lo, hi;
        att_range(A, i, &lo, &hi);
        if (lo < hi) {
            *lo_all = imin(*lo_all, lo);
            *hi_all = imax(*hi_all, hi);
        }
        for (int hh = h0; hh < h1; ++hh) {
            const int r = (i - i0) * nh + (hh - h0), h = g * A->G + hh;
            W->qp[r] = A->q + (ptrdiff_t)i * A->q_s0 + (ptrdiff_t)h * A->q_s1;
            W->lo[r] = lo;
            W->hi[r] = hi;
        }
    }
    return (i1 - i0) * nh;
}

/* whole item in one pass: superblock partials merged straight into out */
static void att_item(const att_args *A, att_ws *W, float *osbuf, int g, int i0, int i1, int h0, int h1) {
    int lo_all, hi_all;
    const int R = att_setup(A, W, g, i0, i1, h0, h1, &lo_all, &hi_all);
    const int nh = h1 - h0, Dv = A->Dv;
    float *op[ATT_RMAX], *osp[ATT_RMAX];
    float m[ATT_RMAX], l[ATT_RMAX], ms[ATT_RMAX], ls[ATT_RMAX];
    for (int r = 0; r < R; ++r) {
        const int i = i0 + r / nh, h = g * A->G + h0 + r % nh;
        op[r] = A->out + (ptrdiff_t)i * A->o_s0 + (ptrdiff_t)h * A->o_s1;
        osp[r] = osbuf + (size_t)r * Dv;
        memset(op[r], 0, sizeof(float) * (size_t)Dv);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    if (lo_all >= hi_all) return;
    for (int sb = lo_all / ATT_S; sb <= (hi_all - 1) / ATT_S; ++sb) {
        att_superblock(A, W, g, R, sb * ATT_S, (sb + 1) * ATT_S, osp, ms, ls);
        for (int r = 0; r < R; ++r)
            if (att_active(W->lo[r], W->hi[r], sb * ATT_S, (sb + 1) * ATT_S))
                att_merge(op[r], &m[r], &l[r], osp[r], ms[r], ls[r], Dv);
    }
    for (int r = 0; r < R; ++r) att_finish(op[r], l[r], Dv);
}

/* one block of keys (bk) of an item, its partials to scratch (pair (i, h) at index i*H + h, then block): the
 * values the single pass holds after that block when it is the first of its superblock the pair sees */
static void att_item_split(const att_args *A, att_ws *W, int g, int i0, int i1, int h0, int h1, int bk, int nbk,
                           float *scr_o, float *scr_m, float *scr_l) {
    int lo_all, hi_all;
    const int R = att_setup(A, W, g, i0, i1, h0, h1, &lo_all, &hi_all);
    const int nh = h1 - h0;
    if (!att_active(lo_all, hi_all, bk * ATT_B, (bk + 1) * ATT_B)) return;
    float *osp[ATT_RMAX], ms[ATT_RMAX], ls[ATT_RMAX];
    size_t idx[ATT_RMAX];
    for (int r = 0; r < R; ++r) {
        const int i = i0 + r / nh, h = g * A->G + h0 + r % nh;
        idx[r] = ((size_t)i * A->H + h) * nbk + bk;
        osp[r] = scr_o + idx[r] * A->Dv;
    }
    att_superblock(A, W, g, R, bk * ATT_B, (bk + 1) * ATT_B, osp, ms, ls);
    for (int r = 0; r < R; ++r) {
        scr_m[idx[r]] = ms[r];
        scr_l[idx[r]] = ls[r];
    }
}

/* row i, head h from its block partials: each superblock's blocks merged in key order into its first (att_merge
 * is the single pass's in-superblock merge, operation for operation), then the superblocks into the result */
static void att_combine(const att_args *A, int i, int h, int nbk, float *scr_o, const float *scr_m,
                        const float *scr_l) {
    const int Dv = A->Dv;
    float *O = A->out + (ptrdiff_t)i * A->o_s0 + (ptrdiff_t)h * A->o_s1;
    memset(O, 0, sizeof(float) * (size_t)Dv);
    int lo, hi;
    att_range(A, i, &lo, &hi);
    float m = -INFINITY, l = 0.0f;
    const size_t base = ((size_t)i * A->H + h) * nbk;
    for (int b0 = 0; b0 < nbk; b0 += ATT_NB) {
        int first = -1;
        float ms = 0.0f, ls = 0.0f;
        for (int b = b0; b < b0 + ATT_NB && b < nbk; ++b) {
            if (!att_active(lo, hi, b * ATT_B, (b + 1) * ATT_B)) continue;
            if (first < 0) {
                first = b;
                ms = scr_m[base + b];
                ls = scr_l[base + b];
            } else {
                att_merge(scr_o + (base + first) * Dv, &ms, &ls, scr_o + (base + b) * Dv, scr_m[base + b],
                          scr_l[base + b], Dv);
            }
        }
        if (first >= 0) att_merge(O, &m, &l, scr_o + (base + first) * Dv, ms, ls, Dv);
    }
    att_finish(O, l, Dv);
}

static float *att_alloc(size_t nfloat) {
    size_t bytes = (nfloat * sizeof(float) + 63) / 64 * 64;
    return (float *)aligned_alloc(64, bytes ? bytes : 64);
}

typedef struct {
    const att_args *A;
    float *ws; /* per thread: stride floats, scores then D zeros then (unsplit) the output rows */
    size_t stride;
    int R, D, split, nbk, nhs, ntile, TR, HS; /* nbk: key blocks, the unit of a split */
    float *scr_o, *scr_m, *scr_l;
} att_job;

/* item it: (kv head g, row tile, head slice[, key block when split]) */
static void att_work_item(void *ctx, int64_t it, int tid) {
    const att_job *J = (const att_job *)ctx;
    att_ws W;
    float *buf = J->ws + (size_t)tid * J->stride;
    W.sc = buf;
    W.zero = buf + (size_t)J->R * ATT_B;
    float *osbuf = W.zero + J->D;
    long rest = (long)it;
    const int bk = J->split ? (int)(rest % J->nbk) : 0;
    if (J->split) rest /= J->nbk;
    const int hs = (int)(rest % J->nhs);
    rest /= J->nhs;
    const int tile = (int)(rest % J->ntile);
    const int g = (int)(rest / J->ntile);
    const int i0 = tile * J->TR, i1 = imin(J->A->M, i0 + J->TR), h0 = hs * J->HS, h1 = imin(J->A->G, h0 + J->HS);
    if (J->split)
        att_item_split(J->A, &W, g, i0, i1, h0, h1, bk, J->nbk, J->scr_o, J->scr_m, J->scr_l);
    else
        att_item(J->A, &W, osbuf, g, i0, i1, h0, h1);
}

/* item rh: row rh / H, head rh % H, its blocks' partial results combined */
static void att_combine_item(void *ctx, int64_t rh, int tid) {
    const att_job *J = (const att_job *)ctx;
    (void)tid;
    att_combine(J->A, (int)(rh / J->A->H), (int)(rh % J->A->H), J->nbk, J->scr_o, J->scr_m, J->scr_l);
}

int cuca_attention(const cuca_attention_args *a) {
    const int M = a->M, n_head = a->n_head, n_kv_head = a->n_kv_head, hd_k = a->hd_k, hd_v = a->hd_v;
    const int n_ctx = a->n_ctx, n_kv = a->n_kv, window = a->window, n_threads = a->n_threads;
    if (M < 0 || n_head <= 0 || n_kv_head <= 0 || n_head % n_kv_head || hd_k <= 0 || hd_v <= 0 || n_ctx < 0 ||
        n_kv < 0 || n_kv > n_ctx || window < 0)
        return CUCA_EINVAL;
    if (M == 0) return CUCA_OK;
    att_args A = {a->q, a->q_s0, a->q_s1, a->k, a->k_s0, a->v, a->v_s0, a->kv16 != 0, a->q_pos, M, n_head, n_kv_head,
                  n_head / n_kv_head, hd_k, hd_v, n_kv, window, a->scale, a->softcap, a->out, a->o_s0, a->o_s1};
    const int G = A.G;
    /* multiply-adds of the call; small calls stay on one thread (a parallel region costs microseconds) */
    double work = 0.0;
    for (int i = 0; i < M; ++i) {
        int lo, hi;
        att_range(&A, i, &lo, &hi);
        if (hi > lo) work += (double)(hi - lo);
    }
    work *= (double)n_head * (hd_k + hd_v);
    /* ... unless they read much of the cache, which decode finds cold: two threads wait on memory in parallel */
    const double kv_bytes = (double)n_kv * n_kv_head * (hd_k + hd_v) * (a->kv16 ? 2 : 4);
    const int nt = work < ATT_PAR_MIN && kv_bytes < ATT_PAR_BYTES ? 1
                   : n_threads > 0                                 ? n_threads
                                                                   : cuca_pool_default_threads();

    int HS = imin(G, ATT_RMAX), TR = imin(M, imax(1, ATT_RMAX / HS));
#define ATT_NITEMS ((long)n_kv_head * ((M + TR - 1) / TR) * ((G + HS - 1) / HS))
    const int nbk = (n_kv + ATT_B - 1) / ATT_B;
    /* heads first while they halve evenly: equal items (E2B M = 3: 3 rows x 4 heads twice, not 2 + 1 rows, nor
     * 512 + 189 keys at 701); where keys could be split instead, only while an item keeps ATT_RSHARE pairs on
     * each K/V load */
    const int rshare = nbk >= 2 ? ATT_RSHARE : 1;
    /* (keys before heads at M > 1, each thread reading half the K / V for all heads: Gemma 3 / E2B whole passes
     * 0.98 / 1.01x the time at M = 4, position 200, AVX2 Zen 3: on par, not taken) */
    while (ATT_NITEMS < nt && HS % 2 == 0 && TR * (HS / 2) >= rshare) HS /= 2;
    /* then keys by block where items are fewer than threads, or fewer than twice as many and uneven (SmolLM2's 3 kv
     * heads on 2 threads: one thread read two heads' K / V, the other one; whole passes 0.96-0.98x the time at M = 1,
     * 0.96-1.00x at M = 2..4, positions 200 and 500, AVX2 Zen 3, builds swapped in one process) */
    const int split = nbk >= 2 && (ATT_NITEMS < nt || (ATT_NITEMS < 2 * nt && ATT_NITEMS % nt != 0));
    if (!split) {
        while (ATT_NITEMS < nt && TR > 1) TR = (TR + 1) / 2;
        while (ATT_NITEMS < nt && HS > 1) HS = (HS + 1) / 2;
    }
    const int ntile = (M + TR - 1) / TR, nhs = (G + HS - 1) / HS;
    const long nitems = ATT_NITEMS * (split ? nbk : 1);
#undef ATT_NITEMS

    /* split: each (row, head, block) partial's O (hd_v floats), then every m, then every l, in one allocation */
    float *scr_o = NULL, *scr_m = NULL, *scr_l = NULL;
    if (split) {
        const size_t npart = (size_t)M * n_head * nbk;
        if (!(scr_o = att_alloc(npart * ((size_t)hd_v + 2)))) return CUCA_ENOMEM;
        scr_m = scr_o + npart * hd_v;
        scr_l = scr_m + npart;
    }
    const int R = TR * HS;
    const size_t ws_floats = (size_t)R * ATT_B + (size_t)hd_k + (split ? 0 : (size_t)R * hd_v);
    const size_t stride = (ws_floats + 15) / 16 * 16; /* per-thread workspaces on their own cache lines */
    const int nth = (int)(nitems < nt ? nitems : nt);
    att_job J = {&A, NULL, stride, R, hd_k, split, nbk, nhs, ntile, TR, HS, scr_o, scr_m, scr_l};
    J.ws = att_alloc(stride * (size_t)nth);
    if (!J.ws) {
        free(scr_o);
        return CUCA_ENOMEM;
    }
    for (int t = 0; t < nth; ++t) memset(J.ws + t * stride + (size_t)R * ATT_B, 0, sizeof(float) * (size_t)hd_k);
    cuca_pool_run(nth, nitems, 1, att_work_item, &J);
    if (split) cuca_pool_run(nth, (int64_t)M * n_head, 0, att_combine_item, &J);
    free(J.ws);
    free(scr_o);
    return CUCA_OK;
}
