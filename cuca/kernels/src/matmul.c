/* out[M, n_out] = x[M, n_in] . W[n_out, n_in]^T for raw GGUF weights: the driver (activation quantization,
 * thread split over output rows, tiling over x rows) and the tile kernels for the float formats F32, F16, BF16.
 *
 * Batch invariance: out[m, n] is produced by one tile-kernel call for weight row n, and every tile kernel runs
 * the same float sequence for each x row whatever the tile height, so the result never depends on M, on the
 * row's position in the batch, or on the number of threads. */
#include <math.h>
#include "pool.h"
#include <stdlib.h>
#include "qmatmul.h"

/* ---- float weights: x stays float32; per row two float32 accumulators over 16-wide chunks ---- */
#if defined(CUCA_AVX512)
#define F_T 8
static inline float hsum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

/* F32 (F16 / BF16 run matmul_pf.c's packed tiles: cuca_tile_q hands them out): one weight row against x rows
 * m0 .. m0+nr-1, out[r * ldo]. Per (weight row, x row) one float sequence whatever nr: two accumulators (values 32j
 * .. 32j+15 and 32j+16 .. 32j+31), the masked tail, one horizontal sum. */
static inline __attribute__((always_inline)) void f_row(const int wt, const uint8_t *w, const cuca_act *A,
                                                        int64_t m0, const int nr, float *out, int64_t ldo) {
    (void)wt;
    const int64_t n = A->n_in;
    const float *x = A->xf + m0 * n;
    __m512 acc[2][F_T];
    int64_t k = 0;
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
    for (; k + 32 <= n; k += 32) {
        cuca_prefetch(w + k * 4, 128);
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512 wv = _mm512_loadu_ps((const float *)w + k + 16 * h);
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) acc[h][r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * n + k + 16 * h), acc[h][r]);
        }
    }
    if (k < n) {
        const int64_t rem = n - k;
        const __mmask16 mm[2] = {(__mmask16)(rem >= 16 ? 0xFFFF : (1u << rem) - 1),
                                 (__mmask16)(rem <= 16 ? 0 : (1u << (rem - 16)) - 1)};
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            if (h && rem <= 16) break;
            const __m512 wv = _mm512_maskz_loadu_ps(mm[h], (const float *)w + k + 16 * h);
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++)
                acc[h][r] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mm[h], x + r * n + k + 16 * h), acc[h][r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = hsum512(_mm512_add_ps(acc[0][r], acc[1][r]));
}

#elif defined(CUCA_AVX2)
/* F32 only: F16 / BF16 run matmul_pf.c's 4-row tiles (cuca_tile_q hands them out) */
#define F_T 4
static inline __attribute__((always_inline)) void f_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                         int64_t m0, const int nr, float *out, int64_t ldo) {
    (void)wt;
    const int64_t n = A->n_in;
    const float *x = A->xf + m0 * n;
    __m256 acc0[F_T], acc1[F_T];
    int64_t k = 0;
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (; k + 16 <= n; k += 16) {
        cuca_prefetch(w + k * 4, 64);
        const __m256 w0 = _mm256_loadu_ps((const float *)w + k), w1 = _mm256_loadu_ps((const float *)w + k + 8);
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * n + k), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * n + k + 8), acc1[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        float s = cuca_hsum256(_mm256_add_ps(acc0[r], acc1[r]));
        for (int64_t j = k; j < n; j++) {
            float wj;
            memcpy(&wj, w + 4 * j, 4);
            s = fmaf(wj, x[r * n + j], s);
        }
        out[r * ldo] = s;
    }
}

#else
#define F_T 4
static inline void f_tile(const int wt, const uint8_t *w, const cuca_act *A, int64_t m0, const int nr, float *out,
                          int64_t ldo) {
    const int64_t n = A->n_in;
    const float *x = A->xf + m0 * n;
    float s[F_T][8] = {{0}};
    for (int64_t k = 0; k < n; k += 8) {
        float wv[8] = {0};
        const int len = n - k < 8 ? (int)(n - k) : 8;
        for (int l = 0; l < len; l++) {
            if (wt == GT_F32) memcpy(wv + l, w + 4 * (k + l), 4);
            else if (wt == GT_F16) wv[l] = cuca_h2f(cuca_ld16(w + 2 * (k + l)));
            else { uint32_t b = (uint32_t)cuca_ld16(w + 2 * (k + l)) << 16; memcpy(wv + l, &b, 4); }
        }
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++)
            for (int l = 0; l < len; l++) s[r][l] += wv[l] * x[r * n + k + l];
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        out[r * ldo] = ((s[r][0] + s[r][1]) + (s[r][2] + s[r][3])) + ((s[r][4] + s[r][5]) + (s[r][6] + s[r][7]));
}
#endif

