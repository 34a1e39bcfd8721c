/* Internal helpers of the row-interleaved ("packed") weight kernels, shared by matmul_p.c (the 32-value block
 * formats), matmul_p2.c (AVX2 Q4_0), matmul_p6.c (Q6_K), matmul_p4k.c (Q4_K), matmul_pf.c (F16 / BF16) and
 * matmul_k.c: the rows per group R, the record geometry and the transposes that turn R raw rows into the vectors of
 * the packed layout. */
#ifndef CUCA_PACKED_H
#define CUCA_PACKED_H
#include "qmatmul.h"

/* Packed bytes are prefetched PK_PF ahead into L2 (T1): interleaved A/B runs (2 threads, M = 1, cold) put 8 KiB
 * at 1.3-1.7x the rate of 4 KiB into L1, whose prefetches stall the loads once the miss buffers are full. AVX-512
 * (Zen 4): 8 KiB (4 / 16 KiB and NTA: 1.04-1.06x its time). AVX2 on a CPU without AVX-512 (Zen 3): 2 KiB, 0.93x the
 * time of 8 KiB on Q4_0 12288x1536 (3 runs), 0.94-0.97x on Q6_K and Q4_0 1536x6144, Q8_0 on par; whole decode 1.09x
 * the speed on the Gemma 4 E2B file, 1.04x Qwen 3.5 0.8B (cuca vs cuca, one process, interleaved). The AVX2 build on
 * an AMD CPU that has AVX-512 (Zen 4) takes 8 KiB, chosen at load (cuca_pk_pf): 0.88x the time of 2 KiB on Q4_0
 * 12288x1536, whole decode 1.21x the speed on E2B and 1.36x on Qwen 3.5 (same method). On Intel (Sapphire Rapids)
 * the AVX2 build keeps 2 KiB: whole decode 1.05-1.06x the speed of 8 KiB on E2B, 1.01-1.08x on Qwen 3.5 (medians
 * of 3 interleaved process pairs, two runs each), 1.02-1.08x on Gemma 3 (2 pairs); the E2B head (Q6_K) 0.90x the time
 * and its Q4_0 FFN 0.94x (2 threads, cuca vs cuca). Raw rows (R streams at once)
 * are prefetched CUCA_PREFETCH ahead. On AMD the AVX-512 32-block kernel (matmul_p.c) prefetches only from 2 x rows
 * on for the 4- and 5-bit formats and from 3 for Q8_0: at 1 row (Zen 4) its few instructions per line keep enough
 * loads in flight, and the prefetches only take miss buffers (M = 1: Q4_0 12288x1536 1 thread 19.0 -> 27.2 GB/s, 2
 * threads 37.7 -> 42.0 at 6144x1536; Q8_0 3584x1024 2 threads 32.3 -> 40.2; cold, interleaved with a read probe; Q8_0
 * 65536x1024 in huge pages, 2 threads: 1.36x the time with them at 4 KiB), as at 2 rows of Q8_0 (1.26x the time with
 * them where memory ran fast, 65536x1024). 2 rows of the denser formats fell behind without them where memory ran fast
 * (~55 GB/s read, 2 threads, 65536x2048 in huge pages: Q4_0 0.80x the time with them, Q5_1 0.75x; on par to 1.07x
 * where it ran slow, ~34 GB/s): E2B M = 2 passes 0.94x the time (0.92x in the faster half; M = 1, 3, 4 and
 * SmolLM2 / Gemma 3 passes on par; cuca vs cuca in one process). At 4 rows it needs them (Q4_0, 1 thread: 13.7 GB/s
 * without, 19.1 with), as do
 * the heavier AVX2 and Q6_K kernels at 1 row (AVX2 Q4_0 1 thread 22.4 with, 18.9 without; AVX-512 Q6_K 20.5 with,
 * 16.5 without). Intel (Sapphire Rapids) needs them at every row count: M = 1, 2 threads, cold, Q4_0 17-18 -> 27
 * GB/s, Q8_0 24-25 -> 30; whole decode 1.26-1.46x the speed on Gemma 4 E2B and 1.14-1.39x on Qwen 3.5 0.8B (2
 * threads, 3 interleaved process pairs, cuca vs cuca). */
