/* Internal declarations shared by quantize.c, matmul.c, matmul_q.c, matmul_k.c and dequant.c.
 *
 * Activations are quantized once per matmul call into a `cuca_act` buffer whose per-row layout depends on the
 * weight format (see quantize.c). A tile kernel computes out[m0 .. m0+nr-1][n] for one weight row n; every
 * tile kernel applies exactly the same floating-point sequence to each activation row whatever nr is, so a
 * result never depends on the batch size, the tiling or the thread split. */
#ifndef CUCA_QMATMUL_H
#define CUCA_QMATMUL_H
#include <stdint.h>
#include <string.h>
#include "cuca.h"

/* The AVX-512 kernels also use VNNI (dpbusd/dpwssd), VBMI (byte permutes) and BITALG (bit shuffles):
 * Ice Lake and later, Zen 4 and later. Older AVX-512 parts take the AVX2 kernels. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512VBMI__) && defined(__AVX512BITALG__) && defined(__F16C__) && defined(__FMA__)
#define CUCA_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CUCA_AVX2 1
#include <immintrin.h>
#elif defined(__F16C__)
#include <immintrin.h>
#endif

/* GGML type ids */
enum {
    GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7, GT_Q8_0 = 8,
    GT_Q4_K = 12, GT_Q5_K = 13, GT_Q6_K = 14, GT_BF16 = 30,
};

/* activation kinds */
enum { ACT_F32 = 0, ACT_Q8_0 = 1, ACT_Q8_1 = 2, ACT_Q8_K = 3 };

#define QK 32
#define QKK 256
/* 32-blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): bytes per block; whether a min m follows the scale d */
#define Q32_BYTES(wt) ((wt) == GT_Q8_0 ? 34 : (wt) == GT_Q4_0 ? 18 : (wt) == GT_Q4_1 ? 20 : (wt) == GT_Q5_0 ? 22 : 24)
#define Q32_HASMIN(wt) ((wt) == GT_Q4_1 || (wt) == GT_Q5_1)
#define CUCA_ALIGN 64

/* 32-block activations: QA_LANES float/int lanes of d, c, s per block; blocks padded to a multiple of
 * QA_GROUP. With AVX-512 each group of 4 blocks stores its values as [first 16 of each block | last 16 of each
 * block] (the order pk_aq in matmul_p.c reads). With AVX2 a group of 4 blocks has one 8-lane vector each of
 * d, c, s: lane j and j + 4 for block j (the lanes its folded sums land in; c and s only in lane j). */
#if defined(CUCA_AVX512)
#define QA_LANES 4
#define QA_GROUP 4
#elif defined(CUCA_AVX2)
#define QA_LANES 2
#define QA_GROUP 4
#else
#define QA_LANES 8
#define QA_GROUP 2
#endif

typedef struct {
    int kind, wtype;
    int64_t M, n_in;
    /* ACT_F32: the caller's rows */
    const float *xf;
    /* quantized rows: row m starts at base + m * row_stride */
    uint8_t *base;
    size_t row_stride;
    int64_t nblk;   /* 32-blocks (ACT_Q8_0/1, padded to even) or 256-superblocks (ACT_Q8_K) per row */
    size_t off_d, off_c, off_s; /* byte offsets inside a row: scales, corrections, Q8_1 sums or bsums */
} cuca_act;

/* Q8_0/Q8_1 row layout, per 32-block b (L = QA_LANES): qs[32*b..] int8 (see QA_GROUP for the order);
 *   d[L*b .. L*b+L-1]  float: the block scale (fp16-rounded) repeated L times;
 *   c[L*b .. L*b+L-1]  int32: lane 0 = -off * sum(qs of block) (off = the weight code offset), others 0;
 *   s[L*b .. L*b+L-1]  float (Q8_1 only): lane 0 = fp16(d * sum(qs)), others 0.
 * Q8_K row layout, per 256-superblock b: qs[256*b ..] int8 and a 64-byte area bs[32*b ..] of block sums, both
 *   laid out as the weight format's kernel wants (cuca_qk_layout in matmul_k.c); d[b] float. */
#define ACT_QS(A, m) ((int8_t *)((A)->base + (size_t)(m) * (A)->row_stride))
#define ACT_D(A, m) ((float *)((A)->base + (size_t)(m) * (A)->row_stride + (A)->off_d))
#define ACT_C(A, m) ((int32_t *)((A)->base + (size_t)(m) * (A)->row_stride + (A)->off_c))
#define ACT_S(A, m) ((float *)((A)->base + (size_t)(m) * (A)->row_stride + (A)->off_s))
#define ACT_BS(A, m) ((int16_t *)((A)->base + (size_t)(m) * (A)->row_stride + (A)->off_s))

