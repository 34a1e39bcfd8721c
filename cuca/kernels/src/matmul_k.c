/* Tile kernels for the 256-value K formats Q5_K (all builds), Q6_K (AVX-512 and portable builds) and Q4_K
 * (portable build) against Q8_K activations; the SIMD builds run Q4_K, and AVX2 Q6_K, through the row-interleaved
 * kernels (matmul_p4k.c, matmul_p6.c), on raw rows too (cuca_tile_q hands them out), so packed and raw rows give
 * identical results. AVX-512 packs Q6_K and Q5_K in place (k6p_tile, k5p_tile: each superblock's bytes reordered,
 * pack_k.c; Q6_K rows run in pairs); raw rows keep q6k_tile / q5k_tile's raw form, which give the same bits.
 *
 * Every integer partial sum is exact; only its float scaling is ordered, the same for each x row in every tile.
 * AVX-512: one zmm holds a whole superblock, with 2 lanes per 32-value group (Q5_K) or 1 lane per
 *   16-value group (Q6_K), so four dpbusd leave per-group sums in the lanes. Per x row and superblock
 *   acc += (sumi lanes * (dw * scale_g) [+ group sums * (-dmin * min_g)]) * da; Q6_K's code offset 32 seeds
 *   the integer sums as -32 * bsum_g. One horizontal sum at the end.
 * AVX2 (Q5_K): u8 x s8 pair products and 16-bit scales into 32-bit lanes (maddubs, madd) per 32 values, then per
 *   superblock acc += (sumi lanes * da) * dw and accm += (mins . bsums lanes * da) * dmin.
 * Portable C: the same per superblock with scalar integer sums. */
#include "packed.h"

#define QKB(wt) ((wt) == GT_Q4_K ? 144 : (wt) == GT_Q5_K ? 176 : 210)

#if defined(CUCA_AVX512) || defined(CUCA_AVX2)
#define QK_T 8
#else
#define QK_T 4
#endif

/* Activation layout of a superblock (the 64-byte "bs" area follows the 256 codes):
 *   0 (portable; AVX2 Q4_K/Q5_K): natural codes; bs = 16 int16 sums of 16 values, then 16 zeros.
 *   1 (AVX-512 Q4_K/Q5_K): code byte 64k + 8i + t = value 32i + 8k + t (k < 4, i < 8, t < 8);
 *     bs = 16 floats, lane 2i = sum of 32-group i, lane 2i+1 = 0.
 *   2 (AVX-512 Q6_K): code byte 64k + 4i + t = value 16i + 4k + t (k < 4, i < 16, t < 4);
 *     bs = 16 int32, lane i = -32 * sum of 16-group i (Q6_K's code offset, seeding the integer sums).
 *   3 (AVX2 Q6_K): natural codes; bs = 16 dwords, dword i = int16 pair -32 * (sum of values 16i + 4k + {0, 1},
 *     sum of values 16i + 4k + {2, 3}, k < 4): the offset in the int16 lanes of matmul_p6.c's pair sums. */
int cuca_qk_layout(int wtype) {
#if defined(CUCA_AVX512)
    return wtype == GT_Q4_K || wtype == GT_Q5_K ? 1 : wtype == GT_Q6_K ? 2 : 0;
#elif defined(CUCA_AVX2)
    return wtype == GT_Q6_K ? 3 : 0;
#else
    (void)wtype;
    return 0;
#endif
}

#if defined(CUCA_AVX512) || defined(CUCA_AVX2)
/* A row's superblocks are prefetched into L2 (T1), as the packed kernels do (packed.h), kq_pf_dist bytes ahead,
 * set once at load. AMD (Zen 4): 8 KiB, on the E2B Q6_K head (AVX-512, 2 threads, interleaved A/B) 5-8% faster at
 * M = 1 and 4 than 1 KiB ahead into L1; AVX2 Q4_K (Gemma 3) unchanged. Intel (Sapphire Rapids): 3 KiB, that head
 * 0.92x the time of 8 KiB at M = 1 (3 rounds), 0.98x at M = 4, whole E2B decode 1.03x the speed, Gemma 3 on par
 * (4 pairs; AVX-512, 2 threads, cuca vs cuca). The AVX2 build's Q5_K takes the same distances, not measured there. */