#if defined(CUCA_AVX512)
#define PK_PF 8192
#elif defined(CUCA_AVX2)
extern int cuca_pk_pf; /* matmul_p.c: 2048, or 8192 where the CPU has AVX-512 */
extern int cuca_pk_pf_near, cuca_pk_pf_near2; /* matmul_p.c: the light passes' distances (PK_PF_AT), Zen 2 768 / 1024 */
#define PK_PF cuca_pk_pf
/* the distance for nr x rows of format wt (both constants where the kernels inline it): the lightest loops (1 row of
 * Q4_0 / Q4_1 / Q8_0 / Q4_K; 2 rows of Q8_0 / Q4_K) take cuca_pk_pf_near (cuca_pk_pf_near2), matmul_p.c says why */
#define PK_PF_AT(wt, nr) ((nr) == 1 && (wt) != GT_Q5_0 && (wt) != GT_Q5_1                  ? cuca_pk_pf_near  \
                          : (nr) == 2 && ((wt) == GT_Q8_0 || (wt) == GT_Q4_K) ? cuca_pk_pf_near2 \
                                                                               : cuca_pk_pf)
#endif
#if defined(CUCA_AVX512)
#define PK_R 16
#define PK_T 8
#elif defined(CUCA_AVX2)
#define PK_R 8
#define PK_T 4
#else
#define PK_R 0
#define PK_T 1
#endif

/* A group of R rows is one stream of records of K = 64 / (2R) blocks (the last may hold fewer): the fp16 scales of
 * rows 0..R-1 for each block of the record (one cache line; Q4_1: per block its R scales then its R mins, two
 * lines), then per block its code dwords t of rows 0..R-1 side by side (cbytes = R * 4 * dwords per block).
 * Block b of a group of nb blocks: where its codes and scales are (sb: scale bytes per row and block, 2 or 4). */
static inline __attribute__((always_inline)) void pk_where(int R, int64_t nb, int64_t b, size_t cbytes, int sb,
                                                           size_t *codes, size_t *scales) {
    const int K = 64 / (2 * R);
    const int64_t j = b % K, b0 = b - j, kk = nb - b0 < K ? nb - b0 : K;
    const size_t rec = (size_t)b0 * ((size_t)sb * (size_t)R + cbytes);
    *scales = rec + (size_t)sb * (size_t)R * (size_t)j;
    *codes = rec + (size_t)sb * (size_t)R * (size_t)kk + cbytes * (size_t)j;
}

#if defined(CUCA_AVX512) || defined(CUCA_AVX2)
/* The packed kernels' weight prefetches, a line at p: into L2 (T1), or non-temporal (NTA) where CUCA_PK_NTA is 1
 * (the build's CUCA_PK_NTA=0 / 1, else 1 on Zen 2 alone). On Zen 2 the weights streamed through L2 evicted what the
 * other ops of a pass reuse (K / V rows, activations, scratch, code): an E2B layer's attention took 74 us cold against
 * 41 us repeated at once (position 200), 47 us with NTA. NTA for every packed kernel, the same distances: whole passes
 * at M = 1 0.964x the time on Gemma 4 E2B Q4_0, 0.966x Qwen 3.5 0.8B Q8_0, 0.969x Gemma 3 270M, 0.971x SmolLM2; M = 4
 * 0.97 / 0.98 / 1.00 / 0.95x (AVX2, 2 threads, cuca vs cuca alternated in one process, the same bits). Other CPUs keep
 * T1: not measured. A constant, as the hint is an immediate: chosen by a flag read at run time, E2B passes took 1.068 /
 * 1.059x the time at M = 1 / 4. */
#ifndef CUCA_PK_NTA
#if defined(__znver2__)
#define CUCA_PK_NTA 1
#else
#define CUCA_PK_NTA 0
#endif
#endif
#define PK_PREFETCH(p) _mm_prefetch((const char *)(p), CUCA_PK_NTA ? _MM_HINT_NTA : _MM_HINT_T1)
#endif

/* GCC re-associates integer vector sums: left free, it computes all of a block's products before adding any and
 * spills them (AVX2 has 16 registers; 2+ x rows). An empty asm on a partial sum keeps the adds in source order. */
#define PK_KEEP(v) __asm__("" : "+x"(v))