/* quantize.c */
int cuca_act_init(cuca_act *A, int wtype, const float *x, int64_t M, int64_t n_in);
/* quantize blocks [b_lo, b_hi) (of A->nblk, padding included) of row m; x is the row */
void cuca_act_quantize(cuca_act *A, const float *x, int64_t m, int64_t b_lo, int64_t b_hi);
void cuca_act_free(cuca_act *A);
/* one 32-block: q = round-half-away(x * 127/amax); d = fp16(amax/127); s = fp16(d_unrounded * sum(q)) */
void cuca_q8_block(const float *x, int8_t *q, float *d, float *s, int32_t *sum);
/* one 256-superblock, ggml's Q8_K: d = max/-127 (signed max by |.|), q = rint(x/d), 16 sums of 16 */
void cuca_q8k_block(const float *x, int8_t *q, float *d, int16_t *bsums);
int cuca_quantize_q8_0_f32(const float *x, int64_t M, int64_t n_in, int8_t *q, float *d);
int cuca_quantize_q8_1_f32(const float *x, int64_t M, int64_t n_in, int8_t *q, float *d, float *s);
int cuca_quantize_q8_k_f32(const float *x, int64_t M, int64_t n_in, int8_t *q, float *d, int16_t *bsums);

/* matmul_q.c: the code offset subtracted through the activation correction c (0 when the kernel does not use it) */
int cuca_qa_offset(int wtype);
/* matmul.c: out[M, n_out] = x[M, n_in] . W[n_out, n_in]^T for raw GGUF W */
int cuca_matmul_gguf_f32(const void *w, int wtype, int64_t n_out, int64_t n_in, const float *x, int64_t M,
                         float *out, int n_threads);
int cuca_getrows_gguf_f32(const void *w, int wtype, int64_t n_out, int64_t n_in, const int32_t *ids, int64_t M,
                          float *out);

/* A tile kernel: for the nw weight rows w + i * rb, out[i + (m0 + r) * ldo] for the x rows m0 + r, r < nr. */
typedef void (*cuca_tile_fn)(const uint8_t *w, size_t rb, int nw, const cuca_act *A, int64_t m0, int nr, float *out,
                             int64_t ldo);

/* Defines tile kernel `name` from an always-inline row kernel K(wt, w, A, m0, nr, out, ldo) specialised for every
 * tile height nr <= T (4, 8 or 17). */
#define CUCA_TILE_CASE(K, wt, n) \
    case n: for (int i_ = 0; i_ < nw; i_++) K(wt, w + (size_t)i_ * rb, A, m0, n, out + i_, ldo); break;
#define CUCA_TILE_CASES4(K, wt) \
    CUCA_TILE_CASE(K, wt, 1) CUCA_TILE_CASE(K, wt, 2) CUCA_TILE_CASE(K, wt, 3) CUCA_TILE_CASE(K, wt, 4)
#define CUCA_TILE_CASES8(K, wt) CUCA_TILE_CASES4(K, wt) \
    CUCA_TILE_CASE(K, wt, 5) CUCA_TILE_CASE(K, wt, 6) CUCA_TILE_CASE(K, wt, 7) CUCA_TILE_CASE(K, wt, 8)
#define CUCA_TILE_CASES17(K, wt) CUCA_TILE_CASES8(K, wt) \
    CUCA_TILE_CASE(K, wt, 9) CUCA_TILE_CASE(K, wt, 10) CUCA_TILE_CASE(K, wt, 11) CUCA_TILE_CASE(K, wt, 12) \
    CUCA_TILE_CASE(K, wt, 13) CUCA_TILE_CASE(K, wt, 14) CUCA_TILE_CASE(K, wt, 15) CUCA_TILE_CASE(K, wt, 16) \
    CUCA_TILE_CASE(K, wt, 17)