static int kq_pf_dist = 3072;
__attribute__((constructor)) static void kq_pf_init(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) kq_pf_dist = 8192;
}
static inline __attribute__((always_inline)) void kq_prefetch(const uint8_t *b, int nbytes) {
    for (int o = 0; o < nbytes; o += 64) _mm_prefetch((const char *)b + kq_pf_dist + o, _MM_HINT_T1);
}
#endif

#if defined(CUCA_AVX512)
static inline float hsum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}

static inline uint64_t cuca_ld64(const void *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* Q6_K, per x row of a tile: the four dpbusd (seeded with -32 * bsum_i) give the exact per-group sums in lane i;
 * acc += ((sumi lanes) * (dw * scale_i)) * da. u: the superblock's four code vectors (byte 4i + t of u[k] = code of
 * value 16i + 4k + t), w1: dw * scale_i in lane i. */
static inline __attribute__((always_inline)) void q6k_rows(const __m512i *u, __m512 w1, const cuca_act *A, int64_t m0,
                                                           const int nr, int64_t sb, __m512 *acc) {
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        const int8_t *a = ACT_QS(A, m0 + r) + QKK * sb;
        __m512i c0 = _mm512_dpbusd_epi32(_mm512_load_si512(ACT_BS(A, m0 + r) + 32 * sb), u[0], _mm512_load_si512(a));
        __m512i c1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[1], _mm512_load_si512(a + 64));
        c0 = _mm512_dpbusd_epi32(c0, u[2], _mm512_load_si512(a + 128));
        c1 = _mm512_dpbusd_epi32(c1, u[3], _mm512_load_si512(a + 192));
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), w1);
        acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(ACT_D(A, m0 + r)[sb]), acc[r]);
    }
}

/* dw * scale_i in lane i (the 16 int8 sub-block scales at b + 192, fp16 d at b + 208: raw and packed alike) */
static inline __m512 q6k_scales(const uint8_t *b) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192)))),
                         _mm512_set1_ps(cuca_h2f(cuca_ld16(b + 208))));
}

/* Q6_K raw rows: one zmm holds a whole superblock, lane i for 16-group i; the code vectors are gathered from ql
 * and qh by dword permutes and rotates. */
static inline __attribute__((always_inline)) void q6k_tile(const uint8_t *w, const cuca_act *A, int64_t m0,
                                                           const int nr, float *out, int64_t ldo) {
    /* for lane i = 8h + s (half h, group s): the dword of the 128 low-bit bytes / 64 high-bit bytes that holds
     * values 4k .. 4k+3 of the group, and the rotation that brings its two high bits to bits 4-5 */
    static const int32_t lidx[4][16] = {
        {0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28},
        {1, 5, 9, 13, 1, 5, 9, 13, 17, 21, 25, 29, 17, 21, 25, 29},
        {2, 6, 10, 14, 2, 6, 10, 14, 18, 22, 26, 30, 18, 22, 26, 30},
        {3, 7, 11, 15, 3, 7, 11, 15, 19, 23, 27, 31, 19, 23, 27, 31}};
    static const int32_t hidx[4][16] = {
        {0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12},
        {1, 5, 1, 5, 1, 5, 1, 5, 9, 13, 9, 13, 9, 13, 9, 13},
        {2, 6, 2, 6, 2, 6, 2, 6, 10, 14, 10, 14, 10, 14, 10, 14},
        {3, 7, 3, 7, 3, 7, 3, 7, 11, 15, 11, 15, 11, 15, 11, 15}};
    static const int32_t rot[16] = {4, 4, 2, 2, 0, 0, 30, 30, 4, 4, 2, 2, 0, 0, 30, 30};
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), rv = _mm512_loadu_si512(rot);
    __m512 acc[QK_T];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b = w + sb * QKB(GT_Q6_K);
        kq_prefetch(b, QKB(GT_Q6_K));
        const __m512i l0 = _mm512_loadu_si512(b), l1 = _mm512_loadu_si512(b + 64), qh = _mm512_loadu_si512(b + 128);
        __m512i u[4];
        for (int k = 0; k < 4; k++) {
            __m512i y = _mm512_permutex2var_epi32(l0, _mm512_loadu_si512(lidx[k]), l1);
            y = _mm512_and_si512(_mm512_mask_srli_epi32(y, 0xF0F0, y, 4), m4);
            const __m512i h = _mm512_rolv_epi32(_mm512_permutexvar_epi32(_mm512_loadu_si512(hidx[k]), qh), rv);
            u[k] = _mm512_or_si512(y, _mm512_and_si512(h, m30));
        }
        q6k_rows(u, q6k_scales(b), A, m0, nr, sb, acc);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = hsum512(acc[r]);
}

