/* Row-interleaved ("packed") Q4_0 / Q8_0 / Q4_1 / Q5_0 / Q5_1 weights (Q6_K: matmul_p6.c; AVX-512 matmul_k.c) and their
 * tile kernels: R = 16 (AVX-512) or 8 (AVX2) weight rows share one vector, one int32 lane per row, so one
 * broadcast activation dword feeds R output rows and each lane sums a whole 32-block: per block and x row one
 * int->float conversion, one scale product and one fma for R rows (the raw kernels spend that on every 4 blocks
 * of one row). AVX2 Q4_0 packs 16 rows, read as two 8-row halves (matmul_p2.c).
 *
 * Layout (same size as the raw tensor): rows in groups of R; a group is one stream of records of K = 64 / (2R)
 * 32-blocks (the last may hold fewer): the fp16 scales of rows 0..R-1 for each block of the record (one cache
 * line), then per block its code dwords t (bytes 4t..4t+3 of the codes; Q4_0 t < 4, Q8_0 t < 8; Q5: qh first) of
 * rows 0..R-1 side by side (R * 4 bytes per t). The n_out % R last rows follow raw.
 * AVX-512 stores Q8_0 codes + 128 (unsigned for dpbusd; the activation correction c = -128 * sum(a) undoes it);
 * AVX2 keeps them signed (pk_block8: no VNNI, maddubs by the sign trick).
 * Raw rows (a packed tensor's last rows, weights kept raw) run the same kernel on vectors transposed from the rows
 * as they are loaded (pk_rows16 / pk_rows8): a row's result is the same bit for bit wherever it is stored.
 *
 * Per (weight row, x row) the float sequence is fixed: acc += float(sumi_b + c_b) * (dw_b * da_b) block by block
 * in one lane (AVX2 Q5_0 / Q5_1: 8 partial sums, pk_block5), whatever the tile height or the thread split: batch
 * invariant. */
#include <stdlib.h>

#include "packed.h"

#if defined(CUCA_AVX2) || defined(CUCA_AVX512)
/* a prefetch distance in bytes: environment variable `name` (lo .. 65536) where set, else dflt */
static int pk_pf_env(const char *name, int lo, int dflt) {
    const char *e = getenv(name);
    const int d = e ? atoi(e) : 0;
    return d >= lo && d <= 65536 ? d : dflt;
}
#endif

#if defined(CUCA_AVX2)
/* the prefetch distance of the CPU the AVX2 build runs on (packed.h says why), set once at load. cuca_pk_pf_near
 * (PK_PF_AT's light loops; CUCA_PK_PF_NEAR may set it): on Zen 2 768 bytes instead of 2 KiB ran 1 x row of Q8_0 / Q4_0
 * / Q4_1 / Q4_K at 0.82-0.87x the time and 2 of Q8_0 / Q4_K at 0.85-0.90x (65536 x 1024-1536 in huge pages, 2 threads,
 * from memory; 512-1024 alike, 1280 on par for Q8_0), while Q5_0 / Q5_1 at 1 row (already 30 GB/s of 35) lost 4-10%
 * with 768-1024, Q4_0 / Q4_1 at 2 rows 7-13% and Q6_K 13-50% with 512-1024; whole passes at M = 1 0.847x the time
 * (Qwen 3.5 0.8B Q8_0), 0.904x (Gemma 4 E2B), 0.887x (Gemma 3 270M), 0.908x (SmolLM2), M = 2 0.93-1.01x, M = 4 on par
 * (cuca vs cuca, alternated in one process, same bits). Other CPUs keep cuca_pk_pf there: not measured. With the
 * NTA hint (packed.h) 2 rows of Q8_0 / Q4_K take cuca_pk_pf_near2 (CUCA_PK_PF_NEAR2 may set it), 1024 on Zen 2:
 * Qwen 3.5 0.8B Q8_0 passes at M = 2 0.971 / 0.974 / 0.972x the time of 768 (three runs; 896: 0.994x, 1280: 0.979x,
 * 1536: 1.09x), Gemma 3 270M on par (0.995x). */