#define CUCA_TILE_FN(name, K, wt, T)                                                                              \
    static void name(const uint8_t *w, size_t rb, int nw, const cuca_act *A, int64_t m0, int nr, float *out,     \
                     int64_t ldo) {                                                                              \
        switch (nr) { CUCA_TILE_CASES##T(K, wt) default: break; }                                                 \
    }
/* Per format: the tile kernel and its largest tile (rows of x handled together). */
int cuca_tile_q(int wtype, cuca_tile_fn *fn, int *tile); /* matmul_q.c: Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 */
int cuca_tile_k(int wtype, cuca_tile_fn *fn, int *tile); /* matmul_k.c: Q4_K Q5_K Q6_K */
int cuca_tile_f(int wtype, cuca_tile_fn *fn, int *tile); /* matmul.c: F32 F16 BF16 */

/* matmul_p.c: row-interleaved weights. A group kernel computes out[r * ldo + i] for the nv <= R first rows i of
 * the packed group g (nb 32-blocks per row) and the x rows m0 + r, r < nr. */
typedef void (*cuca_pk_fn)(const uint8_t *g, int64_t nb, const cuca_act *A, int64_t m0, int nr, float *out,
                           int64_t ldo, int nv);
int cuca_pack_rows(int wtype); /* R, the rows interleaved by this build for wtype; 0: not packed */
/* w (n_out x n_in, raw GGUF) -> dst (the same byte count) in the packed layout */
int cuca_pack_gguf(const void *w, int wtype, int64_t n_out, int64_t n_in, void *dst);
/* pack.c: the same on up to n_threads threads (<= 0: every CPU); nbytes: w's size */
int cuca_pack_gguf_threads(const void *w, int wtype, int64_t n_out, int64_t n_in, size_t nbytes, void *dst,
                           int n_threads);
/* the group kernel (packed) and the same kernel on raw rows, gathered (raw: what cuca_tile_q hands out for every
 * format this build packs), with their tile height; either pointer may be NULL */
int cuca_tile_p(int wtype, cuca_pk_fn *packed, cuca_tile_fn *raw, int *tile);
/* matmul.c: out[M, n_out] = x . W^T for the first n_out <= n_rows rows of a packed n_rows x n_in tensor p */
int cuca_matmul_packed_f32(const void *p, int wtype, int64_t n_rows, int64_t n_in, int64_t n_out, const float *x,
                           int64_t M, float *out, int n_threads);
/* the output of a packed matmul split by weight rows: rows [lo[i], lo[i+1]) into out[i], (M, lo[i+1] - lo[i]) row-major;
 * lo[0] = 0, lo[n] = n_out, every lo[i] < n_out a multiple of the packing's rows (no group straddles two outputs) */
typedef struct {
    int n;
    float *const *out;
    const int64_t *lo;
} cuca_out_split;
int cuca_matmul_packed_split_f32(const void *p, int wtype, int64_t n_rows, int64_t n_in, const float *x, int64_t M,
                                 const cuca_out_split *S, int n_threads);

/* block.c: a gated MLP, out (M, n_embd) = down(act(gate(x)) * up(x)): gate and up packed into one buffer gu (rows
 * [0, n_ff) gate, [n_ff, 2 n_ff) up, of gu_rows >= 2 n_ff; n_ff a multiple of its packing's rows), act 0 silu / 1
 * gelu_tanh into g, u scratch (M, n_ff) (g ends as the down matmul's input), down packed (down_rows >= n_embd) or raw
 * (down_rows == n_embd): matmul_packed_split, act_mul and the down matmul one after another */
typedef struct {
    const void *gu, *down;
    int gu_wtype, down_wtype, down_packed, act, n_threads;
    int64_t gu_rows, down_rows, n_embd, n_ff, M;
    const float *x;
    float *g, *u, *out;
} cuca_mlp_args;
int cuca_mlp_f32(const cuca_mlp_args *a);

/* dequant.c: one row of n_in values; integer codes of one block (code offsets applied) */
int cuca_dequant_row(const uint8_t *w, int wtype, int64_t n_in, float *out);
void cuca_codes_q(int wtype, const uint8_t *blk, int32_t *code); /* 32 codes, natural order */
/* 256 codes, natural order; scale: 8 (Q4_K/Q5_K) or 16 (Q6_K) group scales; mn: 8 mins (Q4_K/Q5_K) */
void cuca_codes_k(int wtype, const uint8_t *blk, int32_t *code, int32_t *scale, int32_t *mn);

/* geometry: block elements and bytes, or 0 when unsupported */
int cuca_type_block(int wtype, int *bs, int *bytes);

/* ---- small helpers ---- */
/* Weight bytes are prefetched this far ahead of use: decode streams the weights from memory, and the hardware
 * prefetchers alone leave a third of the bandwidth unused. */
#define CUCA_PREFETCH 1024
#if defined(CUCA_AVX512) || defined(CUCA_AVX2)
static inline __attribute__((always_inline)) void cuca_prefetch(const void *p, int nbytes) {
    for (int o = 0; o < nbytes; o += 64) _mm_prefetch((const char *)p + CUCA_PREFETCH + o, _MM_HINT_T0);
}
#endif

static inline uint16_t cuca_ld16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t cuca_ld32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* bf16 bits -> float (exact: the high half of a float32) */
static inline float cuca_bf2f(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

#if defined(CUCA_AVX2) || defined(CUCA_AVX512)
/* the 8 lanes' sum in a fixed order (the AVX2 tile kernels' last step; matmul_pf.c's on both) */
static inline float cuca_hsum256(__m256 a) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    b = _mm_add_ps(b, _mm_movehl_ps(b, b));
    b = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(b);
}
#endif

static inline float cuca_h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, bits;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-08f; /* m * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* float -> fp16 bits, round to nearest even (as numpy and F16C do) */
static inline uint16_t cuca_f2h(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x, ax, sign;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* half subnormal: let the FPU round at 2^-24 granularity */
        float v, a;
        uint32_t vb;
        memcpy(&a, &ax, 4);
        v = a + 0.5f;
        memcpy(&vb, &v, 4);
        return (uint16_t)(sign | (vb - 0x3f000000u));
    }
    ax += 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((ax - (112u << 23)) >> 13));
#endif
}

/* Q4_K/Q5_K: the 12-byte field -> bytes sc0..7 (low 8) and mins mn0..7 (high 8) */
static inline void k4_scales(const uint8_t *p, uint64_t *sc, uint64_t *mn) {
    const uint32_t s0 = cuca_ld32(p), s1 = cuca_ld32(p + 4), s2 = cuca_ld32(p + 8);
    *sc = (uint64_t)(s0 & 0x3f3f3f3fu) | ((uint64_t)((s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u)) << 32);
    *mn = (uint64_t)(s1 & 0x3f3f3f3fu) | ((uint64_t)(((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u)) << 32);
}

#endif