/* Q6_K packed (cuca_pack_rows 2, cuca_k6_pack): every row keeps its place and size; a superblock's 192 code
 * bytes hold the four code vectors so that shifts and masks give them: bytes [0, 64) the low nibbles of u[0]
 * (bits 0-3) and u[1] (bits 4-7), [64, 128) those of u[2] and u[3], [128, 192) the two high bits of u[0..3] at
 * bits 0-1, 2-3, 4-5, 6-7; the scales and d as raw: shifts and masks instead of dword permutes and rotates.
 * 1024x6144, 1 thread: M = 4 0.90x the time of q6k_tile, M = 1 on par; whole E2B passes 0.96x (M = 1 and 4, cuca vs
 * cuca, 2 threads). The same lane sums and float sequence as q6k_tile: bit-identical to raw rows. */
static inline __attribute__((always_inline)) void k6p_unpack(const uint8_t *b, __m512i *u) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i l0 = _mm512_loadu_si512(b), l1 = _mm512_loadu_si512(b + 64), h = _mm512_loadu_si512(b + 128);
    u[0] = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
    u[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
                           _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
    u[2] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(h, m30));
    u[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                           _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
}

static inline __attribute__((always_inline)) void k6p_tile(const uint8_t *w, const cuca_act *A, int64_t m0,
                                                           const int nr, float *out, int64_t ldo) {
    __m512 acc[QK_T];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b = w + sb * QKB(GT_Q6_K);
        kq_prefetch(b, QKB(GT_Q6_K));
        __m512i u[4];
        k6p_unpack(b, u);
        q6k_rows(u, q6k_scales(b), A, m0, nr, sb, acc);
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = hsum512(acc[r]);
}

/* Two neighbouring packed Q6_K rows (w, w + rb; cuca_pack_rows 2) for nr <= 4 x rows: each activation vector is
 * loaded once for both rows, and the two rows' dpbusd chains interleave. Per (weight row, x row) k6p_tile's
 * integer sums and float sequence: the same bits. One thread, weights in L3 (Q6_K 1024 x 1536, AVX-512 Zen 4, cuca
 * vs cuca): 0.88 / 0.84 / 0.87 / 0.88x the time of one row at a time at M = 1 / 2 / 3 / 4; at 6 and 8 x rows (two
 * passes of 4) 1.14 / 1.09x, so those keep one row at a time. */