int cuca_pk_pf = 2048, cuca_pk_pf_near = 2048, cuca_pk_pf_near2 = 2048;
__attribute__((constructor)) static void pk_pf_init(void) {
    __builtin_cpu_init();
    const int zen2 = __builtin_cpu_is("znver2"), amd512 = __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f");
    cuca_pk_pf = pk_pf_env("CUCA_PK_PF", 512, amd512 ? 8192 : 2048);
    cuca_pk_pf_near = pk_pf_env("CUCA_PK_PF_NEAR", 256, zen2 ? 768 : cuca_pk_pf);
    cuca_pk_pf_near2 = pk_pf_env("CUCA_PK_PF_NEAR2", 256, zen2 ? 1024 : cuca_pk_pf_near);
}
#elif defined(CUCA_AVX512)
/* the fewest x rows at which the 32-block kernel prefetches, by the CPU and format (packed.h says why: Q8_0 in
 * pk_pf_rows8, the 4- and 5-bit formats in pk_pf_rows; CUCA_PK_PF_ROWS may set both); its prefetch distance and one
 * prefetch per pk_pf_step bytes (64: every line), both bytes, CUCA_PK_PF_STEP may override the step; set once at
 * load */
static int pk_pf_rows = 1, pk_pf_rows8 = 1, pk_pf_dist = PK_PF, pk_pf_step = 64;
__attribute__((constructor)) static void pk_pf_init(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) {
        pk_pf_rows = 2;
        pk_pf_rows8 = 3;
    }
    const char *pr = getenv("CUCA_PK_PF_ROWS");
    if (pr && atoi(pr) >= 1 && atoi(pr) <= 17) pk_pf_rows = pk_pf_rows8 = atoi(pr);
    pk_pf_dist = pk_pf_env("CUCA_PK_PF", 512, PK_PF);
    const char *st = getenv("CUCA_PK_PF_STEP");
    const int k = st ? atoi(st) : 0;
    if (k == 64 || k == 128 || k == 256) pk_pf_step = k;
}
#endif

/* code dwords per block (Q5_0 / Q5_1: qh, then the 4 code dwords; Q6_K: its 208 bytes before d: ql, qh, the 16
 * sub-block scales; matmul_p6.c) */
#define PK_NT(wt) ((wt) == GT_Q6_K ? 52 : (wt) == GT_Q8_0 ? 8 : (wt) == GT_Q5_0 || (wt) == GT_Q5_1 ? 5 : 4)

int cuca_pack_rows(int wtype) {
#if defined(CUCA_AVX2)
    /* Q4_1 raw ran at about half the packed rate (AVX2); Q4_K: matmul_p4k.c; Q5_0 / Q5_1 (Gemma 3 270M's FFN and
     * attention): the raw kernel drew 15.7-17.4 GB/s in Gemma 3 decode (pk_block5) */
    if (wtype == GT_Q6_K || wtype == GT_Q4_1 || wtype == GT_Q4_K || wtype == GT_Q5_0 || wtype == GT_Q5_1) return PK_R;
    if (wtype == GT_F16 || wtype == GT_BF16) return PF_R; /* matmul_pf.c */
    if (wtype == GT_Q4_0) return 2 * PK_R; /* matmul_p2.c: two 8-row halves */
#elif defined(CUCA_AVX512)
    if (wtype == GT_Q6_K) return 2; /* rows in place, reordered, in pairs (pack_k.c, matmul_k.c) */
    if (wtype == GT_Q5_K) return 1; /* rows in place, reordered (pack_k.c) */
    if (wtype == GT_Q4_K) return PK_R; /* matmul_p4k.c */
    /* every 32-block format: Q4_1 (SmolLM2) and Q5_0 / Q5_1 (Gemma 3 270M's FFN; the 5th bits set by vpmultishiftqb,
     * VBMI) too. SmolLM2's whole M = 4 pass took 1.70-1.85x its M = 1 time with the unpacked Q4_1 kernel, packed
     * 1.33-1.51x (2 threads) */
    if (wtype == GT_Q4_1 || wtype == GT_Q5_0 || wtype == GT_Q5_1) return PK_R;
    if (wtype == GT_F16 || wtype == GT_BF16) return PF_R; /* matmul_pf.c */
#endif
    return wtype == GT_Q4_0 || wtype == GT_Q8_0 ? PK_R : 0;
}