#if defined(CUCA_AVX512) || defined(CUCA_AVX2)
/* where block b's scale d and correction c are among the activation row's (qmatmul.h) */
static inline __attribute__((always_inline)) int64_t pk_ai(int64_t b) {
#if defined(CUCA_AVX512)
    return QA_LANES * b;
#else
    return 8 * (b >> 2) + (b & 3);
#endif
}
static inline int32_t ld_i32(const void *p) { int32_t v; memcpy(&v, p, 4); return v; }
#endif

#if defined(CUCA_AVX512)
/* raw rows: dwords 0..3 of the 16 bytes at p + i * rb for rows i < 16 (rows >= nv read row nv - 1) into
 * v[0..3], int32 lane i = row i: four 4-row zmm, then a 4 x 4 dword transpose inside each 128-bit lane */
static inline __attribute__((always_inline)) void pk_rows16(const uint8_t *p, size_t rb, int nv, __m512i *v) {
    __m512i z[4];
    for (int k = 0; k < 4; k++) {
        const int i0 = k < nv ? k : nv - 1, i1 = 4 + k < nv ? 4 + k : nv - 1;
        const int i2 = 8 + k < nv ? 8 + k : nv - 1, i3 = 12 + k < nv ? 12 + k : nv - 1;
        __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + (size_t)i0 * rb)));
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + (size_t)i1 * rb)), 1);
        t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + (size_t)i2 * rb)), 2);
        z[k] = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(p + (size_t)i3 * rb)), 3);
    }
    const __m512i a0 = _mm512_unpacklo_epi32(z[0], z[1]), a1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i a2 = _mm512_unpacklo_epi32(z[2], z[3]), a3 = _mm512_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm512_unpacklo_epi64(a0, a2);
    v[1] = _mm512_unpackhi_epi64(a0, a2);
    v[2] = _mm512_unpacklo_epi64(a1, a3);
    v[3] = _mm512_unpackhi_epi64(a1, a3);
}
#elif defined(CUCA_AVX2)
/* raw rows: dwords 0..3 of the 16 bytes at p + i * rb for rows i < 8 (rows >= nv read row nv - 1) into v[0..3],
 * int32 lane i = row i: four 2-row ymm, then a 4 x 4 dword transpose inside each 128-bit lane */
static inline __attribute__((always_inline)) void pk_rows8(const uint8_t *p, size_t rb, int nv, __m256i *v) {
    __m256i z[4];
    for (int k = 0; k < 4; k++) {
        const int i0 = k < nv ? k : nv - 1, i1 = 4 + k < nv ? 4 + k : nv - 1;
        z[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + (size_t)i0 * rb))),
                                       _mm_loadu_si128((const __m128i *)(p + (size_t)i1 * rb)), 1);
    }
    const __m256i a0 = _mm256_unpacklo_epi32(z[0], z[1]), a1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i a2 = _mm256_unpacklo_epi32(z[2], z[3]), a3 = _mm256_unpackhi_epi32(z[2], z[3]);
    v[0] = _mm256_unpacklo_epi64(a0, a2);
    v[1] = _mm256_unpackhi_epi64(a0, a2);
    v[2] = _mm256_unpacklo_epi64(a1, a3);
    v[3] = _mm256_unpackhi_epi64(a1, a3);
}


/* A group kernel's x rows m0 .. m0+nr-1 (their activations) and its accumulators, one ymm per x row (accm: Q4_1's
 * min terms, summed into acc at the end). */
typedef struct {
    __m256 acc[PK_T], accm[PK_T];
    const int8_t *q[PK_T];
    const int32_t *c[PK_T];
    const float *d[PK_T], *s[PK_T];
    __m256 lane[PK_T][8]; /* Q5_0 / Q5_1: the raw kernel's 8 lane accumulators per x row (pk_block5) */
} pk_tile8;

static inline __attribute__((always_inline)) void pk_tile_init(pk_tile8 *T, const cuca_act *A, int64_t m0,
                                                               const int nr, const int hm, const int q5) {
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        T->acc[r] = T->accm[r] = _mm256_setzero_ps();
        if (q5)
            for (int k = 0; k < 8; k++) T->lane[r][k] = _mm256_setzero_ps();
        T->q[r] = ACT_QS(A, m0 + r);
        T->c[r] = ACT_C(A, m0 + r);
        T->d[r] = ACT_D(A, m0 + r);
        T->s[r] = hm ? ACT_S(A, m0 + r) : NULL;
    }
}