static inline __attribute__((always_inline)) void k6p_tile2(const uint8_t *w, size_t rb, const cuca_act *A,
                                                            int64_t m0, const int nr, float *out, int64_t ldo) {
    __m512 acc0[4], acc1[4];
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b0 = w + sb * QKB(GT_Q6_K), *b1 = b0 + rb;
        kq_prefetch(b0, QKB(GT_Q6_K));
        kq_prefetch(b1, QKB(GT_Q6_K));
        __m512i u[4], v[4];
        k6p_unpack(b0, u);
        k6p_unpack(b1, v);
        const __m512 s0 = q6k_scales(b0), s1 = q6k_scales(b1);
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QKK * sb;
            const __m512i x0 = _mm512_load_si512(a), x1 = _mm512_load_si512(a + 64), x2 = _mm512_load_si512(a + 128),
                          x3 = _mm512_load_si512(a + 192), bs = _mm512_load_si512(ACT_BS(A, m0 + r) + 32 * sb);
            const __m512 da = _mm512_set1_ps(ACT_D(A, m0 + r)[sb]);
            __m512i c0 = _mm512_dpbusd_epi32(bs, u[0], x0), c1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[1], x1);
            __m512i e0 = _mm512_dpbusd_epi32(bs, v[0], x0), e1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[1], x1);
            c0 = _mm512_dpbusd_epi32(c0, u[2], x2);
            c1 = _mm512_dpbusd_epi32(c1, u[3], x3);
            e0 = _mm512_dpbusd_epi32(e0, v[2], x2);
            e1 = _mm512_dpbusd_epi32(e1, v[3], x3);
            acc0[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), s0), da, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(e0, e1)), s1), da, acc1[r]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        out[r * ldo] = hsum512(acc0[r]);
        out[r * ldo + 1] = hsum512(acc1[r]);
    }
}

/* Q5_K: one zmm holds a whole superblock, lanes 2i and 2i+1 for 32-group i, so four dpbusd give the per-group
 * sums. Per row acc += ((sumi lanes) * (dw * scale_i) + (group sums) * (-dmin * min_i)) * da.
 * Raw rows (packed 0): the code vectors gathered by qword permutes, the 5th bits by bitshuffle, the scales by
 * k4_scales. Packed in place (packed 1; cuca_pack_rows 1, cuca_k5_pack; Q4_K ran this form from 1ecbbd9 until its
 * 16-row groups): the 128 code bytes hold the four code vectors as nibbles (u[0] in bits 0-3 and u[1] in 4-7 of the
 * first 64, u[2], u[3] of the next), the 12 scale bytes the 16 6-bit fields sc0..7, mn0..7 back to back (field f at
 * bits 6f .. 6f+5), the 32 high-bit bytes the four 64-bit masks of u[k]'s 5th bits: shifts and masks, one
 * vpmultishiftqb (VBMI) and a masked add instead. Both give the same vectors into one float sequence: packed and raw
 * rows give the same bits. Packed vs raw (2 threads, from memory, cuca vs cuca in one process, Zen 4): Q5_K 2048 x
 * 5632 0.87 / 0.91 / 0.87 / 0.95x the time at M = 1 / 2 / 4 / 8, an all-Q5_K 4-layer model's passes 0.95 / 0.87 /
 * 0.88 / 0.94x; Q4_K (while it ran this form) 0.82 / 0.82 / 0.90 / 0.99x and 0.97-0.99 / 0.85 / 0.85 / 0.94x. */
