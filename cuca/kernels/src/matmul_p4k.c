/* Row-interleaved ("packed") Q4_K weights against Q8_K activations: R weight rows (cuca_pack_rows: 8 on AVX2, 16
 * on AVX-512, below) share one vector, one int32 lane per row, so one broadcast activation dword feeds R output
 * rows. AVX2 (natural codes and 16 half-group sums: cuca_qk_layout 0): each lane sums a whole 32-value group in
 * int16 before the group's 6-bit scale is applied: per group and x row 8 maddubs, 7 adds and one madd for 8 rows
 * (the raw kernel, matmul_k.c, spends a maddubs and a madd on each 32 values of one row).
 *
 * Layout (same size as the raw tensor): rows in groups of R; per superblock of a group R x 144 bytes: the rows' fp16
 * d (2R bytes), their fp16 dmin (2R), dword s < 3 of their 12 scale bytes side by side (3 x 4R), then dword t < 8 of
 * qs chunk k < 4 side by side (32 x 4R bytes; low nibbles: values 64k + 4t .. +3, high: 64k + 32 + 4t ..). The
 * n_out % R last rows follow raw; raw rows run the same kernel on the same vectors, transposed as they are loaded.
 *
 * Per (weight row, x row) and superblock the exact integer sums isum = sum_j sc_j * sum(code * a) and
 * imin = sum_j m_j * sum(a) (|.| < 2^25), then acc += float(isum) * (d * da), accm += float(imin) * (dmin * da)
 * superblock by superblock in one lane, out = acc - accm: batch invariant, and the same wherever the row is stored.
 * Groups of 16 rows read as two 8-row halves sharing each activation broadcast (matmul_p2.c's Q4_0 form) were
 * measured and dropped: one thread in L2 (Zen 3), cycles per 8-row superblock 119 / 175 / ~300 / 367 at 1 / 2 / 3 /
 * 4 x rows against 132 / 180 / ~258 / 296: the halves' int32 sums and scale vectors spill at 3-4 rows. */
#include "packed.h"

#define P4_SB 1152 /* packed bytes of a group's superblock: 8 rows x 144 */
#define P4_BYTES 144

/* raw rows: the fp16 d and dmin of R rows (row i at cb + i * rb; rows >= nv repeat row nv - 1), laid out as packed */
static inline void p4_raw_d(uint8_t *buf, const uint8_t *cb, size_t rb, int nv, const int R) {
    for (int i = 0; i < R; i++) {
        const uint8_t *row = cb + (size_t)(i < nv ? i : nv - 1) * rb;
        memcpy(buf + 2 * i, row, 2);
        memcpy(buf + 2 * R + 2 * i, row + 2, 2);
    }
}

int cuca_p4k_pack(const void *w, int64_t n_out, int64_t n_in, void *dst) {
    const int R = cuca_pack_rows(GT_Q4_K);
    if (n_out <= 0 || n_in <= 0 || n_in % QKK || R < 8) return CUCA_EINVAL;
    const int64_t nb = n_in / QKK, ng = n_out / R;
    const size_t rb = (size_t)nb * P4_BYTES, gb = rb * (size_t)R, sbb = (size_t)R * P4_BYTES;
    const uint8_t *src = (const uint8_t *)w;
    uint8_t *out = (uint8_t *)dst;
    for (int64_t g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + g * gb + (size_t)b * sbb;
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = src + (size_t)(g * R + r) * rb + (size_t)b * P4_BYTES;
                memcpy(o + 2 * r, blk, 2);               /* d */
                memcpy(o + 2 * R + 2 * r, blk + 2, 2);   /* dmin */
                for (int s = 0; s < 3; s++) memcpy(o + 4 * R + 4 * R * s + 4 * r, blk + 4 + 4 * s, 4);
                for (int u = 0; u < 32; u++) memcpy(o + 16 * R + 4 * R * u + 4 * r, blk + 16 + 4 * u, 4);
            }
        }
    memcpy(out + ng * gb, src + ng * gb, (size_t)(n_out - ng * R) * rb);
    return CUCA_OK;
}

#if defined(CUCA_AVX2)
#define P4_T 4

