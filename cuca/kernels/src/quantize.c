/* Activation quantization to ggml's 8-bit formats (Q8_0 / Q8_1 per 32 values, Q8_K per 256 values), both in
 * natural layout (exposed for tests) and into the per-call buffers the matmul kernels read (qmatmul.h). */
#include <math.h>
#include <stdlib.h>
#include "qmatmul.h"

int cuca_qk_layout(int wtype); /* matmul_k.c */

/* ---- one 32-block: d = fp16(amax/127), q = x * (127/amax) rounded to nearest, ties to even (as ggml's x86 path) */
void cuca_q8_block(const float *x, int8_t *q, float *d, float *s, int32_t *sum) {
    float amax = 0.0f, draw, id;
    int32_t tot = 0;
#if defined(CUCA_AVX512)
    const __m512 sgn = _mm512_set1_ps(-0.0f);
    __m512 v[2];
    __m512i acc = _mm512_setzero_si512();
    v[0] = _mm512_loadu_ps(x);
    v[1] = _mm512_loadu_ps(x + 16);
    amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sgn, v[0]), _mm512_andnot_ps(sgn, v[1])));
    draw = amax / 127.0f;
    id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int h = 0; h < 2; h++) {
        __m512 t = _mm512_mul_ps(v[h], _mm512_set1_ps(id));
        __m512i i = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        acc = _mm512_add_epi32(acc, i);
        _mm_storeu_si128((__m128i *)(q + 16 * h), _mm512_cvtepi32_epi8(i));
    }
    tot = _mm512_reduce_add_epi32(acc);
#elif defined(CUCA_AVX2)
    const __m256 sgn = _mm256_set1_ps(-0.0f);
    __m256 v[4], m;
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 4; h++) v[h] = _mm256_loadu_ps(x + 8 * h);
    m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sgn, v[0]), _mm256_andnot_ps(sgn, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sgn, v[2]), _mm256_andnot_ps(sgn, v[3])));
    {
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        amax = _mm_cvtss_f32(m4);
    }
    draw = amax / 127.0f;
    id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int h = 0; h < 4; h++) {
        __m256 t = _mm256_mul_ps(v[h], _mm256_set1_ps(id));
        __m256i i = _mm256_cvtps_epi32(_mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        int32_t tmp[8];
        acc = _mm256_add_epi32(acc, i);
        _mm256_storeu_si256((__m256i *)tmp, i);
        for (int l = 0; l < 8; l++) q[8 * h + l] = (int8_t)tmp[l];
    }
    {
        int32_t tmp[8];
        _mm256_storeu_si256((__m256i *)tmp, acc);
        for (int l = 0; l < 8; l++) tot += tmp[l];
    }
#else
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    draw = amax / 127.0f;
    id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < QK; j++) {
        q[j] = (int8_t)nearbyintf(x[j] * id);
        tot += q[j];
    }
#endif
    *d = cuca_h2f(cuca_f2h(draw));
    if (s) *s = cuca_h2f(cuca_f2h(draw * (float)tot));
    if (sum) *sum = tot;
}

/* ---- one 256-superblock, ggml's Q8_K: scale from the signed value of largest magnitude (first one) ---- */
void cuca_q8k_block(const float *x, int8_t *q, float *d, int16_t *bsums) {
    float amax = 0.0f, vmax = 0.0f, iscale;
#if defined(CUCA_AVX512)
    const __m512 sgn = _mm512_set1_ps(-0.0f);
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < QKK; j += 16) m = _mm512_max_ps(m, _mm512_andnot_ps(sgn, _mm512_loadu_ps(x + j)));
    amax = _mm512_reduce_max_ps(m);
    for (int j = 0; j < QKK; j += 16) {
        __mmask16 k = _mm512_cmp_ps_mask(_mm512_andnot_ps(sgn, _mm512_loadu_ps(x + j)), _mm512_set1_ps(amax),
                                         _CMP_EQ_OQ);
        if (k) {
            vmax = x[j + __builtin_ctz(k)];
            break;
        }
    }
#else
    for (int j = 0; j < QKK; j++) {
        float a = fabsf(x[j]);
        if (a > amax) {
            amax = a;
            vmax = x[j];
        }
    }
#endif
    if (amax == 0.0f) {
        memset(q, 0, QKK);
        memset(bsums, 0, 16 * sizeof(int16_t));
        *d = 0.0f;
        return;
    }
    iscale = -127.0f / vmax;