int cuca_pack_gguf(const void *w, int wtype, int64_t n_out, int64_t n_in, void *dst) {
    const int R = cuca_pack_rows(wtype), k6 = wtype == GT_Q6_K, hm = Q32_HASMIN(wtype);
    if (R == 0) return CUCA_EUNSUPPORTED;
#if defined(CUCA_AVX512)
    if (wtype == GT_Q6_K) return cuca_k6_pack(w, n_out, n_in, dst);
    if (wtype == GT_Q5_K) return cuca_k5_pack(w, n_out, n_in, dst);
#endif
    if (wtype == GT_Q4_K) return cuca_p4k_pack(w, n_out, n_in, dst); /* its own superblock layout */
    if (wtype == GT_F16 || wtype == GT_BF16) return cuca_pf_pack(w, n_out, n_in, dst);
    const int bs = k6 ? QKK : QK, bytes = k6 ? 210 : Q32_BYTES(wtype), nt = PK_NT(wtype);
    /* where a block's fp16 scale (Q4_1 / Q5_1: then its min) and its code dwords are */
    const int doff = k6 ? 208 : 0, coff = k6 ? 0 : hm ? 4 : 2;
    if (n_out <= 0 || n_in <= 0 || n_in % bs) return CUCA_EINVAL;
    const int64_t nb = n_in / bs, ng = n_out / R;
    const size_t rb = (size_t)nb * bytes, gb = rb * R;
    const uint8_t *src = (const uint8_t *)w;
    uint8_t *out = (uint8_t *)dst;
    const uint8_t flip = (PK_R == 16 && wtype == GT_Q8_0) ? 0x80 : 0;
    for (int64_t g = 0; g < ng; g++)
        for (int64_t b = 0; b < nb; b++) {
            size_t co, so;
            pk_where(R, nb, b, (size_t)R * 4 * nt, hm ? 4 : 2, &co, &so);
            uint8_t *codes = out + g * gb + co, *scales = out + g * gb + so;
            for (int r = 0; r < R; r++) {
                const uint8_t *blk = src + (size_t)(g * R + r) * rb + b * bytes;
                uint8_t enc[208]; /* Q6_K: matmul_p6.c's encoding of the codes and scales (same size) */
                if (k6) cuca_p6_codes(blk, enc);
                const uint8_t *cs = k6 ? enc : blk + coff;
                memcpy(scales + 2 * r, blk + doff, 2);
                if (hm) memcpy(scales + 2 * R + 2 * r, blk + 2, 2);
                for (int t = 0; t < nt; t++)
                    for (int k = 0; k < 4; k++) codes[(t * R + r) * 4 + k] = (uint8_t)(cs[4 * t + k] ^ flip);
            }
        }
    memcpy(out + ng * gb, src + ng * gb, (size_t)(n_out - ng * R) * rb);
    return CUCA_OK;
}

#if defined(CUCA_AVX512) || defined(CUCA_AVX2)

/* the activation dword holding values v .. v+3 (v % 4 == 0) of block b (its c and d: pk_ai, packed.h) */
static inline __attribute__((always_inline)) const int8_t *pk_aq(const int8_t *qs, int64_t b, int v) {
#if defined(CUCA_AVX512) /* group-interleaved halves (qmatmul.h) */
    return qs + QK * (b & ~(int64_t)3) + (v < 16 ? 0 : 64) + 16 * (b & 3) + (v & 15);
#else
    return qs + QK * b + v;
#endif
}
#endif

#if defined(CUCA_AVX512)
/* vpmultishiftqb controls that put the 5th bit of value 4t + j (bit 4t + j of a row's qh dword) at bit 4 of byte j
 * of that row's lane, for the code vector u[t] of values 4t .. 4t+3 (t < 4: low nibbles, else high) */
static inline __attribute__((always_inline)) __m512i pk_q5_sel(int t) {
    uint64_t p = 0;
    for (int k = 0; k < 8; k++) p |= (uint64_t)((32 * (k / 4) + 4 * t + k % 4 - 4) & 63) << (8 * k);
    return _mm512_set1_epi64((long long)p);
}

/* One group of 16 weight rows (g: its packed bytes, nb blocks) for the x rows m0 .. m0+nr-1: out[r * ldo + i] for
 * rows i < nv. Q4_1 / Q5_1 (w = d * code + m, Q8_1 activations with s = da * sum(a)): no code offset (the sum starts
 * at 0), the min term mw * s summed in a second accumulator added at the end, as on AVX2. Q5_0 / Q5_1: the packed
 * dwords of a block are qh, then the 4 code dwords; each code byte gets its 5th bit from qh by one byte-wise
 * multishift (VBMI), so raw rows (qh gathered) run the same instructions. */
