/* A short pass of a post-LayerNorm encoder (BERT's, DistilBERT's and MPNet's layer) in float32,
   one call for every layer.

   Built and loaded by short_kernel.py, which says why. The tokens of a pass are packed: row r
   of `x` is one token, and `cu` holds the sequences' bounds (cu[0] = 0, cu[n] = rows); attention
   stays within each sequence.

   Each output value of a linear layer is summed over its inputs in order, by one FMA chain: a
   token's values do not depend on the other rows of its pass nor on the thread count. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* glibc's vector erf (libmvec), as accurate as its scalar erff. */
__m512 _ZGVeN16v_erff(__m512);

enum { PANEL = 48, ROWS = 8 };

typedef struct {
    /* Weights in panels of PANEL output columns: [ceil(out / PANEL)][in][PANEL], the columns
       past `out` zero. Q, K and V are one linear of 3 * hidden outputs, in that order. */
    const float *qkv, *qkv_bias;
    const float *attn_out, *attn_out_bias;
    const float *norm1, *norm1_bias;
    const float *ffn_in, *ffn_in_bias;
    const float *ffn_out, *ffn_out_bias;
    const float *norm2, *norm2_bias;
    float eps1, eps2;
} Layer;

static inline __mmask16 lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

static inline __m512 gelu(__m512 v) {
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    __m512 e = _ZGVeN16v_erff(_mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)));
    return _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e));
}

/* out[rows, cols] = a[rows, k] @ panel + bias (+ res), GELU'd if asked; rows <= ROWS,
   cols <= PANEL. Rows past `rows` repeat the last one: computed, never stored. */
static void block(const float *a, int64_t lda, int rows, const float *panel, int64_t k,
                  const float *bias, const float *res, float *out, int64_t ld, int64_t cols,
                  int act) {
    __mmask16 m0 = lanes(cols), m1 = lanes(cols - 16), m2 = lanes(cols - 32);
    __m512 b0 = _mm512_maskz_loadu_ps(m0, bias);
    __m512 b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    __m512 b2 = _mm512_maskz_loadu_ps(m2, bias + 32);
    __m512 c[ROWS][3];
    const float *row[ROWS];
    for (int r = 0; r < ROWS; r++) {
        row[r] = a + (r < rows ? r : rows - 1) * lda;
        c[r][0] = b0;
        c[r][1] = b1;
        c[r][2] = b2;
    }
    for (int64_t i = 0; i < k; i++) {
        const float *p = panel + i * PANEL;
        __m512 w0 = _mm512_loadu_ps(p), w1 = _mm512_loadu_ps(p + 16);
        __m512 w2 = _mm512_loadu_ps(p + 32);
        _mm_prefetch((const char *)(p + 8 * PANEL), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + 8 * PANEL + 32), _MM_HINT_T0);
#pragma GCC unroll 8
        for (int r = 0; r < ROWS; r++) {
            __m512 v = _mm512_set1_ps(row[r][i]);
            c[r][0] = _mm512_fmadd_ps(v, w0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(v, w1, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(v, w2, c[r][2]);
        }
    }
    for (int r = 0; r < rows; r++) {
        float *o = out + r * ld;
        if (res) {
            const float *s = res + r * ld;
            c[r][0] = _mm512_add_ps(c[r][0], _mm512_maskz_loadu_ps(m0, s));
            c[r][1] = _mm512_add_ps(c[r][1], _mm512_maskz_loadu_ps(m1, s + 16));
            c[r][2] = _mm512_add_ps(c[r][2], _mm512_maskz_loadu_ps(m2, s + 32));
        }
        if (act) {
            c[r][0] = gelu(c[r][0]);
            c[r][1] = gelu(c[r][1]);
            c[r][2] = gelu(c[r][2]);
        }
        _mm512_mask_storeu_ps(o, m0, c[r][0]);
        _mm512_mask_storeu_ps(o + 16, m1, c[r][1]);
        _mm512_mask_storeu_ps(o + 32, m2, c[r][2]);
    }
}

/* A linear layer over every row, its panels shared out among the team. */
static void linear(const float *a, int64_t rows, int64_t k, const float *w, const float *bias,
                   int64_t n, const float *res, float *out, int act) {
    int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; p++) {
        int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        for (int64_t r = 0; r < rows; r += ROWS) {
            int n_rows = rows - r < ROWS ? (int)(rows - r) : ROWS;
            block(a + r * k, k, n_rows, w + p * k * PANEL, k, bias + p * PANEL,
                  res ? res + r * n + p * PANEL : 0, out + r * n + p * PANEL, n, cols, act);
        }
    }
}

