/* Q4_0 in groups of 16 rows on AVX2 (the AVX-512 layout: per block the 16 rows' scales, then code dword t of rows
 * 0..15 side by side), read as two 8-row halves: each broadcast activation dword, scale and correction feeds 16
 * weight rows instead of 8. On Zen 3 the 4-row tile of 8 rows is bound by its vector micro-ops, not by memory (Q4_0
 * 12288 x 1536 at M = 4, 2 threads: 0.645 ms in cache and from memory alike), and its 8 dword broadcasts per block
 * and x row take the FP pipes 1 / 2 (llvm-mca znver3); shared by two halves a 4-row block costs ~29 cycles per 8
 * rows against 38 (one thread, in L2). Two 8-row groups side by side in memory lost it all from DRAM (1.25x the time
 * at M = 2 and 4, 2 threads: twice the streams); the 16-row group is one stream. Each half's lanes run pk_block4's
 * integer sums (exact in any order) and its float step (pk_q4_step), so a row's result is the 8-row kernel's bit for
 * bit (that kernel serves the raw rows: pk_q4_0_raw). Q4_0 12288 x 1536 from memory 0.89-0.98x the time at M = 2 ..
 * 8, M = 1 on par; Gemma 4 E2B whole passes 0.94-0.96x at M = 4, 0.97x at M = 2, M = 1 on par (AVX2 Zen 3, 2 threads,
 * two builds each with its own packing, alternated in one process, cuca vs cuca). Q8_0 in the same 16-row form (each
 * broadcast feeding both halves' sign-trick products) was measured and dropped: 0.92-0.94x the cycles at 2-4 x rows in
 * L2 (one thread), but 1.01-1.13x the time from memory (3584 x 1024 and 65536 x 640, M = 1..4, 2 threads; branch
 * avx2-q8-16). */
#include "packed.h"

#if defined(CUCA_AVX2)
/* Block b of a 16-row group (code dword t of half k at v + 64 t + 32 k, the fp16 scales of half k at s + 16 k) for
 * the x rows of T0 (T1: half 1, the same rows): one nibble half at a time, so 2 x nr int16 sums + 2 code vectors
 * stay in registers (both nibble halves at once spilled at 4 x rows). */
static inline __attribute__((always_inline)) void pk16_block(const uint8_t *v, const uint8_t *s, int64_t b,
                                                             const int nr, pk_tile8 *T0, pk_tile8 *T1) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i p0[PK_T], p1[PK_T];
    #pragma GCC unroll 8
    for (int h = 0; h < 8; h++) { /* h < 4: low nibbles of dword h (values 4h ..), else high (16 + 4(h - 4) ..) */
        const int t = h & 3;
        __m256i w0 = _mm256_loadu_si256((const __m256i *)(v + 64 * t));
        __m256i w1 = _mm256_loadu_si256((const __m256i *)(v + 64 * t + 32));
        if (h >= 4) {
            w0 = _mm256_srli_epi16(w0, 4);
            w1 = _mm256_srli_epi16(w1, 4);
        }
        w0 = _mm256_and_si256(w0, m4);
        w1 = _mm256_and_si256(w1, m4);
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m256i a = _mm256_set1_epi32(ld_i32(T0->q[r] + QK * b + 4 * t + (h >= 4 ? 16 : 0)));
            const __m256i x0 = _mm256_maddubs_epi16(w0, a), x1 = _mm256_maddubs_epi16(w1, a);
            p0[r] = h ? _mm256_add_epi16(p0[r], x0) : x0;
            p1[r] = h ? _mm256_add_epi16(p1[r], x1) : x1;
            if (nr > 1) {
                PK_KEEP(p0[r]);
                PK_KEEP(p1[r]);
            }
        }
    }
    const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
    const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16)));
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) { /* pk_block4's float step (pk_q4_step) per half */
        const __m256i c = _mm256_set1_epi32(T0->c[r][pk_ai(b)]);
        const __m256 da = _mm256_set1_ps(T0->d[r][pk_ai(b)]);
        T0->acc[r] = pk_q4_step(p0[r], c, dw0, da, T0->acc[r]);
        T1->acc[r] = pk_q4_step(p1[r], c, dw1, da, T1->acc[r]);
    }
}

/* One 16-row group (g: its packed bytes, nb blocks) for the x rows m0 .. m0+nr-1: out[r * ldo + i] for rows
 * i < nv. Records of K = 2 blocks (pk_where): their 2 x 32 scale bytes (one line), then 2 x 256 code bytes. */
static inline __attribute__((always_inline)) void pk16_group(const uint8_t *g, int64_t nb, const cuca_act *A,
                                                             int64_t m0, const int nr, float *out, int64_t ldo,
                                                             int nv) {
    const int cb = 256, sl = 32;
    pk_tile8 T0, T1;
    pk_tile_init(&T0, A, m0, nr, 0, 0);
    pk_tile_init(&T1, A, m0, nr, 0, 0);
    for (int64_t b0 = 0; b0 < nb; b0 += 2) {
        const int kk = nb - b0 >= 2 ? 2 : 1;
        const uint8_t *rec = g + (size_t)b0 * (size_t)(sl + cb);
        #pragma GCC unroll 1
        for (int j = 0; j < kk; j++) {
            const uint8_t *cv = rec + sl * kk + cb * j;
            #pragma GCC unroll 8
            for (int o = 0; o <= cb; o += 64) PK_PREFETCH(cv + PK_PF_AT(GT_Q4_0, nr) + o);
            pk16_block(cv, rec + sl * j, b0 + j, nr, &T0, &T1);
        }
    }
    pk_store8(out, ldo, nr, nv < 8 ? nv : 8, T0.acc);
    if (nv > 8) pk_store8(out + 8, ldo, nr, nv - 8, T1.acc);
}

#define PK16_CASE(n) case n: pk16_group(g, nb, A, m0, n, out, ldo, nv); break;
void cuca_pk16_q4_0(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo,
                    int nv) {
    switch (nr) { PK16_CASE(1) PK16_CASE(2) PK16_CASE(3) PK16_CASE(4) default: break; }
}
#endif