static inline __attribute__((always_inline)) void pk_group(const int wt, const uint8_t *g, int64_t nb,
                                                           const cuca_act *A, int64_t m0, const int nr, float *out,
                                                           int64_t ldo, int nv, const size_t rb) {
    const int hm = Q32_HASMIN(wt), q5 = wt == GT_Q5_0 || wt == GT_Q5_1, nt = PK_NT(wt), bytes = Q32_BYTES(wt);
    const int coff = 2 + 2 * hm + 4 * q5; /* the codes after d (+ m) (+ qh) */
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    const __mmask16 mk = (__mmask16)(nv >= 16 ? 0xFFFF : (1u << nv) - 1);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)rb));
    __m512 acc[PK_T], accm[PK_T];
    const int8_t *q[PK_T];
    const int32_t *c[PK_T];
    const float *d[PK_T], *sa[PK_T];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
        acc[r] = accm[r] = _mm512_setzero_ps();
        q[r] = ACT_QS(A, m0 + r);
        c[r] = ACT_C(A, m0 + r);
        d[r] = ACT_D(A, m0 + r);
        sa[r] = hm ? ACT_S(A, m0 + r) : NULL;
    }
    for (int64_t b = 0; b < nb; b++) {
        size_t co = (size_t)b * bytes, so = 0;
        if (!rb) pk_where(16, nb, b, 64 * (size_t)nt, hm ? 4 : 2, &co, &so);
        const uint8_t *cb = g + co;
        __m512i u[8], v[8]; /* v: the code dwords (Q5: v[0] qh, codes from v[1]) */
        __m512 dw, mw = _mm512_setzero_ps();
        if (rb) { /* raw rows: the same vectors gathered (row i at cb + i * rb) */
            if ((co & 63) < (size_t)bytes) /* this block starts a new line of each row */
                for (int i = 0; i < nv; i++) _mm_prefetch((const char *)cb + (size_t)i * rb + CUCA_PREFETCH, _MM_HINT_T0);
            pk_rows16(cb + coff, rb, nv, v + q5);
            if (q5) v[0] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, idx, cb + coff - 4, 1);
            if (wt == GT_Q8_0) pk_rows16(cb + 18, rb, nv, v + 4);
            if (wt == GT_Q8_0)
                for (int t = 0; t < 8; t++) v[t] = _mm512_xor_si512(v[t], _mm512_set1_epi8((char)0x80));
            dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, idx, cb, 1)));
            if (hm)
                mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                    _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mk, idx, cb + 2, 1)));
        } else {
            /* packed.h: on AMD, 1- and 2-row passes leave the stream to the hardware. Each line's prefetch sits
             * behind its own test and the distance is read at run time: on Sapphire Rapids (2 threads, cold, cuca
             * vs cuca) this form ran Q4_0 M = 1 at 1.13x the speed of 9 straight prefetches at a constant distance,
             * Q8_0 M = 4 at 1.11x, whole decode 1.06-1.09x; moving, spacing or re-hinting the straight ones, the
             * run-time distance alone or the test alone gave none of it. A code-generation effect whose cause is
             * not known: recheck it when the compiler changes (benchmarks/bench_kernels.py --cold-mb 1024). */
            if (nr >= (wt == GT_Q8_0 ? pk_pf_rows8 : pk_pf_rows)) {
                /* from the block's codes to the next block's, so every line of a record is covered; Q4_1 / Q5_1
                 * (2 scale lines per record of 2 blocks): a record's first block from its scales, else each
                 * record's second scale line went unfetched. On 4 KiB pages that line missed to DRAM every 640 / 768
                 * bytes (Q4_1 4096x1536 in np.empty copies, cold, 2 threads, AVX-512 Zen 4: 0.52-0.73x the time at
                 * M = 3, 0.59-0.60x at 4, 0.70x at 8; Q5_1 0.60-0.67x); in the Ops arena's huge pages whole passes
                 * ran on par before and after (kernel-table Q4_1 / Q5_1 models, SmolLM2) */
                const uint8_t *ps = hm && !(b & 1) ? g + so : cb;
                const int span = (int)(cb + 64 * nt - ps);
                for (int o = 0; o <= span; o += 64)
                    if ((((uintptr_t)ps + o) & (pk_pf_step - 1)) < 64)
                        PK_PREFETCH(ps + pk_pf_dist + o);
            }
            for (int t = 0; t < nt; t++) v[t] = _mm512_loadu_si512(cb + 64 * t);
            dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + so)));
            if (hm) mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + so + 32)));
        }
        if (wt == GT_Q8_0) {
            for (int t = 0; t < 8; t++) u[t] = v[t];
        } else {
            const __m512i *cv = v + q5;
            for (int t = 0; t < 4; t++) {
                u[t] = _mm512_and_si512(cv[t], m4);
                u[t + 4] = _mm512_and_si512(_mm512_srli_epi16(cv[t], 4), m4);
            }
            if (q5)
                for (int t = 0; t < 8; t++)
                    u[t] = _mm512_or_si512(u[t], _mm512_and_si512(_mm512_multishift_epi64_epi8(pk_q5_sel(t), v[0]), m10));
        }
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            /* two dependent dpbusd chains of 4, not one of 8: at M = 1 the chain's latency was the kernel's bound
             * (integer sums: the same bits either way) */
            __m512i s = hm ? _mm512_setzero_si512() : _mm512_set1_epi32(c[r][pk_ai(b)]), s1 = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int t = 0; t < 8; t += 2) { /* Q4_0: u[t] = values 4t.. (t < 4) or 16 + 4(t-4).. */
                s = _mm512_dpbusd_epi32(s, u[t], _mm512_set1_epi32(ld_i32(pk_aq(q[r], b, 4 * t))));
                s1 = _mm512_dpbusd_epi32(s1, u[t + 1], _mm512_set1_epi32(ld_i32(pk_aq(q[r], b, 4 * t + 4))));
            }
            s = _mm512_add_epi32(s, s1);
            const __m512 f = _mm512_mul_ps(dw, _mm512_set1_ps(d[r][pk_ai(b)]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), f, acc[r]);
            if (hm) accm[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[r][pk_ai(b)]), accm[r]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        _mm512_mask_storeu_ps(out + r * ldo, mk, hm ? _mm512_add_ps(acc[r], accm[r]) : acc[r]);
}