/* A Q4_0 / Q4_1 block's float step for one x row: its int16 pair sums p widened, + c (Q4_0's code offset; zero
 * vector for Q4_1), acc += float(.) * (dw * da). pk_block4 and matmul_p2.c's 16-row kernel both take it, so a row's
 * result is the same bits whichever group width ran it. */
static inline __attribute__((always_inline)) __m256 pk_q4_step(__m256i p, __m256i c, __m256 dw, __m256 da,
                                                               __m256 acc) {
    const __m256i si = _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), c);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(dw, da), acc);
}

/* raw rows: the fp16 block scales at p + i * rb (lane mask mk: rows i < nv; idx: i * rb) as 8 floats */
static inline __attribute__((always_inline)) __m256 pk_scales8(const uint8_t *p, __m256i idx, __m256i mk) {
    const __m256i h = _mm256_and_si256(_mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)p, idx, mk, 1),
                                       _mm256_set1_epi32(0xFFFF));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* the nr x 8 results of a group into out (rows r * ldo), only the first nv lanes where the group is short */
static inline __attribute__((always_inline)) void pk_store8(float *out, int64_t ldo, const int nr, int nv,
                                                            const __m256 *acc) {
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        if (nv >= 8) {
            _mm256_storeu_ps(out + r * ldo, acc[r]);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[r]);
            memcpy(out + r * ldo, tmp, sizeof(float) * (size_t)nv);
        }
    }
}
#endif

/* A group kernel's two entry points from one kernel any(g, nb, A, m0, nr, out, ldo, nv, rb) (rb 0: a packed group,
 * else raw rows at stride rb; nb: superblocks per row): any##_packed (a cuca_pk_fn) and any##_raw (a cuca_tile_fn,
 * the tensor's raw rows in groups of R). One kernel, so a row's result never depends on its storage. */
#define PK_ENTRY_POINTS(any)                                                                                    \
    static void any##_packed(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out,  \
                             int64_t ldo, int nv) {                                                             \
        any(g, nb, A, m0, nr, out, ldo, nv, 0);                                                                 \
    }                                                                                                            \
    static void any##_raw(const uint8_t *w, size_t rb, int nw, const cuca_act *A, int64_t m0, int nr, float *out, \
                          int64_t ldo) {                                                                         \
        for (int i = 0; i < nw; i += PK_R)                                                                       \
            any(w + (size_t)i * rb, A->nblk, A, m0, nr, out + i, ldo, nw - i < PK_R ? nw - i : PK_R, rb);       \
    }

/* matmul_p6.c: the Q6_K group kernel and the same kernel on raw rows (as cuca_tile_p); the 208 code and scale
 * bytes of one row's superblock blk in the packed encoding (dst: 208 bytes, the 52 dwords of the packed layout) */
void cuca_p6_codes(const uint8_t *blk, uint8_t *dst);
int cuca_tile_p6(cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile);
/* AVX-512: Q6_K / Q5_K rows kept in place (R = 1), each superblock's bytes reordered (pack_k.c) for k6p_tile /
 * k5p_tile (matmul_k.c) */
int cuca_k6_pack(const void *w, int64_t n_out, int64_t n_in, void *dst);
int cuca_k5_pack(const void *w, int64_t n_out, int64_t n_in, void *dst);
int cuca_tile_k6p(cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile);
int cuca_tile_k5p(int wtype, cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile);
/* matmul_p4k.c: the Q4_K packing (its own superblock layout) and group kernel, as cuca_tile_p */
int cuca_p4k_pack(const void *w, int64_t n_out, int64_t n_in, void *dst);
int cuca_tile_p4k(cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile);
#if defined(CUCA_AVX2)
/* matmul_p2.c: the Q4_0 group kernel (cuca_pk_fn) on groups of 16 rows (cuca_pack_rows) */
void cuca_pk16_q4_0(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo,
                    int nv);
#endif
/* matmul_pf.c: F16 / BF16 in groups of PF_R rows (SIMD builds), its packing (2-byte values, any n_in) and kernels */
#define PF_R 4
int cuca_pf_pack(const void *w, int64_t n_out, int64_t n_in, void *dst);
int cuca_tile_pf(int wtype, cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile);
#endif
