/* Row-interleaved ("packed") F16 / BF16 weights against float32 x, AVX2 and AVX-512 builds: a register tile of 4
 * weight rows x up to PF_T x rows, so each 8-value chunk of x loaded feeds 4 rows and each converted weight chunk
 * every x row, where a one-row tile swept all x rows per weight row. AVX2 (16 registers): 4 x 3 accumulators, 3 x
 * vectors and 1 weight vector; 4 x rows take rows 0-1 then rows 2-3 (4 x 2 accumulators) over each 2 KiB run of the
 * group, the second pass from L1 (pf_tile). AVX-512 (32 ymm registers, VL): 4 x 6 accumulators in one pass.
 *
 * Layout (same size as the raw tensor): rows in groups of 4; per group, chunk c (values 8c .. 8c+7) of rows 0..3
 * side by side (one 64-byte line), then the n_in % 8 last values of row 0, 1, 2, 3. The n_out % 4 last rows
 * stay raw. Raw rows (those, and every raw F16 / BF16 matmul of these builds: cuca_tile_q hands out pf_*_raw) run
 * the same kernel on the rows where they lie.
 *
 * Per (weight row, x row) the float sequence is fixed: one 8-lane accumulator acc += w_c * x_c chunk by chunk,
 * a fixed horizontal sum, then the last n_in % 8 products by fmaf in order, whatever the tile height, the sweep,
 * the row's group or where it is stored: batch invariant. */
#include <math.h>
#include "packed.h"

#if defined(CUCA_AVX2) || defined(CUCA_AVX512)
#if defined(CUCA_AVX512)
#define PF_T 6
#define PF_W(nr) PF_R /* weight rows per sweep */
#else
#define PF_T 4
#define PF_W(nr) ((nr) > 3 ? 2 : PF_R)
#endif
/* packed bytes prefetched this far ahead (PK_PREFETCH). One x row: 1 KiB (2 KiB left M = 1 1.13-1.18x the time of the
 * one-row kernel, 5632x2048 and 2048x5632, 12 copies, 2 threads, Zen 3; 512 / 768 bytes on par with 1 KiB). From 2
 * x rows a chunk takes 2-3x the cycles and 1 KiB is too near to hide DRAM: 8 KiB ran 0.37-0.55x the time at M = 2-4
 * (F16 5632x2048, 2048x5632, BF16 8960x1536, from memory, 2 threads, AVX2 build on Zen 4; 4 KiB 0.45-0.53x). The hint
 * is PK_PREFETCH's: NTA on Zen 2, where the kernel-table F16 / BF16 models ran 0.96-0.97x the time at M = 1, 2, 4 (2
 * threads, cuca vs cuca alternated); the Q5_K rows of matmul_k.c lost 1-6% with it (8 KiB ahead) and keep T1. */
#define PF_PF1 1024
#define PF_PF2 8192