#elif defined(CUCA_AVX2)
/* Block b of 8 weight rows, Q4_0 or Q4_1: v holds code dword t of rows 0..7 at v + 32 t, dw / mw their scales /
 * mins. Per x row the 8 code/activation pair products summed in int16 (|sum| <= 8 * 2 * 15 * 128 < 2^15: exact in
 * any order), widened once; Q4_0 + c (its code offset), Q4_1 (w = d * code + m, no offset) adds the min term
 * m * s (s = da * sum(a), Q8_1 activations) in the second accumulator. One code vector at a time is live beside
 * the rows' sums (all 8 unpacked first spilled the AVX2 registers from 2 x rows on). */
static inline __attribute__((always_inline)) void pk_block4(const int q41, const uint8_t *v, __m256 dw, __m256 mw,
                                                            int64_t b, const int nr, pk_tile8 *T) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i p[PK_T];
    #pragma GCC unroll 4
    for (int t = 0; t < 4; t++) { /* low nibbles: values 4t .. 4t+3, high: 16 + 4t .. */
        const __m256i w = _mm256_loadu_si256((const __m256i *)(v + 32 * t));
        const __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const int8_t *a = T->q[r] + QK * b + 4 * t;
            const __m256i x = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(ld_i32(a))),
                                               _mm256_maddubs_epi16(hi, _mm256_set1_epi32(ld_i32(a + 16))));
            p[r] = t ? _mm256_add_epi16(p[r], x) : x;
            if (nr > 1) PK_KEEP(p[r]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        const __m256i c = q41 ? _mm256_setzero_si256() : _mm256_set1_epi32(T->c[r][pk_ai(b)]);
        T->acc[r] = pk_q4_step(p[r], c, dw, _mm256_set1_ps(T->d[r][pk_ai(b)]), T->acc[r]);
        if (q41) T->accm[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(T->s[r][pk_ai(b)]), T->accm[r]);
    }
}

/* The 5th bits of Q5_0 / Q5_1 code dword t (half 0: values 4t .. 4t+3, half 1: 16 + 4t ..) of 8 rows, from their
 * qh dwords (one per int32 lane; bit i: value i), at bit 4 of each byte: the lane's qh byte that holds them copied
 * into its 4 bytes (pshufb), each byte's own bit tested (and, cmpeq), kept as 0x10 */
static inline __attribute__((always_inline)) __m256i pk_q5_bits(__m256i qh, const int t, const int half) {
    const char k = (char)(2 * half + (t >> 1));
    const __m256i ctl = _mm256_setr_epi8(k, k, k, k, (char)(4 + k), (char)(4 + k), (char)(4 + k), (char)(4 + k),
                                         (char)(8 + k), (char)(8 + k), (char)(8 + k), (char)(8 + k), (char)(12 + k),
                                         (char)(12 + k), (char)(12 + k), (char)(12 + k), k, k, k, k, (char)(4 + k),
                                         (char)(4 + k), (char)(4 + k), (char)(4 + k), (char)(8 + k), (char)(8 + k),
                                         (char)(8 + k), (char)(8 + k), (char)(12 + k), (char)(12 + k), (char)(12 + k),
                                         (char)(12 + k));
    const __m256i bit = _mm256_set1_epi32((int)(0x08040201u << (4 * (t & 1)))); /* byte j: bit 4 (t & 1) + j */
    const __m256i m = _mm256_and_si256(_mm256_shuffle_epi8(qh, ctl), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(m, bit), _mm256_set1_epi8(0x10));
}