#if F_T == 8
#define F_FN(name, wt) CUCA_TILE_FN(name, f_row, wt, 8)
#else
#define F_FN(name, wt) CUCA_TILE_FN(name, f_tile, wt, 4)
#endif
F_FN(tile_f32, GT_F32)
#if !defined(CUCA_AVX2) && !defined(CUCA_AVX512) /* the SIMD builds pack F16 / BF16 (matmul_pf.c) */
F_FN(tile_f16, GT_F16)
F_FN(tile_bf16, GT_BF16)
#endif

int cuca_tile_f(int wtype, cuca_tile_fn *fn, int *tile) {
    switch (wtype) {
    case GT_F32: *fn = tile_f32; break;
#if !defined(CUCA_AVX2) && !defined(CUCA_AVX512)
    case GT_F16: *fn = tile_f16; break;
    case GT_BF16: *fn = tile_bf16; break;
#endif
    default: return CUCA_EUNSUPPORTED;
    }
    *tile = F_T;
    return CUCA_OK;
}

/* ---- the driver ---- */
#define ROW_BLOCK 16 /* weight rows kept hot while a tile of x rows sweeps them */

typedef struct {
    cuca_tile_fn fn;
    cuca_act *A;
    const float *x;
    const uint8_t *w;
    float *out;
    size_t rb;
    int64_t n_out, n_in, M, nch, per;
    int tile;
    /* packed weights: the group kernel, rows per group, groups computed, raw rows after the full groups */
    cuca_pk_fn pfn;
    int R, ptile;
    int64_t ngrp, n_full, n_tail, nb; /* nb: blocks per weight row */
    const cuca_out_split *split;      /* NULL: one output, out (M, n_out) */
} mm_job;

/* item u: values [lo, hi) blocks of activation row u / nch, in chunks of 512 values (one row is shared out too) */
static void mm_quantize_item(void *ctx, int64_t u, int tid) {
    const mm_job *J = (const mm_job *)ctx;
    (void)tid;
    const int64_t m = u / J->nch, lo = u % J->nch * J->per, hi = lo + J->per < J->A->nblk ? lo + J->per : J->A->nblk;
    cuca_act_quantize(J->A, J->x + m * J->n_in, m, lo, hi);
}

/* item blk: output rows [16 blk, 16 blk + 16) for every x row, tile by tile */
static void mm_block_item(void *ctx, int64_t blk, int tid) {
    const mm_job *J = (const mm_job *)ctx;
    (void)tid;
    const int64_t n_lo = blk * ROW_BLOCK, n_hi = n_lo + ROW_BLOCK < J->n_out ? n_lo + ROW_BLOCK : J->n_out;
    for (int64_t m0 = 0; m0 < J->M; m0 += J->tile) {
        const int nr = J->M - m0 < J->tile ? (int)(J->M - m0) : J->tile;
        J->fn(J->w + (size_t)n_lo * J->rb, J->rb, (int)(n_hi - n_lo), J->A, m0, nr, J->out + m0 * J->n_out + n_lo,
              J->n_out);
    }
}

/* the activation rows quantized as wtype's kernels want them, shared out over the pool */
static int mm_quantize_all(mm_job *J, int wtype, int nt) {
    int rc = cuca_act_init(J->A, wtype, J->x, J->M, J->n_in);
    if (rc != CUCA_OK || J->A->kind == ACT_F32) return rc;
    J->per = J->A->kind == ACT_Q8_K ? 2 : 16;
    J->nch = (J->A->nblk + J->per - 1) / J->per;
    /* a few rows' quantization is cheaper than handing it out */
    cuca_pool_run(J->M * J->n_in < 16384 ? 1 : nt, J->M * J->nch, 0, mm_quantize_item, J);
    return CUCA_OK;
}