/* The 8 groups' 6-bit scales sc[j] and mins mn[j] as int16 pairs (v, v) per row lane, from dwords d0..d2 of the
 * rows' 12 scale bytes (the K-quant packing: k4_scales in qmatmul.h). One pshufb puts byte j of each lane in both of
 * its int16 halves: 13 operations per j instead of 22 by shifts and ors; the same bits, Q4_K 512 x 1536 one thread
 * 0.85-0.93x the time at M = 1-4, the report's all-Q4_K model 0.98 / 0.98 / 0.96 / 0.94x per pass at M = 1 / 2 / 4 /
 * 8, Gemma 3 270M on par (AVX2 Zen 2, 2 threads, cuca vs cuca alternated in one process). */
static inline __attribute__((always_inline)) void p4_scales(const uint8_t *v, __m256i *sc, __m256i *mn) {
    const __m256i d0 = _mm256_loadu_si256((const __m256i *)v), d1 = _mm256_loadu_si256((const __m256i *)(v + 32));
    const __m256i d2 = _mm256_loadu_si256((const __m256i *)(v + 64));
    const __m256i m6 = _mm256_set1_epi16(63), m4 = _mm256_set1_epi16(15), hi2 = _mm256_set1_epi16(0x30);
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++) { /* byte j of each lane's dword into both of its int16 halves (high bytes 0) */
        const __m256i lane = _mm256_setr_epi32(0, 0x40004, 0x80008, 0xC000C, 0, 0x40004, 0x80008, 0xC000C);
        const int cj = (int)(0x80008000u | (unsigned)j << 16 | (unsigned)j); /* bytes j, zero, j, zero */
        const __m256i sel = _mm256_add_epi8(_mm256_set1_epi32(cj), lane);
        const __m256i x0 = _mm256_shuffle_epi8(d0, sel), x1 = _mm256_shuffle_epi8(d1, sel);
        const __m256i x2 = _mm256_shuffle_epi8(d2, sel);
        sc[j] = _mm256_and_si256(x0, m6);
        mn[j] = _mm256_and_si256(x1, m6);
        sc[j + 4] = _mm256_or_si256(_mm256_and_si256(x2, m4), _mm256_and_si256(_mm256_srli_epi16(x0, 2), hi2));
        mn[j + 4] = _mm256_or_si256(_mm256_srli_epi16(x2, 4), _mm256_and_si256(_mm256_srli_epi16(x1, 2), hi2));
    }
}

/* Superblock sb of 8 rows (v: its 1152 bytes in the packed layout) for nr x rows. Per group the 8 code/activation
 * products summed in int16 (|sum| <= 8 * 2 * 15 * 127 < 2^15: exact in any order), then one madd by the scale. */
static inline __attribute__((always_inline)) void p4_sb(const uint8_t *v, int64_t sb, const int nr,
                                                        const int8_t *const *q, const int16_t *const *bs,
                                                        const float *const *d, __m256 *acc, __m256 *accm) {
    __m256i sc[8], mn[8], isum[P4_T];
    p4_scales(v + 32, sc, mn);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)v));
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + 16)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) { /* group j: values 32j.., the low (even j) or high nibbles of chunk j / 2 */
        __m256i p[P4_T];
        #pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            const __m256i c = _mm256_loadu_si256((const __m256i *)(v + 128 + 32 * (8 * (j >> 1) + t)));
            const __m256i u = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(c, 4), m4) : _mm256_and_si256(c, m4);
            #pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const __m256i x = _mm256_maddubs_epi16(u, _mm256_set1_epi32(ld_i32(q[r] + QKK * sb + 32 * j + 4 * t)));
                p[r] = t ? _mm256_add_epi16(p[r], x) : x;
                if (nr > 1) PK_KEEP(p[r]);
            }
        }
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], sc[j]));
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) { /* dword j of the bs area: the int16 sums of group j's two halves */
        const int16_t *h = bs[r] + 32 * sb;
        __m256i im = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(ld_i32(h)));
        #pragma GCC unroll 8
        for (int j = 1; j < 8; j++) im = _mm256_add_epi32(im, _mm256_madd_epi16(mn[j], _mm256_set1_epi32(ld_i32(h + 2 * j))));
        const __m256 da = _mm256_set1_ps(d[r][sb]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, da), acc[r]);
        accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(mw, da), accm[r]);
    }
}

