/* Row-interleaved ("packed") F16 / BF16 weights against float32 x, AVX2 build: a register tile of 4 weight rows
 * x up to 3 x rows (12 accumulators, 3 x vectors, 1 weight vector: the 16 registers), so each 8-value chunk of
 * x loaded feeds 4 rows and each converted weight chunk 3 x rows: 0.58 loads per fma, where the one-row tile of
 * matmul.c loaded 1.25 and swept 4 rows of x (24-48 KiB: past L1) per weight row.
 *
 * Layout (same size as the raw tensor): rows in groups of 4; per group, chunk c (values 8c .. 8c+7) of rows 0..3
 * side by side (one 64-byte line), then the n_in % 8 last values of row 0, 1, 2, 3. The n_out % 4 last rows
 * stay raw. Raw rows (those, and every raw F16 / BF16 matmul of this build: cuca_tile_q hands out pf_*_raw) run
 * the same kernel on the rows where they lie.
 *
 * Per (weight row, x row) the float sequence is fixed: one 8-lane accumulator acc += w_c * x_c chunk by chunk,
 * a fixed horizontal sum, then the last n_in % 8 products by fmaf in order, whatever the tile height, the row's
 * group or where it is stored: batch invariant. */
#include <math.h>
#include "packed.h"

#if defined(CUCA_AVX2)
#define PF_T 3
/* packed bytes prefetched this far ahead (T1): 2 KiB (PK_PF) left M = 1 1.13-1.18x the time of the one-row kernel
 * (5632x2048 and 2048x5632, 12 copies, 2 threads, Zen 3); 1 KiB 0.90-0.94x the time of 2 KiB (on par with it),
 * 512 / 768 bytes on par with 1 KiB */
#define PF_PF 1024

static inline __attribute__((always_inline)) __m256 pf_load(const int wt, const uint8_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (wt == GT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __attribute__((always_inline)) float pf_scalar(const int wt, const uint8_t *p) {
    return wt == GT_F16 ? cuca_h2f(cuca_ld16(p)) : cuca_bf2f(cuca_ld16(p));
}

/* nv (1..4) weight rows, chunk c of row i at g + c * cs + i * ro, its last values at g + nc * cs + i * to (packed:
 * cs 64, ro 16, to 2 (n % 8); raw: cs 16, ro = to = the row stride) against x rows m0 .. m0+nr-1:
 * out[r * ldo + i]. Per chunk: nr x vectors live, each weight row converted and used at once (4 x 3 accumulators
 * + 3 x + 1 weight: the 16 registers). */
static inline __attribute__((always_inline)) void pf_tile(const int wt, const uint8_t *g, const int packed,
                                                          size_t rs, const cuca_act *A, int64_t m0, const int nr,
                                                          float *out, int64_t ldo, const int nv) {
    const int64_t n = A->n_in, nc = n / 8;
    const size_t cs = packed ? 16 * PF_R : 16, ro = packed ? 16 : rs, to = packed ? 2 * (size_t)(n % 8) : rs;
    const float *x = A->xf + m0 * n;
    __m256 acc[PF_R][PF_T];
    #pragma GCC unroll 4
    for (int i = 0; i < nv; i++)
        #pragma GCC unroll 3
        for (int r = 0; r < nr; r++) acc[i][r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nc; c++) {
        const uint8_t *p = g + (size_t)c * cs;
        if (packed) {
            _mm_prefetch((const char *)p + PF_PF, _MM_HINT_T1); /* a chunk of the 4 rows: one 64-byte line */
        } else if (!(c & 3)) {
            for (int i = 0; i < nv; i++) _mm_prefetch((const char *)p + (size_t)i * ro + CUCA_PREFETCH, _MM_HINT_T0);
        }
        __m256 xv[PF_T];
        #pragma GCC unroll 3
        for (int r = 0; r < nr; r++) {
            xv[r] = _mm256_loadu_ps(x + r * n + 8 * c);
            PK_KEEP(xv[r]); /* in a register: GCC would fold a load into every fma */
        }
        #pragma GCC unroll 4
        for (int i = 0; i < nv; i++) {
            const __m256 w = pf_load(wt, p + (size_t)i * ro);
            #pragma GCC unroll 3
            for (int r = 0; r < nr; r++) acc[i][r] = _mm256_fmadd_ps(w, xv[r], acc[i][r]);
        }
    }
    const uint8_t *tl = g + (size_t)nc * cs;
    #pragma GCC unroll 4
    for (int i = 0; i < nv; i++)
        #pragma GCC unroll 3
        for (int r = 0; r < nr; r++) {
            float s = cuca_hsum256(acc[i][r]);
            for (int64_t j = 8 * nc; j < n; j++)
                s = fmaf(pf_scalar(wt, tl + (size_t)i * to + 2 * (size_t)(j - 8 * nc)), x[r * n + j], s);
            out[r * ldo + i] = s;
        }
}

#define PF_NV(wt, n, v) case v: pf_tile(wt, g, packed, rs, A, m0, n, out, ldo, v); break;
#define PF_CASE(wt, n) \
    case n: switch (nv) { PF_NV(wt, n, 1) PF_NV(wt, n, 2) PF_NV(wt, n, 3) PF_NV(wt, n, 4) default: break; } break;
/* packed group (packed 1) or raw rows at stride rs: one kernel, so a row's result never depends on its storage */
#define PF_FNS(name, wt)                                                                                         \
    static inline __attribute__((always_inline)) void name##_any(                                               \
        const uint8_t *g, const int packed, size_t rs, const cuca_act *A, int64_t m0, int nr, float *out,         \
        int64_t ldo, int nv) {                                                                                   \
        switch (nr) { PF_CASE(wt, 1) PF_CASE(wt, 2) PF_CASE(wt, 3) default: break; }                             \
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
#if defined(CUCA_AVX2)
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
