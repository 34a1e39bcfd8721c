/* Row-interleaved ("packed") Q6_K weights against Q8_K activations, AVX2 build: R = 8 weight rows share one
 * vector, one int32 lane per row, so one broadcast activation dword feeds R output rows. (The AVX-512 build keeps
 * each Q6_K row in place, matmul_k.c: a 16-row packed form, commit 2fdff47, was faster in cache but drew 11-17% less
 * bandwidth than one row at a time on the 330 MB E2B head at 2 threads.)
 *
 * Layout (same size as the raw tensor, matmul_p.c's records with 256-value blocks): per superblock of a group of
 * R rows, dword t < 52 of its first 208 bytes (t < 32: ql, t < 48: qh, t < 52: the 16 int8 sub-block scales) of
 * rows 0..R-1 side by side, and the rows' fp16 d in the records' scale line. The n_out % R last rows follow raw;
 * raw rows run the same kernel on the same vectors, transposed from the rows as they are loaded.
 *
 * Per 16-value group g (4 code dwords per row) and x row the exact integer sum s_g = sum((code - 32) * a) is
 * scaled by the row's int8 scale_g in int32 lanes (|sum| < 2^29 per superblock: exact), then per superblock
 * acc += float(sum_g scale_g * s_g) * (d_w * d_a), superblock by superblock in one lane whatever the tile height,
 * the thread split or where the row is stored: batch invariant.
 * No VNNI: 4 maddubs (unsigned codes <= 63: pair sums <= 16002, never saturating) summed in int16 lanes
 *   with the activation's -32 * (pair sums) correction (layout 3): the true value |.| <= 8 * 32 * 127 fits, so
 *   the wrapping adds are exact; one madd by (scale_g, scale_g) folds the two halves and the scale into int32. */
#include "packed.h"

#define P6_NT 52   /* code / scale dwords per row and superblock */
#define P6_BYTES 210

#if defined(CUCA_AVX2)
#define P6_T 4
#define P6_V 32

/* pshufb controls: byte j of each dword into the high bytes of its two words (then >> 8: (scale, scale) int16) */
static const uint8_t p6_scsel[4][32] __attribute__((aligned(32))) = {
#define P6_SEL(j) {0x80, j, 0x80, j, 0x80, 4 + j, 0x80, 4 + j, 0x80, 8 + j, 0x80, 8 + j, 0x80, 12 + j, 0x80, 12 + j, \
                   0x80, j, 0x80, j, 0x80, 4 + j, 0x80, 4 + j, 0x80, 8 + j, 0x80, 8 + j, 0x80, 12 + j, 0x80, 12 + j}
    P6_SEL(0), P6_SEL(1), P6_SEL(2), P6_SEL(3)
#undef P6_SEL
};

/* The 4 code vectors of 16-value group g (u[k]: values 4k .. 4k+3, unsigned 6-bit, one row per int32 lane).
 * Packed (cuca_p6_codes' encoding): dword j < 3 of the group holds values 4j .. 4j+3 in bits 0-5 of its bytes and
 * bits 2j, 2j+1 of value 12 + i in bits 6-7 of byte i: 3 loads and 11 operations for the four vectors (the raw
 * ql / qh order, below, costs 8 loads and about 20). */
static inline __attribute__((always_inline)) void p6_codes(const uint8_t *v, const int g, const int raw,
                                                           __m256i *u) {
    if (!raw) {
        const __m256i m3f = _mm256_set1_epi8(0x3F);
        const __m256i d0 = _mm256_loadu_si256((const __m256i *)(v + P6_V * (3 * g)));
        const __m256i d1 = _mm256_loadu_si256((const __m256i *)(v + P6_V * (3 * g + 1)));
        const __m256i d2 = _mm256_loadu_si256((const __m256i *)(v + P6_V * (3 * g + 2)));
        u[0] = _mm256_and_si256(d0, m3f);
        u[1] = _mm256_and_si256(d1, m3f);
        u[2] = _mm256_and_si256(d2, m3f);
        u[3] = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(d0, 6), _mm256_set1_epi8(0x03)),
                                               _mm256_and_si256(_mm256_srli_epi16(d1, 4), _mm256_set1_epi8(0x0C))),
                               _mm256_and_si256(_mm256_srli_epi16(d2, 2), _mm256_set1_epi8(0x30)));
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const int h = g >> 3, qq = (g >> 1) & 3, s = g & 1; /* value 128h + 32qq + 16s + i */
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) { /* ql dword (4 low bits, or the high nibble from qq 2 on) | qh bits 2qq << 4 */
        __m256i L = _mm256_loadu_si256((const __m256i *)(v + P6_V * (16 * h + 8 * (qq & 1) + 4 * s + k)));
        __m256i H = _mm256_loadu_si256((const __m256i *)(v + P6_V * (32 + 8 * h + 4 * s + k)));
        if (qq >= 2) L = _mm256_srli_epi32(L, 4);
        H = qq == 0 ? _mm256_slli_epi32(H, 4) : qq == 1 ? _mm256_slli_epi32(H, 2)
          : qq == 2 ? H : _mm256_srli_epi32(H, 2);
        u[k] = _mm256_or_si256(_mm256_and_si256(L, m4), _mm256_and_si256(H, m30));
    }
}