/* Items per claim. A matrix of 1 MiB or more: claims of about 1 MiB of weights (at least 4 per thread), so each
 * thread streams long runs (each claim starts a stream the prefetchers must pick up again) and a thread on a busy
 * core holds up little. 1 MiB vs 256 KiB claims, single decode steps alternated in one process (AVX-512, 2 threads,
 * huge-page arena): E2B 0.917 / 0.947x the time where memory ran fast (36-39 ms steps), 0.994x where slow (49 ms);
 * Qwen 3.5 0.8B 0.947x fast (22-23 ms), 0.994x slow; 4 MiB on par with 1 MiB; E2B passes 0.962 / 0.983 / 0.972x at
 * M = 1 / 4 / 8 (AVX2 build 0.998 / 0.967x). 64 KiB claims cost 1.07-1.12x the time of 256 KiB ones. A smaller
 * matrix: one claim per thread (SmolLM2 decode, every matrix under 0.6 MB, 1.166x the speed of 8 claims; Qwen 3.5
 * 1.024x, Gemma 3 1.009x; AVX-512, 2 threads, builds swapped in one process, 8-12 pairs); a thread descheduled
 * mid-claim holds up so short a pass either way. */
static int64_t mm_chunk(size_t item_bytes, int64_t items, int nt) {
    if ((double)item_bytes * (double)items < 1048576.0) return (items + nt - 1) / nt;
    int64_t chunk = (int64_t)(1048576 / (item_bytes + 1));
    if (chunk < 1) chunk = 1;
    if (chunk > items / (nt * 4)) chunk = items / (nt * 4) > 1 ? items / (nt * 4) : 1;
    return chunk;
}

static int mm_threads(int n_threads, double work) {
    int nt = n_threads > 0 ? n_threads : cuca_pool_default_threads();
    if (n_threads == 0 && work < 65536.0) nt = 1; /* automatic: small problems are not worth a second thread */
    return nt;
}

int cuca_matmul_gguf_f32(const void *w, int wtype, int64_t n_out, int64_t n_in, const float *x, int64_t M,
                         float *out, int n_threads) {
    cuca_tile_fn fn = NULL;
    cuca_act A;
    int bs, bytes, tile = 1, nt, rc;
    if (!cuca_type_block(wtype, &bs, &bytes)) return CUCA_EUNSUPPORTED;
    if (n_out <= 0 || n_in <= 0 || n_in % bs || M <= 0 || n_threads < 0) return CUCA_EINVAL;
    if (cuca_tile_q(wtype, &fn, &tile) != CUCA_OK && cuca_tile_k(wtype, &fn, &tile) != CUCA_OK &&
        cuca_tile_f(wtype, &fn, &tile) != CUCA_OK)
        return CUCA_EUNSUPPORTED;
    const size_t rb = (size_t)(n_in / bs) * (size_t)bytes;
    const int64_t nblocks = (n_out + ROW_BLOCK - 1) / ROW_BLOCK;
    nt = mm_threads(n_threads, (double)n_out * (double)rb * (double)((M + tile - 1) / tile) + (double)M * n_in);
    mm_job J = {fn, &A, x, (const uint8_t *)w, out, rb, n_out, n_in, M, 0, 0, tile, NULL, 0, 0, 0, 0, 0};
    if ((rc = mm_quantize_all(&J, wtype, nt)) != CUCA_OK) return rc;
    cuca_pool_run(nt, nblocks, mm_chunk((size_t)ROW_BLOCK * rb, nblocks, nt), mm_block_item, &J);
    cuca_act_free(&A);
    return CUCA_OK;
}

/* where output row m0, weight row n (of a group or the raw tail: all in one output) goes, and that output's width */
static float *mm_out(const mm_job *J, int64_t n, int64_t m0, int64_t *ldo) {
    const cuca_out_split *S = J->split;
    if (!S) {
        *ldo = J->n_out;
        return J->out + m0 * J->n_out + n;
    }
    int i = 0;
    while (i + 1 < S->n && S->lo[i + 1] <= n) i++;
    *ldo = S->lo[i + 1] - S->lo[i];
    return S->out[i] + m0 * *ldo + (n - S->lo[i]);
}