/* Block b of 8 weight rows, Q5_0 or Q5_1: v holds the rows' qh dwords, then code dword t at v + 32 (t + 1). Not
 * one accumulator per x row as pk_block4: 8 partial sums L[j + 4h] (block j = b % 4 of its group of 4, half h:
 * values 16h .. 16h + 15), each half's int sum (+ c on h = 0) -> float * da, fma with dw (Q5_1: then + mw * s on
 * h = 0), summed at the end as ((L0 + L4) + (L2 + L6)) + ((L1 + L5) + (L3 + L7)). That is the float order of the
 * raw AVX2 kernel that served these formats before (bit for bit), whose 8 partial sums keep Gemma 3 270M's greedy
 * output with llama.cpp's: one accumulator per row moved it away on 2 of 8 fixture prompts (the Q8_0 activations
 * requantized in every layer carry a last-bit difference to ~1 logit). A half's int16 sums stay exact (4 * 2 * 31 *
 * 128 < 2^15). Gemma 3 270M whole passes 0.89-0.94x the raw kernel's time at M = 1 / 2 / 4 / 8 (AVX2 Zen 3, 2
 * threads, two builds alternated in one process, cuca vs cuca), on par with the one-accumulator form. */
static inline __attribute__((always_inline)) void pk_block5(const int hm, const uint8_t *v, __m256 dw, __m256 mw,
                                                            int64_t b, const int nr, pk_tile8 *T) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), qh = _mm256_loadu_si256((const __m256i *)v);
    const int j = (int)(b & 3);
    __m256i p[PK_T], q[PK_T]; /* per x row: the low / high half's int16 pair sums */
    #pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(v + 32 * (t + 1)));
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(w, m4), pk_q5_bits(qh, t, 0));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), pk_q5_bits(qh, t, 1));
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const int8_t *a = T->q[r] + QK * b + 4 * t;
            const __m256i x = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(ld_i32(a)));
            const __m256i y = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(ld_i32(a + 16)));
            p[r] = t ? _mm256_add_epi16(p[r], x) : x;
            q[r] = t ? _mm256_add_epi16(q[r], y) : y;
            if (nr > 1) {
                PK_KEEP(p[r]);
                PK_KEEP(q[r]);
            }
        }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        __m256i slo = _mm256_madd_epi16(p[r], ones);
        if (!hm) slo = _mm256_add_epi32(slo, _mm256_set1_epi32(T->c[r][pk_ai(b)]));
        const __m256 da = _mm256_set1_ps(T->d[r][pk_ai(b)]);
        __m256 *L = T->lane[r];
        L[j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(slo), da), dw, L[j]);
        if (hm) L[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(T->s[r][pk_ai(b)]), L[j]);
        const __m256i shi = _mm256_madd_epi16(q[r], ones);
        L[j + 4] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(shi), da), dw, L[j + 4]);
    }
}

/* Block b of 8 weight rows, Q8_0, by the sign trick: per code dword t and x row maddubs(|w|, a * sign(w))
 * (|w| <= 128, |a| <= 127: each pair sum <= 32512, exact in int16; two could overflow, so madd widens each at
 * once), summed in int32. The codes stay signed (no offset: c = 0). */
static inline __attribute__((always_inline)) void pk_block8(const uint8_t *v, __m256 dw, int64_t b, const int nr,
                                                            pk_tile8 *T) {
    __m256i s[PK_T];
    #pragma GCC unroll 8
    for (int t = 0; t < 8; t++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(v + 32 * t));
        const __m256i wa = _mm256_sign_epi8(w, w); /* |w|; -128 reads as 128 unsigned */
        #pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            const __m256i a = _mm256_sign_epi8(_mm256_set1_epi32(ld_i32(T->q[r] + QK * b + 4 * t)), w);
            const __m256i x = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, a), _mm256_set1_epi16(1));
            s[r] = t ? _mm256_add_epi32(s[r], x) : x;
            if (nr > 1) PK_KEEP(s[r]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
        const __m256 f = _mm256_mul_ps(dw, _mm256_set1_ps(T->d[r][pk_ai(b)]));
        T->acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), f, T->acc[r]);
    }
}