/* 16-value group g of superblock sb (values 16g .. 16g+15, scale g) into the rows' int32 sums (integer sums: any
 * group order, same bits); keep: each row's sum kept in order (PK_KEEP) */
static inline __attribute__((always_inline)) void p6_grp(const uint8_t *v, const int raw, const int g, int64_t sb,
                                                         const int nr, const int8_t *const *q,
                                                         const int32_t *const *bs, __m256i *isum, const uint8_t *pf,
                                                         const int keep) {
    const __m256i sv = _mm256_loadu_si256((const __m256i *)(v + P6_V * (48 + (g >> 2))));
    const __m256i sc = _mm256_srai_epi16(
        _mm256_shuffle_epi8(sv, _mm256_load_si256((const __m256i *)p6_scsel[g & 3])), 8);
    __m256i u[4];
    p6_codes(v, g, raw, u);
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        const int8_t *a = q[r] + QKK * sb + 16 * g; /* natural order */
        __m256i p = _mm256_maddubs_epi16(u[0], _mm256_set1_epi32(ld_i32(a)));
        #pragma GCC unroll 4
        for (int k = 1; k < 4; k++)
            p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[k], _mm256_set1_epi32(ld_i32(a + 4 * k))));
        p = _mm256_add_epi16(p, _mm256_set1_epi32(bs[r][16 * sb + g]));
        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, sc));
        if (keep) PK_KEEP(isum[r]);
    }
    if (pf) { /* p6_group: 2 of the superblock's prefetch lines per group of 16 values */
        PK_PREFETCH(pf + 128 * g);
        PK_PREFETCH(pf + 128 * g + 64);
    }
}

/* Superblock sb of a group (v: its 52 code / scale vectors; raw: in the raw ql / qh order) for nr x rows; pf: NULL,
 * or 2 KiB to prefetch (T1) over its 16 groups. */
static inline __attribute__((always_inline)) void p6_sb(const uint8_t *v, const int raw, __m256 dw, int64_t sb,
                                                        const int nr, const int8_t *const *q,
                                                        const int32_t *const *bs, const float *const *d,
                                                        __m256 *acc, const uint8_t *pf) {
    __m256i isum[P6_T];
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
    /* 3-4 x rows: the group loop unrolled by 4 and each row's sum kept in order (PK_KEEP); fully unrolled, GCC
     * hoisted later groups' code vectors and spilled ~180 vectors per superblock: the 4-row superblock took 1.25x
     * the time (AVX2 Zen 3, one thread, in L2 and from memory); 1-2 rows keep the full unroll (1 row took 1.06-1.18x
     * the time unrolled by 4, 2 rows on par) */
    if (nr >= 3) {
        #pragma GCC unroll 4
        for (int g = 0; g < 16; g++) p6_grp(v, raw, g, sb, nr, q, bs, isum, pf, 1);
    } else {
        #pragma GCC unroll 16
        for (int g = 0; g < 16; g++) p6_grp(v, raw, g, sb, nr, q, bs, isum, pf, 0);
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, _mm256_set1_ps(d[r][sb])), acc[r]);
}