/* item u < ngrp: packed group u for every x row, tile by tile; u == ngrp: the raw rows after the full groups */
static void mm_group_item(void *ctx, int64_t u, int tid) {
    const mm_job *J = (const mm_job *)ctx;
    (void)tid;
    const int64_t nb = J->nb;
    int64_t ldo;
    if (u == J->ngrp) {
        for (int64_t m0 = 0; m0 < J->M; m0 += J->tile) {
            const int nr = J->M - m0 < J->tile ? (int)(J->M - m0) : J->tile;
            float *o = mm_out(J, J->n_full, m0, &ldo);
            J->fn(J->w + (size_t)J->n_full * J->rb, J->rb, (int)J->n_tail, J->A, m0, nr, o, ldo);
        }
        return;
    }
    const int64_t n_lo = u * J->R;
    const int nv = J->n_out - n_lo < J->R ? (int)(J->n_out - n_lo) : J->R;
    for (int64_t m0 = 0; m0 < J->M; m0 += J->ptile) {
        const int nr = J->M - m0 < J->ptile ? (int)(J->M - m0) : J->ptile;
        float *o = mm_out(J, n_lo, m0, &ldo);
        J->pfn(J->w + (size_t)n_lo * J->rb, nb, J->A, m0, nr, o, ldo, nv);
    }
}

/* J (zeroed, x / M / out or split set) for the first n_out rows of a packed n_rows x n_in tensor p of format wtype */
static int mm_packed_job(mm_job *J, const void *p, int wtype, int64_t n_rows, int64_t n_in, int64_t n_out) {
    int bs, bytes;
    if (!cuca_type_block(wtype, &bs, &bytes)) return CUCA_EUNSUPPORTED;
    if (n_rows <= 0 || n_out <= 0 || n_out > n_rows || n_in <= 0 || n_in % bs || J->M <= 0) return CUCA_EINVAL;
    J->R = cuca_pack_rows(wtype);
    if (J->R == 0 || cuca_tile_p(wtype, &J->pfn, &J->fn, &J->ptile) != CUCA_OK) return CUCA_EUNSUPPORTED;
    J->tile = J->ptile;
    J->nb = n_in / bs;
    J->rb = (size_t)J->nb * (size_t)bytes;
    J->n_full = n_rows / J->R * J->R;
    J->ngrp = ((n_out < J->n_full ? n_out : J->n_full) + J->R - 1) / J->R;
    J->n_tail = n_out > J->n_full ? n_out - J->n_full : 0;
    J->w = (const uint8_t *)p;
    J->n_out = n_out;
    J->n_in = n_in;
    return CUCA_OK;
}

/* the activations quantized, then the groups (and the raw tail) over the pool */
static int mm_packed_run(mm_job *J, int wtype, int n_threads) {
    cuca_act A;
    int nt, rc;
    J->A = &A;
    const int64_t items = J->ngrp + (J->n_tail > 0);
    nt = mm_threads(n_threads, (double)J->n_out * (double)J->rb * (double)((J->M + J->ptile - 1) / J->ptile) +
                                   (double)J->M * J->n_in);
    if ((rc = mm_quantize_all(J, wtype, nt)) != CUCA_OK) return rc;
    cuca_pool_run(nt, items, mm_chunk((size_t)J->R * J->rb, items, nt), mm_group_item, J);
    cuca_act_free(&A);
    return CUCA_OK;
}

int cuca_matmul_packed_split_f32(const void *p, int wtype, int64_t n_rows, int64_t n_in, const float *x, int64_t M,
                                 const cuca_out_split *S, int n_threads) {
    mm_job J;
    memset(&J, 0, sizeof(J));
    if (!S || S->n < 1 || S->lo[0] != 0 || n_threads < 0) return CUCA_EINVAL;
    J.x = x;
    J.M = M;
    J.split = S;
    int rc = mm_packed_job(&J, p, wtype, n_rows, n_in, S->lo[S->n]);
    if (rc != CUCA_OK) return rc;
    for (int i = 0; i < S->n; i++)
        if (!S->out[i] || S->lo[i + 1] <= S->lo[i] || (i > 0 && S->lo[i] % J.R)) return CUCA_EINVAL;
    return mm_packed_run(&J, wtype, n_threads);
}

int cuca_matmul_packed_f32(const void *p, int wtype, int64_t n_rows, int64_t n_in, int64_t n_out, const float *x,
                           int64_t M, float *out, int n_threads) {
    mm_job J;
    memset(&J, 0, sizeof(J));
    if (n_threads < 0) return CUCA_EINVAL;
    J.x = x;
    J.M = M;
    J.out = out;
    int rc = mm_packed_job(&J, p, wtype, n_rows, n_in, n_out);
    return rc != CUCA_OK ? rc : mm_packed_run(&J, wtype, n_threads);
}