static inline __attribute__((always_inline)) __m256 pf_load(const int wt, const uint8_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (wt == GT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) float pf_scalar(const int wt, const uint8_t *p) {
    return wt == GT_F16 ? cuca_h2f(cuca_ld16(p)) : cuca_bf2f(cuca_ld16(p));
}

/* A group's rows as pf_tile sees them: chunk c of row i at g + c * cs + i * ro, its last values at g + nc * cs + i *
 * to (packed: cs 64, ro 16, to 2 (n % 8); raw: cs 16, ro = to = the row stride), x rows from x (n values each) */
typedef struct {
    const uint8_t *g;
    size_t cs, ro, to;
    const float *x;
    int64_t n;
} pf_rows;

/* chunks [c0, c1) of weight rows i0 .. i0+nv-1 against nr x rows: acc[i][r] += w * x, chunk by chunk. Per chunk the
 * nr x vectors live, each weight row converted and used at once. pf: prefetch dist bytes ahead (T1, one line per
 * chunk of a packed group; raw rows: CUCA_PREFETCH into L1, one line per 4 chunks). */
static inline __attribute__((always_inline)) void pf_run(const int wt, const pf_rows *W, const int nr, const int i0,
                                                         const int nv, int64_t c0, int64_t c1, const int pf,
                                                         __m256 acc[][PF_T]) {
    const int dist = nr > 1 ? PF_PF2 : PF_PF1;
    for (int64_t c = c0; c < c1; c++) {
        const uint8_t *p = W->g + (size_t)c * W->cs + (size_t)i0 * W->ro;
        if (pf == 1) {
            PK_PREFETCH(p + dist); /* a chunk of the 4 rows: one 64-byte line */
        } else if (pf == 2 && !(c & 3)) {
            for (int i = 0; i < nv; i++) _mm_prefetch((const char *)p + (size_t)i * W->ro + CUCA_PREFETCH, _MM_HINT_T0);
        }
        __m256 xv[PF_T];
        #pragma GCC unroll 6
        for (int r = 0; r < nr; r++) {
            xv[r] = _mm256_loadu_ps(W->x + r * W->n + 8 * c);
            PK_KEEP(xv[r]); /* in a register: GCC would fold a load into every fma */
        }
        #pragma GCC unroll 4
        for (int i = 0; i < nv; i++) {
            const __m256 w = pf_load(wt, p + (size_t)i * W->ro);
            #pragma GCC unroll 6
            for (int r = 0; r < nr; r++) acc[i][r] = _mm256_fmadd_ps(w, xv[r], acc[i][r]);
        }
    }
}

/* the sums of weight rows i0 .. i0+nv-1: the fixed horizontal sum, the last n % 8 products, out[r * ldo + i] */
static inline __attribute__((always_inline)) void pf_store(const int wt, const pf_rows *W, const int nr,
                                                           const int i0, const int nv, __m256 acc[][PF_T],
                                                           float *out, int64_t ldo) {
    const int64_t nc = W->n / 8;
    const uint8_t *tl = W->g + (size_t)nc * W->cs;
    #pragma GCC unroll 4
    for (int i = 0; i < nv; i++)
        #pragma GCC unroll 6
        for (int r = 0; r < nr; r++) {
            float s = cuca_hsum256(acc[i][r]);
            for (int64_t j = 8 * nc; j < W->n; j++)
                s = fmaf(pf_scalar(wt, tl + (size_t)(i0 + i) * W->to + 2 * (size_t)(j - 8 * nc)), W->x[r * W->n + j], s);
            out[r * ldo + i0 + i] = s;
        }
}

#define PF_KB 32 /* chunks per run of the two-sweep tile (2 KiB of a packed group) */

/* nv (1..4) weight rows of a group against x rows m0 .. m0+nr-1: out[r * ldo + i]. One sweep where PF_W(nr) covers
 * the group; else (AVX2, 4 x rows) rows 0-1 then rows 2-3 over each run of PF_KB chunks, the second pass from L1, so
 * that the prefetches keep one even pace: two sweeps of the whole group (F16 5632x2048 at M = 4, from memory, 2
 * threads, AVX2 build on Zen 4) ran 0.72x the time of the old 3 + 1 row passes, these runs 0.44-0.49x; the stream
 * stalled through each whole second sweep */
static inline __attribute__((always_inline)) void pf_tile(const int wt, const uint8_t *g, const int packed,
                                                          size_t rs, const cuca_act *A, int64_t m0, const int nr,
                                                          float *out, int64_t ldo, const int nv) {
    const int64_t n = A->n_in, nc = n / 8;
    const pf_rows W = {g, packed ? 16 * PF_R : 16, packed ? 16 : rs, packed ? 2 * (size_t)(n % 8) : rs,
                       A->xf + m0 * n, n};
    const int pf = packed ? 1 : 2;
    if (PF_W(nr) >= nv) {
        __m256 acc[PF_R][PF_T];
        #pragma GCC unroll 4
        for (int i = 0; i < nv; i++)
            #pragma GCC unroll 6
            for (int r = 0; r < nr; r++) acc[i][r] = _mm256_setzero_ps();
        pf_run(wt, &W, nr, 0, nv, 0, nc, pf, acc);
        pf_store(wt, &W, nr, 0, nv, acc, out, ldo);
        return;
    }
    const int nv1 = nv - 2; /* rows 2 .. nv-1 */
    __m256 a0[2][PF_T], a1[2][PF_T];
    #pragma GCC unroll 6
    for (int r = 0; r < nr; r++) a0[0][r] = a0[1][r] = a1[0][r] = a1[1][r] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < nc; c0 += PF_KB) {
        const int64_t c1 = c0 + PF_KB < nc ? c0 + PF_KB : nc;
        pf_run(wt, &W, nr, 0, 2, c0, c1, pf, a0);
        if (nv1 == 2) pf_run(wt, &W, nr, 2, 2, c0, c1, packed ? 0 : 2, a1); /* packed: lines already fetched */
        else pf_run(wt, &W, nr, 2, 1, c0, c1, packed ? 0 : 2, a1);
    }
    pf_store(wt, &W, nr, 0, 2, a0, out, ldo);
    if (nv1 == 2) pf_store(wt, &W, nr, 2, 2, a1, out, ldo);
    else pf_store(wt, &W, nr, 2, 1, a1, out, ldo);
}