#if defined(CUCA_AVX512)
    for (int j = 0; j < QKK; j += 16) {
        __m512 t = _mm512_mul_ps(_mm512_set1_ps(iscale), _mm512_loadu_ps(x + j));
        __m512i i = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        i = _mm512_min_epi32(i, _mm512_set1_epi32(127));
        bsums[j / 16] = (int16_t)_mm512_reduce_add_epi32(i);
        _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtepi32_epi8(i));
    }
#else
    for (int j = 0; j < QKK; j += 16) {
        int tot = 0;
        for (int l = 0; l < 16; l++) {
            /* round to nearest even through the 1.5 * 2^23 magic constant (|value| <= 128 here) */
            float t = iscale * x[j + l] + 12582912.0f;
            int32_t bits, v;
            memcpy(&bits, &t, 4);
            v = (bits & 0x007fffff) - 0x00400000;
            if (v > 127) v = 127;
            q[j + l] = (int8_t)v;
            tot += v;
        }
        bsums[j / 16] = (int16_t)tot;
    }
#endif
    *d = 1.0f / iscale;
}

/* ---- natural-layout quantizers (tests, inspection) ---- */
int cuca_quantize_q8_0_f32(const float *x, int64_t M, int64_t n_in, int8_t *q, float *d) {
    if (M < 0 || n_in <= 0 || n_in % QK) return CUCA_EINVAL;
    for (int64_t b = 0; b < M * (n_in / QK); b++) cuca_q8_block(x + QK * b, q + QK * b, d + b, NULL, NULL);
    return CUCA_OK;
}

int cuca_quantize_q8_1_f32(const float *x, int64_t M, int64_t n_in, int8_t *q, float *d, float *s) {
    if (M < 0 || n_in <= 0 || n_in % QK) return CUCA_EINVAL;
    for (int64_t b = 0; b < M * (n_in / QK); b++) cuca_q8_block(x + QK * b, q + QK * b, d + b, s + b, NULL);
    return CUCA_OK;
}

int cuca_quantize_q8_k_f32(const float *x, int64_t M, int64_t n_in, int8_t *q, float *d, int16_t *bsums) {
    if (M < 0 || n_in <= 0 || n_in % QKK) return CUCA_EINVAL;
    for (int64_t b = 0; b < M * (n_in / QKK); b++) cuca_q8k_block(x + QKK * b, q + QKK * b, d + b, bsums + 16 * b);
    return CUCA_OK;
}

/* ---- per-call activation buffers ---- */
static size_t up64(size_t v) { return (v + CUCA_ALIGN - 1) & ~(size_t)(CUCA_ALIGN - 1); }

int cuca_act_init(cuca_act *A, int wtype, const float *x, int64_t M, int64_t n_in) {
    size_t row = 0;
    memset(A, 0, sizeof(*A));
    A->wtype = wtype;
    A->M = M;
    A->n_in = n_in;
    A->xf = x;
    switch (wtype) {
    case GT_F32: case GT_F16: case GT_BF16:
        A->kind = ACT_F32;
        return CUCA_OK;
    case GT_Q8_0: case GT_Q4_0: case GT_Q5_0: case GT_Q4_1: case GT_Q5_1:
        if (n_in % QK) return CUCA_EINVAL;
        A->kind = (wtype == GT_Q4_1 || wtype == GT_Q5_1) ? ACT_Q8_1 : ACT_Q8_0;
        A->nblk = (n_in / QK + QA_GROUP - 1) / QA_GROUP * QA_GROUP;
        A->off_d = up64((size_t)A->nblk * QK);
        A->off_c = A->off_d + up64((size_t)A->nblk * QA_LANES * sizeof(float));
        A->off_s = A->off_c + up64((size_t)A->nblk * QA_LANES * sizeof(int32_t));
        row = A->off_s + (A->kind == ACT_Q8_1 ? up64((size_t)A->nblk * QA_LANES * sizeof(float)) : 0);
        break;
    case GT_Q4_K: case GT_Q5_K: case GT_Q6_K:
        if (n_in % QKK) return CUCA_EINVAL;
        A->kind = ACT_Q8_K;
        A->nblk = n_in / QKK;
        A->off_s = up64((size_t)A->nblk * QKK);
        A->off_d = A->off_s + up64((size_t)A->nblk * 32 * sizeof(int16_t));
        row = A->off_d + up64((size_t)A->nblk * sizeof(float));
        break;
    default:
        return CUCA_EUNSUPPORTED;
    }
    A->row_stride = row;
    A->base = aligned_alloc(CUCA_ALIGN, row * (size_t)(M > 0 ? M : 1));
    return A->base ? CUCA_OK : CUCA_ENOMEM;
}