/* Block b of a packed group: its scales at sc, its code dwords at cv (prefetched PK_PF ahead) */
static inline __attribute__((always_inline)) void pk_rblock(const int wt, const uint8_t *sc, const uint8_t *cv,
                                                            int64_t b, const int nr, pk_tile8 *T) {
    const int cb = 32 * PK_NT(wt), hm = Q32_HASMIN(wt);
    #pragma GCC unroll 8
    for (int o = 0; o <= cb; o += 64) PK_PREFETCH(cv + PK_PF_AT(wt, nr) + o);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sc));
    if (wt == GT_Q8_0) {
        pk_block8(cv, dw, b, nr, T);
    } else {
        const __m256 mw = hm ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 16))) : _mm256_setzero_ps();
        if (wt == GT_Q5_0 || wt == GT_Q5_1) pk_block5(hm, cv, dw, mw, b, nr, T);
        else pk_block4(hm, cv, dw, mw, b, nr, T);
    }
}

/* The record of a packed group g holding blocks b0 .. b0+kk-1: pk_where's layout (kk scale vectors of sl bytes,
 * then kk blocks of code dwords) with kk a constant for full records, so that every offset is one: pk_where per
 * record measured 1.02-1.07x the time in cache (1024x1536, 1 thread, AVX2), on par from memory. */
static inline __attribute__((always_inline)) void pk_record(const int wt, const uint8_t *g, int64_t b0, const int kk,
                                                            const int nr, pk_tile8 *T) {
    const int cb = 32 * PK_NT(wt), sl = Q32_HASMIN(wt) ? 32 : 16;
    const uint8_t *rec = g + (size_t)b0 * (size_t)(sl + cb), *cv = rec + sl * kk;
    /* not unrolled: 4 blocks at once (M = 1) ran 2-4% faster in cache but 8-12% slower from memory (AVX2, measured) */
    #pragma GCC unroll 1
    for (int j = 0; j < kk; j++) pk_rblock(wt, rec + sl * j, cv + cb * j, b0 + j, nr, T);
}

/* One group of 8 weight rows (g: its bytes, nb blocks; rb = 0: packed, else raw rows at stride rb) of format wt
 * for the x rows m0 .. m0+nr-1: out[r * ldo + i] for rows i < nv. Packed groups are walked record by record; raw rows
 * are transposed into the same vectors. */
static inline __attribute__((always_inline)) void pk_group(const int wt, const uint8_t *g, int64_t nb,
                                                           const cuca_act *A, int64_t m0, const int nr, float *out,
                                                           int64_t ldo, int nv, const size_t rb) {
    const int hm = Q32_HASMIN(wt), q8 = wt == GT_Q8_0, q5 = wt == GT_Q5_0 || wt == GT_Q5_1;
    const int bytes = Q32_BYTES(wt), coff = 2 + 2 * hm + 4 * q5; /* the codes after d (+ m) (+ qh) */
    pk_tile8 T;
    pk_tile_init(&T, A, m0, nr, hm, q5);
    if (!rb) {
        for (int64_t b0 = 0; b0 < nb; b0 += 4) { /* full records with constant offsets, then the short last one */
            if (nb - b0 >= 4) pk_record(wt, g, b0, 4, nr, &T);
            else pk_record(wt, g, b0, (int)(nb - b0), nr, &T);
        }
    } else {
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
        const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int64_t b = 0; b < nb; b++) { /* raw rows: the same vectors gathered (row i at blk + i * rb) */
            const uint8_t *blk = g + (size_t)b * (size_t)bytes;
            if (((size_t)b * (size_t)bytes & 63) < (size_t)bytes) /* this block starts a new line of each row */
                for (int i = 0; i < nv; i++) _mm_prefetch((const char *)blk + (size_t)i * rb + CUCA_PREFETCH, _MM_HINT_T0);
            __m256i v[8];
            pk_rows8(blk + coff, rb, nv, v + q5);
            if (q8) pk_rows8(blk + 18, rb, nv, v + 4);
            if (q5) v[0] = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)(blk + coff - 4), idx, mk, 1);
            const __m256 dw = pk_scales8(blk, idx, mk);
            if (q8) {
                pk_block8((const uint8_t *)v, dw, b, nr, &T);
            } else {
                const __m256 mw = hm ? pk_scales8(blk + 2, idx, mk) : _mm256_setzero_ps();
                if (q5) pk_block5(hm, (const uint8_t *)v, dw, mw, b, nr, &T);
                else pk_block4(hm, (const uint8_t *)v, dw, mw, b, nr, &T);
            }
        }
    }
    if (q5) /* cuca_hsum256's order, lane by lane */
        for (int r = 0; r < nr; r++) {
            const __m256 *L = T.lane[r];
            T.acc[r] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(L[0], L[4]), _mm256_add_ps(L[2], L[6])),
                                     _mm256_add_ps(_mm256_add_ps(L[1], L[5]), _mm256_add_ps(L[3], L[7])));
        }
    else if (hm)
        for (int r = 0; r < nr; r++) T.acc[r] = _mm256_add_ps(T.acc[r], T.accm[r]);
    pk_store8(out, ldo, nr, nv, T.acc);
}
#endif