/* One group of 8 weight rows (packed, or raw rows at stride rb != 0): out[r * ldo + i] for rows i < nv. */
static inline __attribute__((always_inline)) void p4_group(const uint8_t *g, int64_t nb, const cuca_act *A,
                                                           int64_t m0, const int nr, float *out, int64_t ldo, int nv,
                                                           const size_t rb) {
    uint8_t buf[P4_SB] __attribute__((aligned(32)));
    __m256 acc[P4_T], accm[P4_T];
    const int8_t *q[P4_T];
    const int16_t *bs[P4_T];
    const float *d[P4_T];
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        acc[r] = accm[r] = _mm256_setzero_ps();
        q[r] = ACT_QS(A, m0 + r);
        bs[r] = ACT_BS(A, m0 + r);
        d[r] = ACT_D(A, m0 + r);
    }
    for (int64_t sb = 0; sb < nb; sb++) {
        if (rb) { /* raw rows: the same vectors, row i at cb + i * rb (rows >= nv repeat row nv - 1) */
            const uint8_t *cb = g + (size_t)sb * P4_BYTES;
            /* the next group of rows a slice per superblock (matmul_p6.c: R raw streams leave the prefetchers behind) */
            const uint8_t *nx = g + (size_t)PK_R * rb + (size_t)sb * PK_R * P4_BYTES;
            for (int o = 0; o < PK_R * P4_BYTES; o += 64) PK_PREFETCH(nx + o);
            p4_raw_d(buf, cb, rb, nv, 8);
            __m256i t[4];
            pk_rows8(cb + 4, rb, nv, t); /* the 12 scale bytes (and 4 code bytes, unused) */
            for (int s = 0; s < 3; s++) _mm256_store_si256((__m256i *)(buf + 32 + 32 * s), t[s]);
            for (int k = 0; k < 8; k++) pk_rows8(cb + 16 + 16 * k, rb, nv, (__m256i *)(buf + 128 + 128 * k));
            p4_sb(buf, sb, nr, q, bs, d, acc, accm);
        } else {
            const uint8_t *v = g + (size_t)sb * P4_SB;
            #pragma GCC unroll 18
            for (int o = 0; o < P4_SB; o += 64) PK_PREFETCH(v + PK_PF_AT(GT_Q4_K, nr) + o);
            p4_sb(v, sb, nr, q, bs, d, acc, accm);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc[r] = _mm256_sub_ps(acc[r], accm[r]);
    pk_store8(out, ldo, nr, nv, acc);
}

#define P4_CASE(n) case n: p4_group(g, nb, A, m0, n, out, ldo, nv, rb); break;
/* packed group (rb == 0) or raw rows at stride rb: one kernel, so a row's result never depends on its storage */
static void p4_any(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo,
                   int nv, size_t rb) {
    switch (nr) { P4_CASE(1) P4_CASE(2) P4_CASE(3) P4_CASE(4) default: break; }
}
PK_ENTRY_POINTS(p4_any)
#endif

#if defined(CUCA_AVX512)
/* AVX-512: the same layout with R = 16 (2304 bytes per superblock of a group: d 32, dmin 32, the scale dwords 3 x 64,
 * the code dwords 32 x 64), one int32 lane per row; per group and x row 8 dpbusd give the exact code . activation sums
 * of the 16 rows (|.| <= 32 * 15 * 127), times the group's scale by vpmulld into isum; the per-superblock float step as
 * on AVX2. The one-row kernels it replaces (matmul_k.c's raw Q4_K tile, and 1ecbbd9's in-place form, now Q5_K's) did a
 * superblock's scale work per row: against that in-place form, one thread in L2 (1024 x 2048, Zen 4) 0.63 / 0.75 / 0.72
 * / 0.73 / 0.83x the time at M = 1 / 2 / 3 / 4 / 8; the all-Q4_K 4-layer passes 0.89-0.92 / 0.80 / 0.76 / 0.74-0.81 /
 * 0.74x (2 threads, cuca vs cuca in one process). The float sequence differs from those (one float step per superblock,
 * not per lane sum): Q4_K results moved by rounding (max 1.7e-7 of the largest output), batch invariant as before. */
#define P4Z_T 4
#define P4Z_SB (16 * P4_BYTES)
/* 3+ x rows prefetch the group's stream 8 KiB ahead into L2: 2048 x 5632 from memory at M = 4 1.11-1.12x the time
 * of the in-place form without, 0.74-0.80x with; at M = 1 / 2 on par either way (1.01-1.03 / 0.94-1.02x), left to the
 * hardware as matmul_p.c does on AMD */
#define P4Z_PF 8192
#define P4Z_PF_ROWS 3

/* group j's 6-bit scale (mins: mn = 1) of the 16 rows, from their scale dwords at v + 64 (the K-quant packing,
 * k4_scales), read from memory where needed so that few vectors stay live */
static inline __attribute__((always_inline)) __m512i p4z_scale(const uint8_t *v, const int j, const int mn) {
    const __m512i m6 = _mm512_set1_epi32(63), m4 = _mm512_set1_epi32(15), hi2 = _mm512_set1_epi32(0x30);
    const __m512i dl = _mm512_loadu_si512(v + 64 + 64 * mn), d2 = _mm512_loadu_si512(v + 192);
    if (j < 4) return _mm512_and_si512(_mm512_srli_epi32(dl, 8 * j), m6);
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(d2, 8 * (j - 4) + 4 * mn), m4),
                           _mm512_and_si512(_mm512_srli_epi32(dl, 8 * (j - 4) + 2), hi2));
}