static inline float dot(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = lanes(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i),
                              acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Softmax attention of each sequence's tokens to each other, one (sequence, head) per task.
   `bias` (or NULL): an additive score bias, `[heads][span][span]`, that depends on j - i only
   (MPNet's relative positions), so every sequence reads its top-left corner. */
static void attention(const float *qkv, const int32_t *cu, int64_t seqs, int64_t hidden,
                      int64_t heads, const float *bias, int64_t span, float *ctx) {
    int64_t dim = hidden / heads, stride = 3 * hidden;
    float scale = 1.0f / sqrtf((float)dim);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < seqs * heads; task++) {
        int64_t s = task / heads, h = task % heads;
        int64_t start = cu[s], len = cu[s + 1] - cu[s];
        const float *q = qkv + start * stride + h * dim, *k = q + hidden, *v = q + 2 * hidden;
        float p[len];
        for (int64_t i = 0; i < len; i++) {
            float top = -INFINITY, sum = 0.0f;
            const float *add = bias ? bias + (h * span + i) * span : 0;
            for (int64_t j = 0; j < len; j++) {
                p[j] = dot(q + i * stride, k + j * stride, dim) * scale;
                if (add) p[j] += add[j];
                top = p[j] > top ? p[j] : top;
            }
            for (int64_t j = 0; j < len; j++) {
                p[j] = expf(p[j] - top);
                sum += p[j];
            }
            float inv = 1.0f / sum;
            float *o = ctx + (start + i) * hidden + h * dim;
            for (int64_t d = 0; d < dim; d += 16) {
                __mmask16 m = lanes(dim - d);
                __m512 acc = _mm512_setzero_ps();
                for (int64_t j = 0; j < len; j++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j] * inv),
                                          _mm512_maskz_loadu_ps(m, v + j * stride + d), acc);
                _mm512_mask_storeu_ps(o + d, m, acc);
            }
        }
    }
}

static void layer_norm(const float *in, int64_t rows, int64_t n, const float *w, const float *b,
                       float eps, float *out) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = in + r * n;
        float *y = out + r * n;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16)
            acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(lanes(n - i), x + i));
        __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(acc) / (float)n);
        acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = lanes(n - i);
            __m512 d = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), mean);
            acc = _mm512_fmadd_ps(d, d, acc);
        }
        __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps));
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = lanes(n - i);
            __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mean), inv);
            __m512 v = _mm512_fmadd_ps(d, _mm512_maskz_loadu_ps(m, w + i),
                                       _mm512_maskz_loadu_ps(m, b + i));
            _mm512_mask_storeu_ps(y + i, m, v);
        }
    }
}

/* Runs `n_layers` layers over x[rows, hidden] in place, every layer adding `bias` (or NULL, see
   attention; `span` at least the longest sequence) to its scores. `scratch` holds
   rows * (5 * hidden + inner) floats. */
void vp_post_norm_encoder(const Layer *layers, int64_t n_layers, float *x, int64_t rows,
                          int64_t hidden, int64_t inner, int64_t heads, const int32_t *cu,
                          int64_t seqs, const float *bias, int64_t span, float *scratch,
                          int threads) {
    float *qkv = scratch, *ctx = qkv + rows * 3 * hidden, *sum = ctx + rows * hidden;
    float *inner_out = sum + rows * hidden;
#pragma omp parallel num_threads(threads)
    for (int64_t l = 0; l < n_layers; l++) {
        const Layer *L = layers + l;
        linear(x, rows, hidden, L->qkv, L->qkv_bias, 3 * hidden, 0, qkv, 0);
        attention(qkv, cu, seqs, hidden, heads, bias, span, ctx);
        linear(ctx, rows, hidden, L->attn_out, L->attn_out_bias, hidden, x, sum, 0);
        layer_norm(sum, rows, hidden, L->norm1, L->norm1_bias, L->eps1, x);
        linear(x, rows, hidden, L->ffn_in, L->ffn_in_bias, inner, 0, inner_out, 1);
        linear(inner_out, rows, inner, L->ffn_out, L->ffn_out_bias, hidden, x, sum, 0);
        layer_norm(sum, rows, hidden, L->norm2, L->norm2_bias, L->eps2, x);
    }
}