/* One group of 8 weight rows (packed, or raw rows at stride rb != 0): out[r * ldo + i] for rows i < nv. */
static inline __attribute__((always_inline)) void p6_group(const uint8_t *g, int64_t nb, const cuca_act *A,
                                                           int64_t m0, const int nr, float *out, int64_t ldo, int nv,
                                                           const size_t rb) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
    const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i buf[P6_NT];
    __m256 acc[P6_T];
    const int8_t *q[P6_T];
    const int32_t *bs[P6_T];
    const float *d[P6_T];
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        acc[r] = _mm256_setzero_ps();
        q[r] = ACT_QS(A, m0 + r);
        bs[r] = (const int32_t *)ACT_BS(A, m0 + r);
        d[r] = ACT_D(A, m0 + r);
    }
    for (int64_t sb = 0; sb < nb; sb++) {
        if (rb) { /* raw rows: the same vectors gathered (row i at cb + i * rb) */
            const uint8_t *cb = g + (size_t)sb * P6_BYTES;
            /* the next group of rows (contiguous, R * rb bytes) a slice per superblock: streams of R rows at
             * once leave the hardware prefetchers behind (2.5x slower than the packed stream without this) */
            const uint8_t *nx = g + (size_t)PK_R * rb + (size_t)sb * PK_R * P6_BYTES;
            for (int o = 0; o < PK_R * P6_BYTES; o += 64) PK_PREFETCH(nx + o);
            for (int j = 0; j < P6_NT / 4; j++) pk_rows8(cb + 16 * j, rb, nv, buf + 4 * j);
            /* bytes 206..209 of each row's superblock: d in the high half (never reads past the row) */
            const __m256i h = _mm256_srli_epi32(
                _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(cb + 206), idx, mk, 1), 16);
            const __m256 dw = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
            p6_sb((const uint8_t *)buf, 1, dw, sb, nr, q, bs, d, acc, NULL);
        } else {
            size_t co, so;
            pk_where(8, nb, sb, (size_t)P6_V * P6_NT, 2, &co, &so);
            /* 1-2 x rows: the superblock's prefetches spread over its groups of 16 values (p6_sb), not one burst of
             * 27: Q6_K 12288 x 1536 from memory 0.85-0.88x the time at M = 1 and 0.93-0.98x at M = 2, Gemma 4 E2B
             * decode (its 262144 x 1536 Q6_K head) 0.977x at M = 1 and 2 (AVX2 Zen 3, 2 threads, cuca vs cuca,
             * alternated in one process); at 3-4 rows on par, so they keep the burst. A tensor read from cache runs
             * 1.13-1.17x slower spread (15.5 MB reused), which decode's weight stream never is. */
            if (nr > 2) {
                #pragma GCC unroll 32
                for (int o = 0; o < 8 * P6_BYTES; o += 64) PK_PREFETCH(g + co + PK_PF + o);
            }
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + so)));
            p6_sb(g + co, 0, dw, sb, nr, q, bs, d, acc, nr > 2 ? NULL : g + co + PK_PF);
        }
    }
    pk_store8(out, ldo, nr, nv, acc);
}
#endif

#if defined(CUCA_AVX2)
#define P6_CASE(n) case n: p6_group(g, nb, A, m0, n, out, ldo, nv, rb); break;
#if P6_T == 8
#define P6_CASES P6_CASE(1) P6_CASE(2) P6_CASE(3) P6_CASE(4) P6_CASE(5) P6_CASE(6) P6_CASE(7) P6_CASE(8)
#else
#define P6_CASES P6_CASE(1) P6_CASE(2) P6_CASE(3) P6_CASE(4)
#endif
/* packed group (rb == 0) or raw rows at stride rb: one kernel, so a row's result never depends on its storage */
static void p6_any(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo,
                   int nv, size_t rb) {
    switch (nr) { P6_CASES default: break; }
}
PK_ENTRY_POINTS(p6_any)
#endif

void cuca_p6_codes(const uint8_t *blk, uint8_t *dst) {
    uint8_t x[QKK]; /* the 6-bit codes in value order (the Q6_K layout: ql nibbles, qh bit pairs) */
    for (int n = 0; n < QKK; n++) {
        const int h = n / 128, qq = n % 128 / 32, l = n % 32;
        const uint8_t lq = blk[64 * h + 32 * (qq & 1) + l], hq = blk[128 + 32 * h + l];
        x[n] = (uint8_t)((qq < 2 ? lq & 0x0F : lq >> 4) | ((hq >> (2 * qq)) & 3) << 4);
    }
    for (int g = 0; g < 16; g++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 4; i++)
                dst[4 * (3 * g + j) + i] = (uint8_t)((x[16 * g + 4 * j + i] & 0x3F) |
                                                     ((x[16 * g + 12 + i] >> (2 * j)) & 3) << 6);
    memcpy(dst + 192, blk + 192, 16); /* the sub-block scales */
}

int cuca_tile_p6(cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile) {
#if defined(CUCA_AVX2)
    if (packed) *packed = p6_any_packed;
    if (raw) *raw = p6_any_raw;
    *tile = P6_T;
    return CUCA_OK;
#elif defined(CUCA_AVX512)
    return cuca_tile_k6p(packed, raw, tile);
#else
    (void)packed; (void)raw; (void)tile;
    return CUCA_EUNSUPPORTED;
#endif
}