static inline __attribute__((always_inline)) void p4z_sb(const uint8_t *v, int64_t sb, const int nr,
                                                         const int8_t *const *q, const float *const *bsf,
                                                         const float *const *d, __m512 *acc, __m512 *accm) {
    const __m512i n4b = _mm512_set1_epi8(0x0F);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)v));
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 32)));
    /* the mins: imin = sum_j mn_j * (sum of group j's activations, an exact integer: lane 2j of the bs floats) */
    __m512i isum[P4Z_T];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m512i mn = p4z_scale(v, j, 1);
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m512i t = _mm512_mullo_epi32(mn, _mm512_set1_epi32((int32_t)bsf[r][16 * sb + 2 * j]));
            isum[r] = j ? _mm512_add_epi32(isum[r], t) : t;
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(mw, _mm512_set1_ps(d[r][sb])), accm[r]);
        isum[r] = _mm512_setzero_si512();
    }
    /* one or two x rows: two chains per group, as the dpbusd latency bounds them (matmul_p.c) */
    const int nc = nr <= 2 ? 2 : 1;
    #pragma GCC unroll 4
    for (int p = 0; p < 4; p++) { /* code chunk p: low nibbles group 2p, high nibbles group 2p + 1 */
        __m512i slo[2 * P4Z_T], shi[2 * P4Z_T];
        #pragma GCC unroll 8
        for (int r = 0; r < nc * nr; r++) slo[r] = shi[r] = _mm512_setzero_si512();
        #pragma GCC unroll 8
        for (int t = 0; t < 8; t++) { /* values 4t .. 4t+3 of both groups; activation layout 1 (matmul_k.c) */
            const __m512i c = _mm512_loadu_si512(v + 256 + 64 * (8 * p + t));
            const __m512i lo = _mm512_and_si512(c, n4b), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), n4b);
            const int off = 64 * (t >> 1) + 4 * (t & 1), k = nc == 2 ? t & 1 : 0;
            #pragma GCC unroll 4
            for (int r = 0; r < nr; r++) {
                const int8_t *a = q[r] + QKK * sb + off;
                slo[nc * r + k] = _mm512_dpbusd_epi32(slo[nc * r + k], lo, _mm512_set1_epi32(ld_i32(a + 16 * p)));
                shi[nc * r + k] = _mm512_dpbusd_epi32(shi[nc * r + k], hi, _mm512_set1_epi32(ld_i32(a + 16 * p + 8)));
            }
        }
        const __m512i s0 = p4z_scale(v, 2 * p, 0), s1 = p4z_scale(v, 2 * p + 1, 0);
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m512i lo = slo[nc * r], hi = shi[nc * r];
            if (nc == 2) lo = _mm512_add_epi32(lo, slo[nc * r + 1]), hi = _mm512_add_epi32(hi, shi[nc * r + 1]);
            isum[r] = _mm512_add_epi32(isum[r],
                                       _mm512_add_epi32(_mm512_mullo_epi32(lo, s0), _mm512_mullo_epi32(hi, s1)));
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dw, _mm512_set1_ps(d[r][sb])), acc[r]);
}