#define PF_NV(wt, n, v) case v: pf_tile(wt, g, packed, rs, A, m0, n, out, ldo, v); break;
#define PF_CASE(wt, n) \
    case n: if (n <= PF_T) switch (nv) { PF_NV(wt, n, 1) PF_NV(wt, n, 2) PF_NV(wt, n, 3) PF_NV(wt, n, 4) default: break; } \
        break;
/* packed group (packed 1) or raw rows at stride rs: one kernel, so a row's result never depends on its storage */
#define PF_FNS(name, wt)                                                                                         \
    static inline __attribute__((always_inline)) void name##_any(                                               \
        const uint8_t *g, const int packed, size_t rs, const cuca_act *A, int64_t m0, int nr, float *out,         \
        int64_t ldo, int nv) {                                                                                   \
        switch (nr) { PF_CASE(wt, 1) PF_CASE(wt, 2) PF_CASE(wt, 3) PF_CASE(wt, 4) PF_CASE(wt, 5) PF_CASE(wt, 6)   \
                      default: break; }                                                                           \
    }                                                                                                            \
    static void name##_packed(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out,   \
                              int64_t ldo, int nv) {                                                             \
        (void)nb;                                                                                                \
        name##_any(g, 1, 0, A, m0, nr, out, ldo, nv);                                                            \
    }                                                                                                            \
    static void name##_raw(const uint8_t *w, size_t rb, int nw, const cuca_act *A, int64_t m0, int nr, float *out, \
                           int64_t ldo) {                                                                        \
        for (int i = 0; i < nw; i += PF_R)                                                                       \
            name##_any(w + (size_t)i * rb, 0, rb, A, m0, nr, out + i, ldo, nw - i < PF_R ? nw - i : PF_R);      \
    }
PF_FNS(pf_f16, GT_F16)
PF_FNS(pf_bf16, GT_BF16)
#endif

int cuca_pf_pack(const void *w, int64_t n_out, int64_t n_in, void *dst) {
    if (n_out <= 0 || n_in <= 0) return CUCA_EINVAL;
    const size_t rb = 2 * (size_t)n_in, nc = (size_t)n_in / 8, t = 2 * ((size_t)n_in % 8);
    const uint8_t *src = (const uint8_t *)w;
    uint8_t *out = (uint8_t *)dst;
    const int64_t ng = n_out / PF_R;
    for (int64_t g = 0; g < ng; g++) {
        const uint8_t *rows = src + (size_t)g * PF_R * rb;
        uint8_t *o = out + (size_t)g * PF_R * rb;
        for (int i = 0; i < PF_R; i++) {
            for (size_t c = 0; c < nc; c++) memcpy(o + 16 * (PF_R * c + (size_t)i), rows + (size_t)i * rb + 16 * c, 16);
            memcpy(o + 16 * PF_R * nc + (size_t)i * t, rows + (size_t)i * rb + 16 * nc, t);
        }
    }
    memcpy(out + (size_t)ng * PF_R * rb, src + (size_t)ng * PF_R * rb, (size_t)(n_out - ng * PF_R) * rb);
    return CUCA_OK;
}

int cuca_tile_pf(int wtype, cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile) {
#if defined(CUCA_AVX2) || defined(CUCA_AVX512)
    if (wtype != GT_F16 && wtype != GT_BF16) return CUCA_EUNSUPPORTED;
    if (packed) *packed = wtype == GT_F16 ? pf_f16_packed : pf_bf16_packed;
    if (raw) *raw = wtype == GT_F16 ? pf_f16_raw : pf_bf16_raw;
    *tile = PF_T;
    return CUCA_OK;
#else
    (void)wtype; (void)packed; (void)raw; (void)tile;
    return CUCA_EUNSUPPORTED;
#endif
}
