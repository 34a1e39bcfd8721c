/* Block decoding and row dequantization (embedding lookups). Values are computed in float32 with the same
 * operation order as cuca.quants.dequantize, so both agree bit for bit. */
#include "qmatmul.h"

int cuca_type_block(int wtype, int *bs, int *bytes) {
    switch (wtype) {
    case GT_F32: *bs = 1; *bytes = 4; return 1;
    case GT_F16: case GT_BF16: *bs = 1; *bytes = 2; return 1;
    case GT_Q8_0: *bs = QK; *bytes = 34; return 1;
    case GT_Q4_0: *bs = QK; *bytes = 18; return 1;
    case GT_Q4_1: *bs = QK; *bytes = 20; return 1;
    case GT_Q5_0: *bs = QK; *bytes = 22; return 1;
    case GT_Q5_1: *bs = QK; *bytes = 24; return 1;
    case GT_Q4_K: *bs = QKK; *bytes = 144; return 1;
    case GT_Q5_K: *bs = QKK; *bytes = 176; return 1;
    case GT_Q6_K: *bs = QKK; *bytes = 210; return 1;
    default: *bs = 0; *bytes = 0; return 0;
    }
}

/* 32-blocks: Q8_0 d|qs[32]; Q4_0 d|qs[16]; Q4_1 d|m|qs[16]; Q5_0 d|qh[4]|qs[16]; Q5_1 d|m|qh[4]|qs[16] */
void cuca_codes_q(int wt, const uint8_t *blk, int32_t *code) {
    if (wt == GT_Q8_0) {
        for (int j = 0; j < QK; j++) code[j] = (int8_t)blk[2 + j];
        return;
    }
    const int has_min = wt == GT_Q4_1 || wt == GT_Q5_1, five = wt == GT_Q5_0 || wt == GT_Q5_1;
    const uint8_t *qs = blk + 2 + (has_min ? 2 : 0) + (five ? 4 : 0);
    const uint32_t qh = five ? cuca_ld32(blk + (has_min ? 4 : 2)) : 0;
    const int off = has_min ? 0 : five ? 16 : 8;
    for (int j = 0; j < 16; j++) {
        code[j] = (int32_t)((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - off;
        code[j + 16] = (int32_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - off;
    }
}

/* Q4_K d|dmin|scales[12]|qs[128]; Q5_K d|dmin|scales[12]|qh[32]|qs[128]; Q6_K ql[128]|qh[64]|sc[16]|d */
void cuca_codes_k(int wt, const uint8_t *b, int32_t *code, int32_t *scale, int32_t *mn) {
    if (wt == GT_Q6_K) {
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *ql = b + 64 * h, hb = b[128 + 32 * h + l];
                int32_t *c = code + 128 * h + l;
                c[0] = (int32_t)((ql[l] & 0x0F) | ((hb & 3) << 4)) - 32;
                c[32] = (int32_t)((ql[l + 32] & 0x0F) | (((hb >> 2) & 3) << 4)) - 32;
                c[64] = (int32_t)((ql[l] >> 4) | (((hb >> 4) & 3) << 4)) - 32;
                c[96] = (int32_t)((ql[l + 32] >> 4) | (((hb >> 6) & 3) << 4)) - 32;
            }
        for (int j = 0; j < 16; j++) scale[j] = (int8_t)b[192 + j];
        return;
    }
    const uint8_t *qs = b + (wt == GT_Q5_K ? 48 : 16), *qh = b + 16;
    uint64_t sc, m;
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) {
            int32_t v = (j & 1) ? qs[32 * (j >> 1) + l] >> 4 : qs[32 * (j >> 1) + l] & 0x0F;
            if (wt == GT_Q5_K) v |= ((qh[l] >> j) & 1) << 4;
            code[32 * j + l] = v;
        }
    k4_scales(b + 4, &sc, &m);
    for (int j = 0; j < 8; j++) {
        scale[j] = (int32_t)((sc >> (8 * j)) & 0xff);
        mn[j] = (int32_t)((m >> (8 * j)) & 0xff);
    }
}

/* w: one row (n_in values of type wtype) -> out[n_in] float32 */
int cuca_dequant_row(const uint8_t *w, int wtype, int64_t n_in, float *out) {
    int bs, bytes;
    if (!cuca_type_block(wtype, &bs, &bytes)) return CUCA_EUNSUPPORTED;
    if (n_in % bs) return CUCA_EINVAL;
    if (wtype == GT_F32) {
        memcpy(out, w, (size_t)n_in * 4);
    } else if (wtype == GT_F16) {
        for (int64_t k = 0; k < n_in; k++) out[k] = cuca_h2f(cuca_ld16(w + 2 * k));
    } else if (wtype == GT_BF16) {
        for (int64_t k = 0; k < n_in; k++) {
            uint32_t bits = (uint32_t)cuca_ld16(w + 2 * k) << 16;
            memcpy(out + k, &bits, 4);
        }
    } else if (bs == QK) {
        int32_t code[QK];
        for (int64_t b = 0; b < n_in / QK; b++) {
            const uint8_t *blk = w + b * bytes;
            const float d = cuca_h2f(cuca_ld16(blk));
            cuca_codes_q(wtype, blk, code);
            if (wtype == GT_Q4_1 || wtype == GT_Q5_1) {
                const float m = cuca_h2f(cuca_ld16(blk + 2));
                for (int j = 0; j < QK; j++) out[QK * b + j] = d * (float)code[j] + m;
            } else {
                for (int j = 0; j < QK; j++) out[QK * b + j] = d * (float)code[j];
            }
        }
    } else {
        int32_t code[QKK], scale[16], mn[8];
        for (int64_t b = 0; b < n_in / QKK; b++) {
            const uint8_t *blk = w + b * bytes;
            float *o = out + QKK * b;
            cuca_codes_k(wtype, blk, code, scale, mn);
            if (wtype == GT_Q6_K) {
                const float d = cuca_h2f(cuca_ld16(blk + 208));
                for (int j = 0; j < 16; j++) {
                    const float ds = d * (float)scale[j];
                    for (int l = 0; l < 16; l++) o[16 * j + l] = ds * (float)code[16 * j + l];
                }
            } else {
                const float d = cuca_h2f(cuca_ld16(blk)), dmin = cuca_h2f(cuca_ld16(blk + 2));
                for (int j = 0; j < 8; j++) {
                    const float ds = d * (float)scale[j], dm = dmin * (float)mn[j];
                    for (int l = 0; l < 32; l++) o[32 * j + l] = ds * (float)code[32 * j + l] - dm;
                }
            }
        }
    }
    return CUCA_OK;
}

int cuca_getrows_gguf_f32(const void *w, int wtype, int64_t n_out, int64_t n_in, const int32_t *ids, int64_t M,
                          float *out) {
    int bs, bytes;
    if (!cuca_type_block(wtype, &bs, &bytes)) return CUCA_EUNSUPPORTED;
    if (n_in <= 0 || n_in % bs || n_out <= 0 || M < 0) return CUCA_EINVAL;
    const size_t rb = (size_t)(n_in / bs) * (size_t)bytes;
    for (int64_t m = 0; m < M; m++)
        if (ids[m] < 0 || ids[m] >= n_out) return CUCA_EINVAL;
    for (int64_t m = 0; m < M; m++)
        cuca_dequant_row((const uint8_t *)w + (size_t)ids[m] * rb, wtype, n_in, out + m * n_in);
    return CUCA_OK;
}