/* One group of 16 weight rows (packed, or raw rows at stride rb != 0): out[r * ldo + i] for rows i < nv. */
static inline __attribute__((always_inline)) void p4z_group(const uint8_t *g, int64_t nb, const cuca_act *A,
                                                            int64_t m0, const int nr, float *out, int64_t ldo, int nv,
                                                            const size_t rb) {
    uint8_t buf[P4Z_SB] __attribute__((aligned(64)));
    __m512 acc[P4Z_T], accm[P4Z_T];
    const int8_t *q[P4Z_T];
    const float *bsf[P4Z_T], *d[P4Z_T];
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        acc[r] = accm[r] = _mm512_setzero_ps();
        q[r] = ACT_QS(A, m0 + r);
        bsf[r] = (const float *)ACT_BS(A, m0 + r);
        d[r] = ACT_D(A, m0 + r);
    }
    for (int64_t sb = 0; sb < nb; sb++) {
        if (rb) { /* raw rows: the same vectors, row i at cb + i * rb (rows >= nv repeat row nv - 1) */
            const uint8_t *cb = g + (size_t)sb * P4_BYTES;
            p4_raw_d(buf, cb, rb, nv, 16);
            __m512i t[4];
            pk_rows16(cb + 4, rb, nv, t); /* the 12 scale bytes (and 4 code bytes, unused) */
            for (int s = 0; s < 3; s++) _mm512_store_si512(buf + 64 + 64 * s, t[s]);
            for (int k = 0; k < 8; k++) pk_rows16(cb + 16 + 16 * k, rb, nv, (__m512i *)(buf + 256 + 256 * k));
            p4z_sb(buf, sb, nr, q, bsf, d, acc, accm);
        } else {
            const uint8_t *v = g + (size_t)sb * P4Z_SB;
            if (nr >= P4Z_PF_ROWS)
                for (int o = 0; o < P4Z_SB; o += 64) PK_PREFETCH(v + P4Z_PF + o);
            p4z_sb(v, sb, nr, q, bsf, d, acc, accm);
        }
    }
    const __mmask16 mk = (__mmask16)(nv >= 16 ? 0xFFFF : (1u << nv) - 1);
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) _mm512_mask_storeu_ps(out + r * ldo, mk, _mm512_sub_ps(acc[r], accm[r]));
}

#define P4Z_CASE(n, rbv) case n: p4z_group(g, nb, A, m0, n, out, ldo, nv, rbv); break;
/* packed group (rb == 0) or raw rows at stride rb: one kernel (compiled apart for each), so a row's result never
 * depends on its storage */
static void p4z_any(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo,
                    int nv, size_t rb) {
    if (rb == 0)
        switch (nr) { P4Z_CASE(1, 0) P4Z_CASE(2, 0) P4Z_CASE(3, 0) P4Z_CASE(4, 0) default: break; }
    else
        switch (nr) { P4Z_CASE(1, rb) P4Z_CASE(2, rb) P4Z_CASE(3, rb) P4Z_CASE(4, rb) default: break; }
}
PK_ENTRY_POINTS(p4z_any)
#endif

int cuca_tile_p4k(cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile) {
#if defined(CUCA_AVX2)
    if (packed) *packed = p4_any_packed;
    if (raw) *raw = p4_any_raw;
    *tile = P4_T;
    return CUCA_OK;
#elif defined(CUCA_AVX512)
    if (packed) *packed = p4z_any_packed;
    if (raw) *raw = p4z_any_raw;
    *tile = P4Z_T;
    return CUCA_OK;
#else
    (void)packed; (void)raw; (void)tile;
    return CUCA_EUNSUPPORTED;
#endif
}