#if PK_R > 0
#define PK_CASE(wt, n) case n: if (n <= PK_T) pk_group(wt, g, nb, A, m0, n, out, ldo, nv, rb); break;
#define PK_CASES(wt) PK_CASE(wt, 1) PK_CASE(wt, 2) PK_CASE(wt, 3) PK_CASE(wt, 4) PK_CASE(wt, 5) PK_CASE(wt, 6) \
    PK_CASE(wt, 7) PK_CASE(wt, 8)
/* packed group (rb == 0) or raw rows at stride rb: one kernel, so a row's result never depends on its storage */
#define PK_RAW_FNS(name, wt)                                                                                      \
    static void name##_any(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out,     \
                           int64_t ldo, int nv, size_t rb) {                                                     \
        switch (nr) { PK_CASES(wt) default: break; }                                                              \
    }                                                                                                             \
    static void name##_raw(const uint8_t *w, size_t rb, int nw, const cuca_act *A, int64_t m0, int nr, float *out, \
                           int64_t ldo) {                                                                         \
        for (int i = 0; i < nw; i += PK_R)                                                                        \
            name##_any(w + (size_t)i * rb, A->n_in / QK, A, m0, nr, out + i, ldo, nw - i < PK_R ? nw - i : PK_R, rb); \
    }
#define PK_FNS(name, wt)                                                                                          \
    PK_RAW_FNS(name, wt)                                                                                          \
    static void name(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out, int64_t ldo, \
                     int nv) {                                                                                    \
        name##_any(g, nb, A, m0, nr, out, ldo, nv, 0);                                                            \
    }
#if defined(CUCA_AVX2)
PK_RAW_FNS(pk_q4_0, GT_Q4_0) /* packed Q4_0: 16-row groups, matmul_p2.c */
#else
PK_FNS(pk_q4_0, GT_Q4_0)
#endif
PK_FNS(pk_q8_0, GT_Q8_0)
PK_FNS(pk_q4_1, GT_Q4_1)
PK_FNS(pk_q5_0, GT_Q5_0)
PK_FNS(pk_q5_1, GT_Q5_1)
#endif

int cuca_tile_p(int wtype, cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile) {
    if (wtype == GT_Q6_K) return cuca_tile_p6(packed, raw, tile);
    if (wtype == GT_Q4_K) return cuca_tile_p4k(packed, raw, tile);
#if defined(CUCA_AVX512)
    if (wtype == GT_Q5_K) return cuca_tile_k5p(wtype, packed, raw, tile);
#endif
    if (wtype == GT_F16 || wtype == GT_BF16) return cuca_tile_pf(wtype, packed, raw, tile);
#if PK_R > 0
    cuca_pk_fn p = NULL;
    cuca_tile_fn r = NULL;
#if defined(CUCA_AVX2)
    if (wtype == GT_Q4_0) p = cuca_pk16_q4_0, r = pk_q4_0_raw; /* bit-equal (matmul_p2.c) */
#else
    if (wtype == GT_Q4_0) p = pk_q4_0, r = pk_q4_0_raw;
#endif
    else if (wtype == GT_Q8_0) p = pk_q8_0, r = pk_q8_0_raw;
    else if (wtype == GT_Q4_1) p = pk_q4_1, r = pk_q4_1_raw;
    else if (wtype == GT_Q5_0) p = pk_q5_0, r = pk_q5_0_raw;
    else if (wtype == GT_Q5_1) p = pk_q5_1, r = pk_q5_1_raw;
    else return CUCA_EUNSUPPORTED;
    if (packed) *packed = p;
    if (raw) *raw = r;
    *tile = PK_T;
    return CUCA_OK;
#else
    (void)wtype; (void)packed; (void)raw; (void)tile;
    return CUCA_EUNSUPPORTED;
#endif
}