static inline __attribute__((always_inline)) void q5k_tile(const int packed, const uint8_t *w, const cuca_act *A,
                                                           int64_t m0, const int nr, float *out, int64_t ldo) {
    static const int64_t qidx[4][8] = {{0, 0, 4, 4, 8, 8, 12, 12}, {1, 1, 5, 5, 9, 9, 13, 13},
                                       {2, 2, 6, 6, 10, 10, 14, 14}, {3, 3, 7, 7, 11, 11, 15, 15}};
    static const int32_t sidx[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
    static const int32_t midx[16] = {8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15};
    /* byte 8i + t of a group-interleaved vector <- bit i of qh byte t */
    static const uint8_t hsel[64] = {
        0, 8, 16, 24, 32, 40, 48, 56, 1, 9, 17, 25, 33, 41, 49, 57,
        2, 10, 18, 26, 34, 42, 50, 58, 3, 11, 19, 27, 35, 43, 51, 59,
        4, 12, 20, 28, 36, 44, 52, 60, 5, 13, 21, 29, 37, 45, 53, 61,
        6, 14, 22, 30, 38, 46, 54, 62, 7, 15, 23, 31, 39, 47, 55, 63};
    /* packed: bytes 0-15 <- sc0,sc0,sc1,sc1..sc7,sc7 (fields 0-7 in scale bytes 0-5), 16-31 <- the mins (fields 8-15
     * at bits 0-47 of bytes 6-13): vpermb picks each qword's source bytes, vpmultishiftqb each byte's bit offset */
    static const uint8_t sperm[32] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7,
                                      6, 7, 8, 9, 10, 11, 12, 13, 6, 7, 8, 9, 10, 11, 12, 13};
    static const uint8_t sbit[32] = {0, 0, 6, 6, 12, 12, 18, 18, 24, 24, 30, 30, 36, 36, 42, 42,
                                     0, 0, 6, 6, 12, 12, 18, 18, 24, 24, 30, 30, 36, 36, 42, 42};
    const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    __m512 acc[QK_T];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b = w + sb * QKB(GT_Q5_K), *qs = b + 48;
        kq_prefetch(b, QKB(GT_Q5_K));
        const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
        const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)cuca_ld32(b)));
        __m512i u[4], sc, mn; /* sc / mn: lane 2i and 2i+1 <- scale / min of group i */
        if (packed) {
            u[0] = _mm512_and_si512(q0, m4), u[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
            u[2] = _mm512_and_si512(q1, m4), u[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
            for (int k = 0; k < 4; k++) /* byte j of u[k]: its 5th bit is bit j of the k-th mask qword at b + 16 */
                u[k] = _mm512_mask_add_epi8(u[k], (__mmask64)cuca_ld64(b + 16 + 8 * k), u[k], sixteen);
            const __m256i s = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b + 4))); /* bytes 4-19 */
            const __m256i f = _mm256_and_si256(
                _mm256_multishift_epi64_epi8(_mm256_loadu_si256((const __m256i *)sbit),
                                             _mm256_permutexvar_epi8(_mm256_loadu_si256((const __m256i *)sperm), s)),
                _mm256_set1_epi8(0x3F));
            sc = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(f));
            mn = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(f, 1));
        } else {
            const __m512i hs = _mm512_loadu_si512(hsel);
            for (int k = 0; k < 4; k++) {
                const __m512i y = _mm512_permutex2var_epi64(q0, _mm512_loadu_si512(qidx[k]), q1);
                u[k] = _mm512_and_si512(_mm512_mask_srli_epi64(y, 0xAA, y, 4), m4);
                const __m512i h = _mm512_set1_epi64((long long)cuca_ld64(b + 16 + 8 * k));
                u[k] = _mm512_mask_add_epi8(u[k], _mm512_bitshuffle_epi64_mask(h, hs), u[k], sixteen);
            }
            uint64_t s8, m8;
            k4_scales(b + 4, &s8, &m8);
            const __m512i s32 = _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)m8, (long long)s8));
            sc = _mm512_permutexvar_epi32(_mm512_loadu_si512(sidx), s32);
            mn = _mm512_permutexvar_epi32(_mm512_loadu_si512(midx), s32);
        }
        const __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(sc), _mm512_broadcastss_ps(dd));
        const __m512 w2 = _mm512_mul_ps(_mm512_cvtepi32_ps(mn),
                                        _mm512_sub_ps(_mm512_setzero_ps(), _mm512_broadcastss_ps(_mm_movehdup_ps(dd))));
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QKK * sb;
            __m512i c0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], _mm512_load_si512(a));
            __m512i c1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[1], _mm512_load_si512(a + 64));
            c0 = _mm512_dpbusd_epi32(c0, u[2], _mm512_load_si512(a + 128));
            c1 = _mm512_dpbusd_epi32(c1, u[3], _mm512_load_si512(a + 192));
            __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), w1);
            t = _mm512_fmadd_ps(_mm512_load_ps((const float *)(ACT_BS(A, m0 + r) + 32 * sb)), w2, t);
            acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(ACT_D(A, m0 + r)[sb]), acc[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = hsum512(acc[r]);
}
static inline __attribute__((always_inline)) void k5p_tile(const uint8_t *w, const cuca_act *A, int64_t m0,
                                                           const int nr, float *out, int64_t ldo) {
    q5k_tile(1, w, A, m0, nr, out, ldo);
}