void cuca_act_free(cuca_act *A) {
    free(A->base);
    A->base = NULL;
}

void cuca_act_quantize(cuca_act *A, const float *x, int64_t m, int64_t b_lo, int64_t b_hi) {
    int8_t *qs = ACT_QS(A, m);
    if (A->kind == ACT_F32) return;
    if (A->kind == ACT_Q8_K) {
        int16_t *bs = ACT_BS(A, m);
        float *d = ACT_D(A, m);
        const int lay = cuca_qk_layout(A->wtype);
        for (int64_t b = b_lo; b < b_hi; b++) {
            int8_t tmp[QKK], *q = qs + QKK * b;
            int16_t sums[16];
            void *bsb = bs + 32 * b;
            cuca_q8k_block(x + QKK * b, lay == 1 || lay == 2 ? tmp : q, d + b, sums);
            memset(bsb, 0, 64);
            if (lay == 0) {
                memcpy(bsb, sums, sizeof(sums));
            } else if (lay == 3) { /* natural codes; per 16-group i the int16 pair -32 * (sums of values 4k + {0, 1}
                                    * and 4k + {2, 3}, k < 4) */
                for (int i = 0; i < 16; i++) {
                    int32_t lo = 0, hi = 0;
                    for (int k = 0; k < 4; k++) {
                        lo += q[16 * i + 4 * k] + q[16 * i + 4 * k + 1];
                        hi += q[16 * i + 4 * k + 2] + q[16 * i + 4 * k + 3];
                    }
                    ((uint32_t *)bsb)[i] = (uint32_t)(uint16_t)(int16_t)(-32 * lo) |
                                           (uint32_t)(uint16_t)(int16_t)(-32 * hi) << 16;
                }
            } else if (lay == 1) { /* byte 64k + 8i + t <- value 32i + 8k + t; float group sums in even lanes */
                for (int k = 0; k < 4; k++)
                    for (int i = 0; i < 8; i++) memcpy(q + 64 * k + 8 * i, tmp + 32 * i + 8 * k, 8);
                for (int i = 0; i < 8; i++) ((float *)bsb)[2 * i] = (float)(sums[2 * i] + sums[2 * i + 1]);
            } else { /* byte 64k + 4i + t <- value 16i + 4k + t; -32 * group sums */
                for (int k = 0; k < 4; k++)
                    for (int i = 0; i < 16; i++) memcpy(q + 64 * k + 4 * i, tmp + 16 * i + 4 * k, 4);
                for (int i = 0; i < 16; i++) ((int32_t *)bsb)[i] = -32 * sums[i];
            }
        }
        return;
    }
    {
        float *d = ACT_D(A, m), *s = A->kind == ACT_Q8_1 ? ACT_S(A, m) : NULL;
        int32_t *c = ACT_C(A, m);
        const int64_t nb = A->n_in / QK;
        const int32_t off = cuca_qa_offset(A->wtype);
        for (int64_t b = b_lo; b < b_hi; b++) {
            float db = 0.0f, sb = 0.0f;
            int32_t tot = 0;
            int8_t tmp[QK];
            if (b < nb)
                cuca_q8_block(x + QK * b, tmp, &db, s ? &sb : NULL, &tot);
            else
                memset(tmp, 0, QK);
#if defined(CUCA_AVX512) /* the group-interleaved codes (qmatmul.h) */
            {
                int8_t *grp = qs + QK * (b & ~(int64_t)3);
                memcpy(grp + 16 * (b & 3), tmp, 16);
                memcpy(grp + 64 + 16 * (b & 3), tmp + 16, 16);
            }
#else
            memcpy(qs + QK * b, tmp, QK);
#endif
#if defined(CUCA_AVX2) /* lane j and j + 4 of the group's vector (qmatmul.h) */
            {
                const int64_t g = 8 * (b >> 2), j = b & 3;
                d[g + j] = d[g + j + 4] = db;
                c[g + j] = -off * tot;
                c[g + j + 4] = 0;
                if (s) {
                    s[g + j] = sb;
                    s[g + j + 4] = 0.0f;
                }
            }
#else
            for (int l = 0; l < QA_LANES; l++) {
                d[QA_LANES * b + l] = db;
                c[QA_LANES * b + l] = 0;
                if (s) s[QA_LANES * b + l] = 0.0f;
            }
            c[QA_LANES * b] = -off * tot;
            if (s) s[QA_LANES * b] = sb;
#endif
        }
    }
}