static inline __attribute__((always_inline)) void qk_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    if (wt == GT_Q6_K)
        q6k_tile(w, A, m0, nr, out, ldo);
    else
        q5k_tile(0, w, A, m0, nr, out, ldo);
}

#elif defined(CUCA_AVX2)
/* codes of the 32 values of group j (natural order) as unsigned bytes */
static inline __m256i k_group(const int wt, const uint8_t *b, int j) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint8_t *qs = b + (wt == GT_Q5_K ? 48 : 16) + 32 * (j >> 1);
    __m256i q = _mm256_loadu_si256((const __m256i *)qs);
    q = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
    if (wt == GT_Q5_K) {
        __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 16));
        hb = j <= 4 ? _mm256_slli_epi16(hb, 4 - j) : _mm256_srli_epi16(hb, j - 4);
        q = _mm256_or_si256(q, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
    return q;
}

static inline __attribute__((always_inline)) void qk_tile(const int wt, const uint8_t *w, const cuca_act *A,
                                                          int64_t m0, const int nr, float *out, int64_t ldo) {
    __m256 acc[QK_T], accm[QK_T];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b = w + sb * QKB(wt);
        kq_prefetch(b, QKB(wt));
        __m256i isum[QK_T];
        int16_t scl[16];
        uint64_t sc, mn;
        k4_scales(b + 4, &sc, &mn);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_set_epi64x((long long)mn, (long long)sc)); /* [sc0..7, mn0..7] */
        _mm256_storeu_si256((__m256i *)scl, sc16);
        const __m256i cf = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(sc16, 0xEE),
                                               _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9,
                                                                8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15));
        const float dw = cuca_h2f(cuca_ld16(b)), dmin = cuca_h2f(cuca_ld16(b + 2));
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) isum[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i u = k_group(wt, b, j), s = _mm256_set1_epi16(scl[j]);
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) {
                __m256i a = _mm256_load_si256((const __m256i *)(ACT_QS(A, m0 + r) + QKK * sb + 32 * j));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), s));
            }
        }
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const __m256i bs = _mm256_load_si256((const __m256i *)(ACT_BS(A, m0 + r) + 32 * sb));
            const __m256 da = _mm256_set1_ps(ACT_D(A, m0 + r)[sb]);
            const __m256i im = _mm256_madd_epi16(bs, cf);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum[r]), da), _mm256_set1_ps(dw), acc[r]);
            accm[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(im), da), _mm256_set1_ps(dmin), accm[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = cuca_hsum256(acc[r]) - cuca_hsum256(accm[r]);
}

#else /* portable C */
static inline void qk_tile(const int wt, const uint8_t *w, const cuca_act *A, int64_t m0, const int nr, float *out,
                           int64_t ldo) {
    const int mins = wt != GT_Q6_K, gs = wt == GT_Q6_K ? 16 : 32;
    float acc[QK_T] = {0}, accm[QK_T] = {0};
    int32_t code[QKK], scale[16], mn[8];
    for (int64_t sb = 0; sb < A->nblk; sb++) {
        const uint8_t *b = w + sb * QKB(wt);
        const float dw = cuca_h2f(cuca_ld16(wt == GT_Q6_K ? b + 208 : b));
        const float dmin = mins ? cuca_h2f(cuca_ld16(b + 2)) : 0.0f;
        cuca_codes_k(wt, b, code, scale, mn);
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const int8_t *a = ACT_QS(A, m0 + r) + QKK * sb;
            const int16_t *bs = ACT_BS(A, m0 + r) + 32 * sb;
            const float da = ACT_D(A, m0 + r)[sb];
            int32_t sumi = 0, summ = 0;
            for (int j = 0; j < QKK / gs; j++) {
                int32_t s = 0;
                for (int l = 0; l < gs; l++) s += code[gs * j + l] * a[gs * j + l];
                sumi += scale[j] * s;
            }
            if (mins)
                for (int k = 0; k < 16; k++) summ += mn[k / 2] * bs[k];
            acc[r] += (dw * da) * (float)sumi;
            if (mins) accm[r] += (dmin * da) * (float)summ;
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) out[r * ldo] = acc[r] - accm[r];
}
#endif

#if QK_T == 8
#define QK_FN(name, wt) CUCA_TILE_FN(name, qk_tile, wt, 8)
#else
#define QK_FN(name, wt) CUCA_TILE_FN(name, qk_tile, wt, 4)
#endif
QK_FN(tile_q5_k, GT_Q5_K)
#if !defined(CUCA_AVX2)
QK_FN(tile_q6_k, GT_Q6_K)
#endif
#if !defined(CUCA_AVX2) && !defined(CUCA_AVX512)
QK_FN(tile_q4_k, GT_Q4_K)
#endif

int cuca_tile_k(int wtype, cuca_tile_fn *fn, int *tile) {
    switch (wtype) {
    case GT_Q5_K: *fn = tile_q5_k; break;
#if !defined(CUCA_AVX2)
    case GT_Q6_K: *fn = tile_q6_k; break;
#endif
#if !defined(CUCA_AVX2) && !defined(CUCA_AVX512)
    case GT_Q4_K: *fn = tile_q4_k; break;
#endif
    default: return CUCA_EUNSUPPORTED;
    }
    *tile = QK_T;
    return CUCA_OK;
}

#if defined(CUCA_AVX512)
#define KP_CASE(tile, n) case n: tile(g, A, m0, n, out, ldo); break;
/* one packed row (nv == 1, nb == A->nblk) for the x rows m0 .. m0+nr-1 */
#define KP_ROW(name, tile)                                                                                       \
    static void name(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo, \
                     int nv) {                                                                                   \
        (void)nb; (void)nv;                                                                                      \
        switch (nr) { KP_CASE(tile, 1) KP_CASE(tile, 2) KP_CASE(tile, 3) KP_CASE(tile, 4) KP_CASE(tile, 5)       \
                      KP_CASE(tile, 6) KP_CASE(tile, 7) KP_CASE(tile, 8) default: break; }                       \
    }
KP_ROW(k6p_row, k6p_tile)
#define K6_CASE(n) case n: k6p_tile2(g, rb, A, m0, n, out, ldo); break;
/* a packed Q6_K group of nv <= 2 rows for the x rows m0 .. m0+nr-1: both rows at once up to 4 x rows (k6p_tile2),
 * else one row at a time */
static void k6p_group(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo,
                      int nv) {
    const size_t rb = (size_t)nb * QKB(GT_Q6_K);
    if (nv == 2 && nr <= 4) {
        switch (nr) { K6_CASE(1) K6_CASE(2) K6_CASE(3) K6_CASE(4) default: break; }
        return;
    }
    for (int i = 0; i < nv; i++) k6p_row(g + (size_t)i * rb, nb, A, m0, nr, out + i, ldo, 1);
}
KP_ROW(k5p_row, k5p_tile)

int cuca_tile_k6p(cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile) {
    if (packed) *packed = k6p_group;
    if (raw) *raw = tile_q6_k;
    *tile = QK_T;
    return CUCA_OK;
}

int cuca_tile_k5p(int wtype, cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile) {
    if (wtype != GT_Q5_K) return CUCA_EUNSUPPORTED;
    if (packed) *packed = k5p_row;
    if (raw) *raw = tile_q5_k;
    *tile = QK_T;
    return CUCA_OK;
}
#endif
