/* A short pass of a post-LayerNorm encoder (BERT's, DistilBERT's and MPNet's layer) in float32,
   one call for every layer; with bfloat16 weights, the linears multiply bfloat16 inputs by them
   on AMX's tiles (float32 sums), and the values between them, kept in float32, are rounded to
   bfloat16 where the bfloat16 model's own ops round theirs.

   Built and loaded by short_kernel.py, which says why. The tokens of a pass are packed: row r
   of `x` is one token, and `cu` holds the sequences' bounds (cu[0] = 0, cu[n] = rows); attention
   stays within each sequence.

   Each output value of a linear layer is summed over its inputs in order, by one FMA chain (in
   bfloat16, one chain of tile products): a token's values do not depend on the other rows of its
   pass nor on the thread count.

   The library also holds ops that longer passes call from torch: a float32 model's attention
   (`vp_attention_f32`, f32_kernels.py says why), and a bfloat16 model's attention on AMX
   (`vp_attention_bf16`) or, without AMX, on AVX512-BF16's dot products
   (`vp_attention_bf16_dot`) or in float32 on its widened rows (`vp_attention_bf16_f32`), and its
   residual add with LayerNorm (`vp_add_norm_bf16`, bf16_kernels.py); an int8 model's attention
   on the dot products, its float32 rows rounded (`vp_attention_f32_dot`, int8.py), its linears'
   row quantization and finish (`vp_int8_quantize_rows`, `vp_int8_finish`), and its passes, of
   any length, on AVX512-VNNI (`vp_int8_post_norm_encoder`, int8_kernel.py). */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* glibc's vector exp (libmvec). */
__m512 _ZGVeN16v_expf(__m512);

enum { PANEL = 48, ROWS = 8 };

typedef struct {
    /* Weights in panels of PANEL output columns, the columns past `out` zero: float32 ones as
       [ceil(out / PANEL)][in][PANEL], and so bfloat16 ones on the float32 path (`half`);
       bfloat16 ones on AMX as [ceil(out / PANEL)][pairs][PANEL][2], each column's inputs in
       pairs (2i, 2i + 1), `in` padded with zero inputs to a multiple of TILE_K. Q, K and V
       are one linear of 3 * hidden outputs, in that order. */
    const void *qkv;
    const float *qkv_bias;
    const void *attn_out;
    const float *attn_out_bias;
    const float *norm1, *norm1_bias;
    const void *ffn_in;
    const float *ffn_in_bias;
    const void *ffn_out;
    const float *ffn_out_bias;
    const float *norm2, *norm2_bias;
    float eps1, eps2;
} Layer;

/* 16 bfloat16 values as float32 (exactly). */
static inline __m512 widened(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __mmask16 lanes(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* v rounded to bfloat16's precision, to nearest even (kept in float32). */
static inline __m512 to_bf16_value(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
    return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* erf(x) for |x| < 4 as 16 polynomials of degree 6, one for each quarter of [0, 4), in x less
   the quarter's start (each fitted to erf at Chebyshev nodes of its quarter; the first has no
   constant term, erf being odd); 1 from 4 on, where float32's erf is 1. Within 6.4e-8 of erf
   (its float32 rounding's 6e-8). */
static const float ERF_C[7][16] __attribute__((aligned(64))) = {
    {0.0f, 0.276326388f, 0.520499885f, 0.711155653f,
     0.842700779f, 0.92290014f, 0.966105163f, 0.986671686f,
     0.995322287f, 0.998537302f, 0.999593019f, 0.999899387f,
     0.999977887f, 0.999995708f, 0.999999285f, 0.999999881f},
    {1.12837923f, 1.06001413f, 0.878782511f, 0.642931044f,
     0.415107459f, 0.236521125f, 0.11893031f, 0.0527750105f,
     0.0206669904f, 0.00714231888f, 0.00217828224f, 0.000586275652f,
     0.000139252239f, 2.91887118e-05f, 5.39932853e-06f, 8.81406777e-07f},
    {-3.91273625e-06f, -0.265004784f, -0.439388841f, -0.482194811f,
     -0.415105581f, -0.295651555f, -0.178396568f, -0.0923571885f,
     -0.0413343497f, -0.0160702094f, -0.00544558559f, -0.00161216105f,
     -0.000417706906f, -9.4843941e-05f, -1.88916074e-05f, -3.30371677e-06f},
    {-0.37602511f, -0.309139192f, -0.146521032f, 0.0267050005f,
     0.138322338f, 0.16753906f, 0.138779029f, 0.0901802108f,
     0.0482323021f, 0.0217244644f, 0.00834709685f, 0.00275793578f,
     0.000787827885f, 0.000195310829f, 4.21386503e-05f, 7.92887477e-06f},
    {-0.00121132389f, 0.126589447f, 0.183713377f, 0.151647031f,
     0.0697358251f, -0.00618398283f, -0.0449049659f, -0.0483677574f,
     -0.0345556624f, -0.019084258f, -0.00858839974f, -0.00322972867f,
     -0.00102952903f, -0.000280700217f, -6.58616409e-05f, -1.33567264e-05f},
    {0.120205522f, 0.0826435238f, 0.00381725025f, -0.058890529f,
     -0.0725730509f, -0.0471651405f, -0.0131006464f, 0.00821580086f,
     0.0137779107f, 0.0106821833f, 0.00592068816f, 0.00258592353f,
     0.000926102453f, 0.000277672807f, 7.05778439e-05f, 1.53327346e-05f},
    {-0.0222560801f, -0.0497564971f, -0.0411363915f, -0.0104248635f,
     0.0153491469f, 0.0220283009f, 0.0143965222f, 0.00414962601f,
     -0.00177826604f, -0.00309547363f, -0.00224569859f, -0.00114428799f,
     -0.000455787143f, -0.00014812396f, -4.01577745e-05f, -9.20311959e-06f},
};

/* GELU (erf) with the erf above, for every path of the library. glibc's vector erff, a call
   that spilled the 24 sums of the linear it finishes, took up to 40 of the 150 us of
   all-MiniLM-L6-v2's FFN input linear on a 16-token pass; the int8 finish's erf by Abramowitz
   and Stegun's 7.1.26 (a division and an exponential, 1.5e-7 from erf) 1.1x as long on 2,048
   x 1,536 values. */
static inline __m512 gelu(__m512 v) {
    __m512 u = _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f));
    __m512 a = _mm512_min_ps(_mm512_abs_ps(u), _mm512_set1_ps(4.0f));
    __m512i at = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(4.0f))),
                                  _mm512_set1_epi32(15));
    __m512 t = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(at), _mm512_set1_ps(0.25f), a);
    __m512 e = _mm512_permutexvar_ps(at, _mm512_load_ps(ERF_C[6]));
    for (int d = 5; d >= 0; d--)
        e = _mm512_fmadd_ps(e, t, _mm512_permutexvar_ps(at, _mm512_load_ps(ERF_C[d])));
    e = _mm512_min_ps(e, _mm512_set1_ps(1.0f));
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(u), _mm512_set1_epi32((int)0x80000000u));
    e = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(e), sign));
    __m512 half = _mm512_mul_ps(v, _mm512_set1_ps(0.5f));
    return _mm512_fmadd_ps(half, e, half);
}

/* `gelu` over n values, for the tests to hold it to erf. */
void vp_gelu_f32(const float *x, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = lanes(n - i);
        _mm512_mask_storeu_ps(out + i, m, gelu(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* Writes c's first `rows` rows to out[rows, cols], the residual added and GELU'd if asked;
   with `rnd`, every step's values rounded to bfloat16 as a bfloat16 model's ops round them (the
   sums with their bias, the residual sum, the GELU). */
static inline void finish(__m512 (*c)[3], int rows, const float *res, float *out, int64_t ld,
                          int64_t cols, int act, int rnd) {
    __mmask16 m[3] = {lanes(cols), lanes(cols - 16), lanes(cols - 32)};
    for (int r = 0; r < rows; r++) {
        float *o = out + r * ld;
        for (int j = 0; j < 3; j++) {
            __m512 v = c[r][j];
            if (rnd) v = to_bf16_value(v);
            if (res) {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m[j], res + r * ld + 16 * j));
                if (rnd) v = to_bf16_value(v);
            }
            if (act) {
                v = gelu(v);
                if (rnd) v = to_bf16_value(v);
            }
            _mm512_mask_storeu_ps(o + 16 * j, m[j], v);
        }
    }
}

static inline void start(__m512 c[ROWS][3], const float *bias, int64_t cols, int rows) {
    __m512 b0 = _mm512_maskz_loadu_ps(lanes(cols), bias);
    __m512 b1 = _mm512_maskz_loadu_ps(lanes(cols - 16), bias + 16);
    __m512 b2 = _mm512_maskz_loadu_ps(lanes(cols - 32), bias + 32);
    for (int r = 0; r < rows; r++) {
        c[r][0] = b0;
        c[r][1] = b1;
        c[r][2] = b2;
    }
}

/* out[rows, cols] = a[rows, k] @ panel + bias (+ res), GELU'd if asked; 1 <= rows <= ROWS,
   cols <= PANEL; the panel's weights float32, or bfloat16 (`half`) widened as they are read
   (the same values: the same sums as on their float32 copies, from half the bytes). `rows` and
   `half` are constants in each copy (`block` picks one), so that a block of fewer rows than
   ROWS does only their FMAs: a 14-token query's second block has 6 rows, where one of ROWS
   would have computed two more (an eighth of its linears' compute) and dropped them.
   With `ahead` (a constant too; float32 weights), the block also asks for steps [q, q_end) of
   the `next` panel to be brought into L2, spread evenly over its own steps (linear says why). */
static inline __attribute__((always_inline)) void block_of(const float *a, int64_t lda,
                                                           const int rows, const void *panel,
                                                           const int half, int64_t k,
                                                           const float *bias, const float *res,
                                                           float *out, int64_t ld,
                                                           int64_t cols, int act,
                                                           const int ahead, const void *next,
                                                           int64_t q, int64_t q_end) {
    __m512 c[ROWS][3];
    const float *row[ROWS];
    const int64_t asked = ahead ? q_end - q : 0;
    int64_t due = 0;
    start(c, bias, cols, rows);
    for (int r = 0; r < rows; r++) row[r] = a + r * lda;
    for (int64_t i = 0; i < k; i++) {
        __m512 w0, w1, w2;
        if (half) {
            const uint16_t *p = (const uint16_t *)panel + i * PANEL;
            w0 = widened(_mm256_loadu_si256((const __m256i *)p));
            w1 = widened(_mm256_loadu_si256((const __m256i *)(p + 16)));
            w2 = widened(_mm256_loadu_si256((const __m256i *)(p + 32)));
            /* A step's 96 bytes span two cache lines whatever their offset. */
            _mm_prefetch((const char *)(p + 8 * PANEL), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + 8 * PANEL + 32), _MM_HINT_T0);
        } else {
            const float *p = (const float *)panel + i * PANEL;
            w0 = _mm512_loadu_ps(p), w1 = _mm512_loadu_ps(p + 16), w2 = _mm512_loadu_ps(p + 32);
            _mm_prefetch((const char *)(p + 8 * PANEL), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + 8 * PANEL + 32), _MM_HINT_T0);
            /* A step's 192 bytes: three cache lines, the panels being 64-byte aligned. */
            for (due += asked; ahead && due >= k; due -= k, q++) {
                const float *n = (const float *)next + q * PANEL;
                _mm_prefetch((const char *)n, _MM_HINT_T1);
                _mm_prefetch((const char *)(n + 16), _MM_HINT_T1);
                _mm_prefetch((const char *)(n + 32), _MM_HINT_T1);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            __m512 v = _mm512_set1_ps(row[r][i]);
            c[r][0] = _mm512_fmadd_ps(v, w0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(v, w1, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(v, w2, c[r][2]);
        }
    }
    finish(c, rows, res, out, ld, cols, act, 0);
}

/* CASE(n) for each row count a block can have, 1 to ROWS. */
#define EACH_ROW_COUNT(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)

static void block(const float *a, int64_t lda, int rows, const void *panel, int half,
                  int64_t k, const float *bias, const float *res, float *out, int64_t ld,
                  int64_t cols, int act, const void *next, int64_t q, int64_t q_end) {
    _Static_assert(ROWS == 8, "block has a case for each row count up to 8");
    switch (rows) {
#define BLOCK_OF(n)                                                                          \
    case n:                                                                                  \
        if (half)                                                                            \
            block_of(a, lda, n, panel, 1, k, bias, res, out, ld, cols, act, 0, 0, 0, 0);     \
        else if (next)                                                                       \
            block_of(a, lda, n, panel, 0, k, bias, res, out, ld, cols, act, 1, next, q, q_end); \
        else                                                                                 \
            block_of(a, lda, n, panel, 0, k, bias, res, out, ld, cols, act, 0, 0, 0, 0);     \
        break;
        EACH_ROW_COUNT(BLOCK_OF)
#undef BLOCK_OF
    }
}

/* A call's scratch of `size` bytes (a multiple of 64): the calling thread's, kept from call to
   call up to KEPT_MAX bytes, or for larger ones its own; NULL where none could be had. Each
   call's own, the attentions' layouts (tens of megabytes for a long pass) came as fresh pages
   from the kernel, faulted in and zeroed on every call: 68 texts of 60 tokens (12 heads of 64,
   float32, when that kernel still laid out the whole pass) took 17.3 ms against 6.6 with the
   scratch kept. */
enum { KEPT_MAX = 64 << 20 };

typedef struct {
    char *mem;
    size_t size;
} Kept;

static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

static void kept_free(void *k) {
    free(((Kept *)k)->mem);
    free(k);
}

static void kept_init(void) { pthread_key_create(&kept_key, kept_free); }

static char *scratch(size_t size) {
    if (size > KEPT_MAX) return aligned_alloc(64, size);
    pthread_once(&kept_once, kept_init);
    Kept *k = pthread_getspecific(kept_key);
    if (!k) {
        k = calloc(1, sizeof(Kept));
        if (!k || pthread_setspecific(kept_key, k)) {
            free(k);
            return NULL;
        }
    }
    if (size > k->size) {
        free(k->mem);
        k->mem = aligned_alloc(64, size);
        k->size = k->mem ? size : 0;
    }
    return k->mem;
}

/* Gives back what `scratch` lent. */
static void unscratch(char *mem, size_t size) {
    if (size > KEPT_MAX) free(mem);
}

/* Where each of `seqs` sequences (bounds in `cu`) starts in an attention's layout, its keys
   padded to a multiple of `block`: at[0..seqs], at[seqs] the whole layout's rows (malloc'd; NULL
   where it could not be), the longest padded sequence in *longest. */
static int64_t *laid_out(const int32_t *cu, int64_t seqs, int64_t block, int64_t *longest) {
    int64_t *at = malloc(sizeof(int64_t) * (seqs + 1));
    if (!at) return NULL;
    at[0] = 0;
    *longest = 0;
    for (int64_t s = 0; s < seqs; s++) {
        int64_t keys = (cu[s + 1] - cu[s] + block - 1) / block * block;
        at[s + 1] = at[s] + keys;
        if (keys > *longest) *longest = keys;
    }
    return at;
}

static inline __m512 widen(const uint16_t *p, __mmask16 m) {
    return widened(_mm256_maskz_loadu_epi16(m, p));
}

static inline void narrow(uint16_t *p, __mmask16 m, __m512 v) {
    __m512i u = _mm512_srli_epi32(_mm512_castps_si512(to_bf16_value(v)), 16);
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(u));
}

/* A LayerNorm's scale and shift for a row of n float32 values (x, zero past n to a whole
   vector): rstd and -mean * rstd, the mean and variance summed 16 lanes at a time in order. */
static inline void moments(const float *x, int64_t n, float eps, __m512 *scale, __m512 *shift) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + i));
    float mean = _mm512_reduce_add_ps(acc) / (float)n;
    __m512 mu = _mm512_set1_ps(mean);
    acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 d = _mm512_maskz_sub_ps(lanes(n - i), _mm512_loadu_ps(x + i), mu);
        acc = _mm512_fmadd_ps(d, d, acc);
    }
    float rstd = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)n + eps);
    *scale = _mm512_set1_ps(rstd);
    *shift = _mm512_set1_ps(-rstd * mean);
}

/* out = LayerNorm(a + b) over rows of n bfloat16 values (out may be a), as a bfloat16 model's
   residual add and LayerNorm give it: the sum rounded to bfloat16, its mean and variance in
   float32, (x * rstd - mean * rstd) * w + bias rounded to bfloat16. One pass over the rows where
   the two ops took three. */
void vp_add_norm_bf16(const uint16_t *a, const uint16_t *b, int64_t rows, int64_t n,
                      const float *w, const float *bias, float eps, uint16_t *out,
                      int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float x[(n + 15) / 16 * 16];
        const uint16_t *ar = a + r * n, *br = b + r * n;
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = lanes(n - i);
            __m512 v = to_bf16_value(_mm512_add_ps(widen(ar + i, m), widen(br + i, m)));
            _mm512_storeu_ps(x + i, v);
        }
        __m512 scale, shift;
        moments(x, n, eps, &scale, &shift);
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = lanes(n - i);
            __m512 y = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), scale, shift);
            __m512 g = _mm512_maskz_loadu_ps(m, w + i), c = _mm512_maskz_loadu_ps(m, bias + i);
            narrow(out + r * n + i, m, _mm512_fmadd_ps(y, g, c));
        }
    }
}

/* out = LayerNorm(a + b) over rows of n float32 values (out may be a): the sum, its mean and
   variance, (x * rstd - mean * rstd) * w + bias, in float32 as torch's ops compute them (the
   moments summed in another order). One pass over the rows where the two ops took three. */
void vp_add_norm_f32(const float *a, const float *b, int64_t rows, int64_t n, const float *w,
                     const float *bias, float eps, float *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float x[(n + 15) / 16 * 16];
        const float *ar = a + r * n, *br = b + r * n;
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = lanes(n - i);
            __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, ar + i),
                                     _mm512_maskz_loadu_ps(m, br + i));
            _mm512_storeu_ps(x + i, v);
        }
        __m512 scale, shift;
        moments(x, n, eps, &scale, &shift);
        for (int64_t i = 0; i < n; i += 16) {
            __mmask16 m = lanes(n - i);
            __m512 y = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), scale, shift);
            __m512 g = _mm512_maskz_loadu_ps(m, w + i), c = _mm512_maskz_loadu_ps(m, bias + i);
            _mm512_mask_storeu_ps(out + r * n + i, m, _mm512_fmadd_ps(y, g, c));
        }
    }
}

enum { TILE_ROWS = 16, TILE_K = 32 };

/* Row xr's scale s = max(max(x u), min(x u) / -low), at least 1e-12; x u written to `out`
   where it is not NULL. */
static inline float row_scale(const float *xr, const float *u, int64_t n, float low,
                              float *out) {
    __m512 lo = _mm512_set1_ps(INFINITY), hi = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < n; c += 16) {
        __mmask16 m = lanes(n - c);
        __m512 t =
            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + c), _mm512_maskz_loadu_ps(m, u + c));
        lo = _mm512_mask_min_ps(lo, m, lo, t);
        hi = _mm512_mask_max_ps(hi, m, hi, t);
        if (out) _mm512_mask_storeu_ps(out + c, m, t);
    }
    float below = _mm512_reduce_min_ps(lo) / -low, top = _mm512_reduce_max_ps(hi);
    float s = top > below ? top : below;
    return s > 1e-12f ? s : 1e-12f;
}

/* An int8 linear's input rows (int8.py): each of `rows` rows of x (n values) times u, scaled
   into [-low, 1] by its own scale s = max(max(x u), min(x u) / -low), at least 1e-12, written to
   body as x u / s, and s to scale[r]. The float32 operations torch's mul, amin, amax, div,
   maximum and clamp_min would do, in one pass over each row where those take five. */
void vp_int8_scale_rows(const float *x, int64_t rows, int64_t n, const float *u, float low,
                        float *body, float *scale, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *br = body + r * n;
        float s = row_scale(x + r * n, u, n, low, br);
        __m512 sv = _mm512_set1_ps(s);
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 m = lanes(n - c);
            _mm512_mask_storeu_ps(br + c, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, br + c), sv));
        }
        scale[r] = s;
    }
}

/* vp_int8_scale_rows's rows quantized as they are written: q = clamp(rint(fma(x u / s, step,
   zero)), 0, 255) in u8 (to nearest even), for oneDNN's int8 linear, which takes its input in
   u8 where fbgemm's takes the float32 rows and quantizes them itself in one more pass over
   them; the same u8 values as fbgemm's quantization (its zero point added before rounding, in
   one fused multiply-add), so that the two GEMMs sum the same products. One row here, into qr,
   its scale returned: the int8 kernel's passes (`vp_int8_post_norm_encoder`) quantize their
   rows here too, so that a token's u8 row is the same on either path. */
static inline float quantize_row(const float *xr, const float *u, int64_t n, float low,
                                 float step, int32_t zero, uint8_t *qr) {
    float s = row_scale(xr, u, n, low, NULL);
    __m512 sv = _mm512_set1_ps(s), stepv = _mm512_set1_ps(step);
    __m512 zv = _mm512_set1_ps((float)zero);
    __m512i none = _mm512_setzero_si512();
    for (int64_t c = 0; c < n; c += 16) {
        __mmask16 m = lanes(n - c);
        /* x u again (the row is still in L1) rather than a float32 row written and read. */
        __m512 t =
            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + c), _mm512_maskz_loadu_ps(m, u + c));
        __m512 v = _mm512_fmadd_ps(_mm512_div_ps(t, sv), stepv, zv);
        __m512i i = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm512_mask_cvtusepi32_storeu_epi8(qr + c, m, _mm512_max_epi32(i, none));
    }
    return s;
}

void vp_int8_quantize_rows(const float *x, int64_t rows, int64_t n, const float *u, float low,
                           float step, int32_t zero, uint8_t *q, float *scale, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        scale[r] = quantize_row(x + r * n, u, n, low, step, zero, q + r * n);
}

/* An int8 linear's output values y (its GEMM's, on the u8 rows) finished: scaled back by their
   row's scale s, the bias b added in one fused multiply-add, GELU'd (erf) where asked. */
static inline __m512 int8_finish(__m512 y, __m512 s, __m512 b, int act) {
    __m512 v = _mm512_fmadd_ps(y, s, b);
    return act ? gelu(v) : v;
}

/* int8_finish over y[rows, n] in place, row r's scale scale[r], bias[n] (or NULL for none):
   what a longer int8 pass does after oneDNN's or fbgemm's GEMM, in one pass over the rows. */
void vp_int8_finish(float *y, int64_t rows, int64_t n, const float *scale, const float *bias,
                    int act, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * n;
        __m512 s = _mm512_set1_ps(scale[r]);
        for (int64_t c = 0; c < n; c += 16) {
            __mmask16 m = lanes(n - c);
            __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + c) : _mm512_setzero_ps();
            __m512 v = int8_finish(_mm512_maskz_loadu_ps(m, yr + c), s, b, act);
            _mm512_mask_storeu_ps(yr + c, m, v);
        }
    }
}

/* The start of a softmax over a row of scores s[0..len) (Q K^T): the scores scaled and their
   bias `add` added in place where there is one, the row's largest found (two chains); returns
   the factor c that takes a score to base 2 (e^x = 2^(x log2 e)), c times the largest in
   *shift. */
static inline float row_base2(float *s, const float *add, float scale, int64_t len,
                              __m512 *shift) {
    const float log2e = 1.44269504088896341f;
    float c = scale * log2e;
    if (add) {
        for (int64_t j = 0; j < len; j += 16) {
            __mmask16 m = lanes(len - j);
            __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, s + j), _mm512_set1_ps(scale),
                                       _mm512_maskz_loadu_ps(m, add + j));
            _mm512_mask_storeu_ps(s + j, m, x);
        }
        c = log2e;
    }
    const __m512 low = _mm512_set1_ps(-INFINITY);
    int64_t full = len / 16 * 16, j = 0;
    __mmask16 tail = lanes(len - full);
    __m512 m0 = low, m1 = low;
    for (; j + 32 <= full; j += 32) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + j));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(s + j + 16));
    }
    if (j < full) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(s + j));
    if (tail) m1 = _mm512_max_ps(m1, _mm512_mask_loadu_ps(low, tail, s + full));
    *shift = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(m0, m1)) * c);
    return c;
}

/* 2^t for t <= 0 (a softmax's shifted scores, in base 2), to about 2e-7 relative: 2^n 2^f,
   |f| <= 1/2, 2^f by its Taylor series to f^6. The bfloat16 attention rounds its values to
   bfloat16 before it uses them (or sums them in float32), so libmvec's exactness buys nothing
   there: with its expf, the corpus's attention took 61-66 ms against 57-61; the float32
   attention keeps them (about float32's own rounding of them). */
static inline __m512 exp2_neg(__m512 t) {
    t = _mm512_max_ps(t, _mm512_set1_ps(-126.0f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* r[0..15] (16 x 16 32-bit values) transposed in place. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* u[4i + c]'s 128-bit lane l: rows 4i..4i+3 of column 4l + c. */
    for (int c = 0; c < 4; c++) {
        __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
        __m512i x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        __m512i x2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        __m512i x3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_i32x4(x0, x2, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(x1, x3, 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
        r[12 + c] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
    }
}

/* Compilers from before AMX (GCC 10, clang 11) still build the float32 kernel. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)

#define AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

/* The tile configuration every thread of a pass loads: tiles 0-2 a block's 16 x PANEL sums
   (float32), tile 3 16 rows of 32 bfloat16 inputs, tiles 4-6 the panel's 16 pairs of inputs
   for 16 columns each. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* A static object, not one built on the stack: GCC 12 took the stores into a local
   configuration for dead, the instruction that reads it not being seen as a read. */
static const TileConfig TILES = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

AMX static void tiles_on(void) { _tile_loadconfig(&TILES); }

AMX static void tiles_off(void) { _tile_release(); }

/* out[rows, cols] = a[16, width] @ panel + bias (+ res), GELU'd if asked, on AMX: `a` in
   bfloat16 with rows past `rows` computed and never stored, `width` a multiple of TILE_K, the
   panel [width / 2][PANEL][2]. */
AMX static void block_amx(const uint16_t *a, int64_t width, int rows, const uint16_t *panel,
                          const float *bias, const float *res, float *out, int64_t ld,
                          int64_t cols, int act) {
    float sums[TILE_ROWS][PANEL];
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    for (int64_t k = 0; k < width; k += TILE_K) {
        const uint16_t *p = panel + k * PANEL;
        _tile_loadd(3, a + k, width * 2);
        _tile_loadd(4, p, PANEL * 4);
        _tile_loadd(5, p + 32, PANEL * 4);
        _tile_loadd(6, p + 64, PANEL * 4);
        _tile_dpbf16ps(0, 3, 4);
        _tile_dpbf16ps(1, 3, 5);
        _tile_dpbf16ps(2, 3, 6);
    }
    _tile_stored(0, &sums[0][0], PANEL * 4);
    _tile_stored(1, &sums[0][16], PANEL * 4);
    _tile_stored(2, &sums[0][32], PANEL * 4);
    __mmask16 m0 = lanes(cols), m1 = lanes(cols - 16), m2 = lanes(cols - 32);
    __m512 b0 = _mm512_maskz_loadu_ps(m0, bias);
    __m512 b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    __m512 b2 = _mm512_maskz_loadu_ps(m2, bias + 32);
    for (int r = 0; r < rows; r++) {
        __m512 c[1][3] = {{_mm512_add_ps(_mm512_loadu_ps(sums[r]), b0),
                           _mm512_add_ps(_mm512_loadu_ps(sums[r] + 16), b1),
                           _mm512_add_ps(_mm512_loadu_ps(sums[r] + 32), b2)}};
        finish(c, 1, res ? res + r * ld : 0, out + r * ld, ld, cols, act, 1);
    }
}

/* a[rows, k] rounded to bfloat16 (to nearest even) into out[rows][width], the inputs past k
   zero; rows past `rows` up to a multiple of TILE_ROWS are left as they are. */
AMX static void to_bf16(const float *a, int64_t rows, int64_t k, uint16_t *out, int64_t width) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < width; i += 16) {
            __mmask16 m = lanes(k - i);
            __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, a + r * k + i));
            _mm256_storeu_si256((__m256i *)(out + r * width + i), (__m256i)h);
        }
    }
}

/* Whether this process may use AMX's tiles: Linux hands them out on request. */
int vp_amx_ready(void) {
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* e into p[j..j+16) rounded to bfloat16, and where `lo` is given what that rounding left off
   into lo[j..j+16), rounded again: p + lo holds e to about 2^-17. */
AMX static inline void store_p(uint16_t *p, uint16_t *lo, int64_t j, __m512 e) {
    __m256bh h = _mm512_cvtneps_pbh(e);
    _mm256_storeu_si256((__m256i *)(p + j), (__m256i)h);
    if (lo) {
        __m512 rest = _mm512_sub_ps(e, widened((__m256i)h));
        _mm256_storeu_si256((__m256i *)(lo + j), (__m256i)_mm512_cvtneps_pbh(rest));
    }
}

/* A row of scores s[0..len) (Q K^T, then scaled and their bias `add` added where there is one)
   into p[0..keys) (and lo, see store_p): e^(x - max x), zero past len; returns their float32
   sum. Two chains of max and of sums, not one. */
AMX static inline float softmax_row(float *s, const float *add, float scale, int64_t len,
                                    int64_t keys, uint16_t *p, uint16_t *lo) {
    __m512 shift;
    const __m512 cv = _mm512_set1_ps(row_base2(s, add, scale, len, &shift));
    int64_t full = len / 16 * 16, j;
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (j = 0; j + 32 <= full; j += 32) {
        __m512 e0 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), cv, shift));
        __m512 e1 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), cv, shift));
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        store_p(p, lo, j, e0);
        store_p(p, lo, j + 16, e1);
    }
    for (; j < keys; j += 16) {
        __mmask16 m = lanes(len - j);
        __m512 e = _mm512_maskz_mov_ps(
            m, exp2_neg(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, s + j), cv, shift)));
        sum0 = _mm512_add_ps(sum0, e);
        store_p(p, lo, j, e);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

/* bfloat16 attention on AMX, one (sequence, head) at a time, its Q, K and V first laid out as
   the tiles read them (`pack`): scores Q K^T as float32 tile sums of bfloat16 products, each
   query's softmax over its whole row in float32 (a score bias added in float32 where there is
   one; its exponentials rounded to bfloat16 for the product with V, or split in two bfloat16
   parts where asked, their float32 sum dividing the result), P V as tile sums again, the result
   rounded to bfloat16. `dim` is 32 or 64; a sequence's keys are padded to a multiple of 32. */

/* A sequence's Q, K and V, `keys` rows (its length rounded up to 32, the rows past it zero),
   per head h at h * keys * dim values in each of: qp [keys][dim], A tiles' rows; kt
   [keys / 16][dim / 32][16 pairs][16 keys] as uint32 pairs, K^T as B tiles; vp [keys / 2][dim]
   as uint32, (v[2j][d], v[2j+1][d]) side by side, V as B tiles. Read row by row, all heads at
   once: one head's slice of a row is a cache line, and read head by head (one tile of rows
   `stride` apart at a time) the rows came one miss at a time. */
AMX static void pack(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                     const int64_t stride[3], int64_t len, int64_t keys, int64_t heads,
                     int64_t dim, uint16_t *qp, uint32_t *kt, uint32_t *vp) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40,
                                        8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    int64_t steps = dim / 32, per_head = keys * dim / 2, hidden = heads * dim;
    for (int64_t j0 = 0; j0 < keys; j0 += 16) {
        for (int64_t j = j0; j < j0 + 16; j++) {
            for (int64_t c = 0; c < hidden; c += 32)
                _mm512_storeu_si512(qp + (c / dim) * per_head * 2 + j * dim + c % dim,
                                    j < len ? _mm512_loadu_si512(q + j * stride[0] + c)
                                            : _mm512_setzero_si512());
        }
        for (int64_t c = 0; c < hidden; c += 32) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + i < len ? _mm512_loadu_si512(k + (j0 + i) * stride[1] + c)
                                    : _mm512_setzero_si512();
            transpose16(r);
            uint32_t *to = kt + (c / dim) * per_head + (j0 / 16 * steps + c % dim / 32) * 256;
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(to + 16 * i, r[i]);
        }
        for (int64_t j = j0; j < j0 + 16; j += 2) {
            for (int64_t c = 0; c < hidden; c += 32) {
                const uint16_t *va = v + j * stride[2] + c;
                __m512i a = j < len ? _mm512_loadu_si512(va) : _mm512_setzero_si512();
                __m512i b =
                    j + 1 < len ? _mm512_loadu_si512(va + stride[2]) : _mm512_setzero_si512();
                uint32_t *vo = vp + (c / dim) * per_head + (j / 2) * dim + c % dim;
                _mm512_storeu_si512(vo, _mm512_permutex2var_epi16(a, lo, b));
                _mm512_storeu_si512(vo + 16, _mm512_permutex2var_epi16(a, hi, b));
            }
        }
    }
}

/* Scores of the query block in tiles 4 (and 5: dimensions 32-63) against key blocks 2i and
   2i + 1 for i in [from, to), into s[16][keys]. */
AMX static void scores(const uint32_t *kt, int64_t steps, int64_t keys, int64_t from, int64_t to,
                       float *s) {
    for (int64_t i = from; i < to; i++) {
        const uint32_t *kb = kt + 2 * i * steps * 256;
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(6, kb, 64);
        _tile_loadd(7, kb + steps * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (steps > 1) {
            _tile_loadd(6, kb + 256, 64);
            _tile_loadd(7, kb + steps * 256 + 256, 64);
            _tile_dpbf16ps(0, 5, 6);
            _tile_dpbf16ps(1, 5, 7);
        }
        _tile_stored(0, s + i * 32, keys * 4);
        _tile_stored(1, s + i * 32 + 16, keys * 4);
    }
}

AMX static void load_queries(const uint16_t *q, int64_t dim) {
    _tile_loadd(4, q, dim * 2);
    if (dim > 32) _tile_loadd(5, q + 32, dim * 2);
}

/* One head of one sequence from its packed rows (`pack`); `s_all` [2][16][keys] and `p_all`
   [16][keys] the scores of two blocks of queries and the exponentials of one, `o` [16][dim]
   their P V. The next block's scores are computed on the tiles a few key blocks after each of
   this block's softmax rows, where the vector units work meanwhile. */
AMX static void attend_amx(const uint16_t *q, const uint32_t *kt, const uint32_t *vp,
                           int64_t len, int64_t keys, int64_t dim, float scale, const float *bias,
                           int64_t span, uint16_t *out, int64_t out_stride, float *s_all,
                           uint16_t *p_all, uint16_t *lo_all, float *o) {
    int64_t steps = dim / 32, pairs = keys / 32, per_row = (pairs + 15) / 16;
    load_queries(q, dim);
    scores(kt, steps, keys, 0, pairs, s_all);
    for (int64_t i0 = 0, blk = 0; i0 < len; i0 += 16, blk++) {
        int rows = len - i0 < 16 ? (int)(len - i0) : 16;
        float *s = s_all + (blk % 2) * 16 * keys, *next = s_all + ((blk + 1) % 2) * 16 * keys;
        int more = i0 + 16 < len;
        if (more) load_queries(q + (i0 + 16) * dim, dim);
        float inv[16];
        for (int r = 0; r < 16; r++) {
            if (r < rows)
                inv[r] = 1.0f / softmax_row(s + r * keys, bias ? bias + (i0 + r) * span : 0,
                                            scale, len, keys, p_all + r * keys,
                                            lo_all ? lo_all + r * keys : 0);
            else {
                memset(p_all + r * keys, 0, 2 * keys);
                if (lo_all) memset(lo_all + r * keys, 0, 2 * keys);
            }
            int64_t from = r * per_row, to = from + per_row < pairs ? from + per_row : pairs;
            if (more && from < to) scores(kt, steps, keys, from, to, next);
        }
        _tile_zero(0);
        _tile_zero(1);
        if (steps > 1) {
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int64_t j = 0; j < keys; j += 32) {
            const uint32_t *vb = vp + (j / 2) * dim;
            _tile_loadd(4, p_all + j, keys * 2);
            _tile_loadd(6, vb, dim * 4);
            _tile_dpbf16ps(0, 4, 6);
            _tile_loadd(7, vb + 16, dim * 4);
            _tile_dpbf16ps(1, 4, 7);
            if (lo_all) {
                _tile_loadd(5, lo_all + j, keys * 2);
                _tile_dpbf16ps(0, 5, 6);
                _tile_dpbf16ps(1, 5, 7);
            }
            if (steps > 1) {
                _tile_loadd(6, vb + 32, dim * 4);
                _tile_dpbf16ps(2, 4, 6);
                _tile_loadd(7, vb + 48, dim * 4);
                _tile_dpbf16ps(3, 4, 7);
                if (lo_all) {
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
        }
        _tile_stored(0, o, dim * 4);
        _tile_stored(1, o + 16, dim * 4);
        if (steps > 1) {
            _tile_stored(2, o + 32, dim * 4);
            _tile_stored(3, o + 48, dim * 4);
        }
        for (int r = 0; r < rows; r++) {
            __m512 f = _mm512_set1_ps(inv[r]);
            for (int64_t d = 0; d < dim; d += 16) {
                __m512 x = _mm512_mul_ps(_mm512_loadu_ps(o + r * dim + d), f);
                _mm256_storeu_si256((__m256i *)(out + (i0 + r) * out_stride + d),
                                    (__m256i)_mm512_cvtneps_pbh(x));
            }
        }
    }
}

/* Attention within each of `seqs` sequences (bounds in `cu`) of packed bfloat16 rows: q, k and
   v [rows][heads][dim], stride[0], stride[1] and stride[2] values from one row to the next,
   out [rows][heads][dim] contiguous; `dim` 32 or 64. `bias` (or NULL): a float32 score bias
   [heads][span][span] that depends on j - i only (MPNet's relative positions), `span` at least
   the longest sequence: every sequence reads its top-left corner. The sequences are laid out
   for the tiles first (`pack`), then the (sequence, head) pairs go to the threads as they come
   free. */
AMX int vp_attention_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          const int64_t stride[3], const int32_t *cu, int64_t seqs,
                          int64_t heads, int64_t dim, float scale, const float *bias,
                          int64_t span, int split, uint16_t *out, int threads) {
    int64_t longest, *at = laid_out(cu, seqs, 32, &longest);
    if (!at) return -1;
    int64_t hidden = heads * dim;
    /* Q, K and V packed, then each thread's scores, exponentials and P V. */
    size_t packed = ((size_t)at[seqs] * hidden * 2 * 3 + 63) / 64 * 64;
    size_t own = ((size_t)(2 * 4 + 2 * 2) * 16 * longest + 4 * 16 * dim + 63) / 64 * 64;
    char *mem = scratch(packed + own * threads);
    if (!mem) {
        free(at);
        return -1;
    }
    uint16_t *qp = (uint16_t *)mem;
    uint32_t *kt = (uint32_t *)(qp + at[seqs] * hidden), *vp = kt + at[seqs] * hidden / 2;
#pragma omp parallel num_threads(threads)
    {
        float *s = (float *)(mem + packed + own * omp_get_thread_num());
        uint16_t *p = (uint16_t *)(s + 2 * 16 * longest), *lo = p + 16 * longest;
        float *o = (float *)(lo + 16 * longest);
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < seqs; i++) {
            int64_t start = cu[i];
            pack(q + start * stride[0], k + start * stride[1], v + start * stride[2], stride,
                 cu[i + 1] - start, at[i + 1] - at[i], heads, dim, qp + at[i] * hidden,
                 kt + at[i] * hidden / 2, vp + at[i] * hidden / 2);
        }
        tiles_on();
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < seqs * heads; task++) {
            int64_t i = task / heads, h = task % heads, keys = at[i + 1] - at[i];
            int64_t base = at[i] * hidden + h * keys * dim;
            attend_amx(qp + base, kt + base / 2, vp + base / 2, cu[i + 1] - cu[i], keys, dim,
                       scale, bias ? bias + h * span * span : 0, span,
                       out + (cu[i] * heads + h) * dim, hidden, s, p, split ? lo : 0, o);
        }
        tiles_off();
    }
    unscratch(mem, packed + own * threads);
    free(at);
    return 0;
}

#else

int vp_amx_ready(void) { return 0; }
int vp_attention_bf16(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                      const int64_t stride[3], const int32_t *cu, int64_t seqs, int64_t heads,
                      int64_t dim, float scale, const float *bias, int64_t span, int split,
                      uint16_t *out, int threads) {
    (void)q, (void)k, (void)v, (void)stride, (void)cu, (void)seqs, (void)heads, (void)dim;
    (void)scale, (void)bias, (void)span, (void)split, (void)out, (void)threads;
    return -1;
}
static void tiles_on(void) {}
static void tiles_off(void) {}
static void block_amx(const uint16_t *a, int64_t width, int rows, const uint16_t *panel,
                      const float *bias, const float *res, float *out, int64_t ld, int64_t cols,
                      int act) {
    (void)a, (void)width, (void)rows, (void)panel, (void)bias, (void)res, (void)out, (void)ld;
    (void)cols, (void)act;
}
static void to_bf16(const float *a, int64_t rows, int64_t k, uint16_t *out, int64_t width) {
    (void)a, (void)rows, (void)k, (void)out, (void)width;
}

#endif

/* The first of `count` panels that thread `t` of `threads` runs, as OpenMP's static schedule
   shares them out (contiguous runs, the first count % threads one longer). */
static int64_t first_panel(int64_t count, int t, int threads) {
    int64_t each = count / threads, extra = count % threads;
    return t < extra ? (each + 1) * t : each * t + extra;
}

/* A linear layer over every row, its panels shared out among the team; with bfloat16 weights
   on AMX (`abf`, room for the inputs in bfloat16), its inputs rounded to bfloat16 first; with
   bfloat16 weights on the float32 path (`half`), the float32 inputs as they are. `then` (or
   NULL): the weights of the linear the layer runs next, `then_k` inputs by `then_n` outputs.

   A pass of more rows than a block runs each panel in several blocks, and only the first found
   the panel in memory: it waited on the read while the later ones, the panel in L2, left the
   memory idle. So each block of such a pass asks for a share of the thread's next panel in
   proportion to its rows, or of the next linear's first at its last: the reads run while the
   panel before computes. Float32 weights only: a pass of one block is bound by the read itself
   (asking ahead slowed a 2-token pass by a quarter), and bfloat16 ones (`half`), half the bytes
   per step, ran 1-3% slower with it. docs/performance.md has the figures. */
static void linear(const float *a, int64_t rows, int64_t k, const void *w, const float *bias,
                   int64_t n, const float *res, float *out, int act, uint16_t *abf, int half,
                   const void *then, int64_t then_k, int64_t then_n) {
    int64_t panels = (n + PANEL - 1) / PANEL;
    int64_t width = (k + TILE_K - 1) / TILE_K * TILE_K, step = abf ? TILE_ROWS : ROWS;
    int threads = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t mine = first_panel(panels, t, threads), last = first_panel(panels, t + 1, threads);
    int ahead = !abf && !half && rows > ROWS;
    if (abf) to_bf16(a, rows, k, abf, width);
    for (int64_t p = mine; p < last; p++) {
        int64_t cols = n - p * PANEL < PANEL ? n - p * PANEL : PANEL;
        const float *next = 0;
        int64_t next_k = k;
        if (ahead && p + 1 < last) {
            next = (const float *)w + (p + 1) * k * PANEL;
        } else if (ahead && then) {
            int64_t then_panels = (then_n + PANEL - 1) / PANEL;
            int64_t first = first_panel(then_panels, t, threads);
            if (first < first_panel(then_panels, t + 1, threads)) {
                next = (const float *)then + first * then_k * PANEL;
                next_k = then_k;
            }
        }
        for (int64_t r = 0; r < rows; r += step) {
            int n_rows = rows - r < step ? (int)(rows - r) : (int)step;
            const float *add = res ? res + r * n + p * PANEL : 0;
            float *o = out + r * n + p * PANEL;
            if (abf)
                block_amx(abf + r * width, width, n_rows, (const uint16_t *)w + p * width * PANEL,
                          bias + p * PANEL, add, o, n, cols, act);
            else
                block(a + r * k, k, n_rows,
                      half ? (const void *)((const uint16_t *)w + p * k * PANEL)
                           : (const void *)((const float *)w + p * k * PANEL),
                      half, k, bias + p * PANEL, add, o, n, cols, act, next,
                      next_k * r / rows, next_k * (r + n_rows) / rows);
        }
    }
#pragma omp barrier
}

/* Softmax attention of each sequence's tokens to each other, one (sequence, head) per task: the
   head's keys transposed once, so that each query's scores come 16 keys at a time, each an FMA
   chain over the head's dimensions in order; the exponentials 16 at a time. `bias` (or NULL):
   an additive score bias, `[heads][span][span]`, that depends on j - i only (MPNet's relative
   positions), so every sequence reads its top-left corner. The short pass's, for heads of
   widths `attend_heads` (below) does not take. */
static void attention(const float *qkv, const int32_t *cu, int64_t seqs, int64_t hidden,
                      int64_t heads, const float *bias, int64_t span, float *ctx, int rnd) {
    int64_t dim = hidden / heads, stride = 3 * hidden;
    __m512 scale = _mm512_set1_ps(1.0f / sqrtf((float)dim)), low = _mm512_set1_ps(-INFINITY);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < seqs * heads; task++) {
        int64_t s = task / heads, h = task % heads;
        int64_t start = cu[s], len = cu[s + 1] - cu[s], keys = (len + 15) / 16 * 16;
        const float *q = qkv + start * stride + h * dim, *k = q + hidden, *v = q + 2 * hidden;
        float kt[dim * keys], p[keys];
        for (int64_t d = 0; d < dim; d++) {
            for (int64_t j = 0; j < len; j++) kt[d * keys + j] = k[j * stride + d];
            for (int64_t j = len; j < keys; j++) kt[d * keys + j] = 0.0f;
        }
        for (int64_t i = 0; i < len; i++) {
            const float *qi = q + i * stride;
            const float *add = bias ? bias + (h * span + i) * span : 0;
            __m512 top = low;
            for (int64_t j = 0; j < keys; j += 16) {
                __mmask16 m = lanes(len - j);
                __m512 acc = _mm512_setzero_ps();
                for (int64_t d = 0; d < dim; d++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(qi[d]), _mm512_loadu_ps(kt + d * keys + j),
                                          acc);
                acc = _mm512_mul_ps(acc, scale);
                if (add) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, add + j));
                acc = _mm512_mask_mov_ps(low, m, acc);
                _mm512_storeu_ps(p + j, acc);
                top = _mm512_max_ps(top, acc);
            }
            __m512 most = _mm512_set1_ps(_mm512_reduce_max_ps(top)), sum = _mm512_setzero_ps();
            for (int64_t j = 0; j < keys; j += 16) {
                __m512 e = _mm512_maskz_mov_ps(
                    lanes(len - j), _ZGVeN16v_expf(_mm512_sub_ps(_mm512_loadu_ps(p + j), most)));
                _mm512_storeu_ps(p + j, e);
                sum = _mm512_add_ps(sum, e);
            }
            float inv = 1.0f / _mm512_reduce_add_ps(sum);
            float *o = ctx + (start + i) * hidden + h * dim;
            for (int64_t d = 0; d < dim; d += 16) {
                __mmask16 m = lanes(dim - d);
                __m512 acc = _mm512_setzero_ps();
                for (int64_t j = 0; j < len; j++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(p[j] * inv),
                                          _mm512_maskz_loadu_ps(m, v + j * stride + d), acc);
                _mm512_mask_storeu_ps(o + d, m, rnd ? to_bf16_value(acc) : acc);
            }
        }
    }
}

/* float32 attention over a longer pass's sequences, called from torch (cpu_kernels.py says why):
   each score one FMA chain over the head's dimensions in order, as `attention` above computes
   it, the exponentials in base 2 and the sum's inverse applied to the output (`softmax_f32`),
   so a token's values depend on its own sequence only, whatever else its pass holds; the work
   blocked for the vector units instead of one query at a time. The (sequence, head) pairs go to
   the threads as they come free, and each lays its head's Q, K and V out in its own scratch
   (`pack_f32`) right before it uses them: they stay in the core's caches, where a first phase
   that laid out the whole pass wrote them all to memory and read them back (the corpus's
   batches 3-8% slower; 68 texts of 60 tokens 1.3x, 400 of 10 1.7x). */

/* 16 values of row data from `p` at element `at`: float32, or bfloat16 widened (exactly). */
static inline __attribute__((always_inline)) __m512 load16(const void *p, int64_t at,
                                                           const int bf16) {
    return bf16 ? widened(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at)))
                : _mm512_loadu_ps((const float *)p + at);
}

/* 16 float32 values to `p` at element `at`: as they are, or rounded to bfloat16. */
static inline __attribute__((always_inline)) void store16(void *p, int64_t at, __m512 x,
                                                          const int bf16) {
    if (bf16)
        narrow((uint16_t *)p + at, 0xFFFF, x);
    else
        _mm512_storeu_ps((float *)p + at, x);
}

/* One head of a sequence's `len` rows (q, k and v from elements at[0], at[1] and at[2], at the
   head's columns, stride[0], stride[1] and stride[2] values from one row to the next; float32,
   or bfloat16 where `bf16`) laid out in float32, `keys` (len rounded up to 16) rows each, the
   rows past len zero: qp and vp [keys][dim], kt [keys / 16][dim][16] (K^T in blocks of 16
   keys). */
static inline __attribute__((always_inline)) void pack_f32(
    const void *q, const void *k, const void *v, const int64_t at[3], const int64_t stride[3],
    int64_t len, int64_t keys, int64_t dim, const int bf16, float *qp, float *kt, float *vp) {
    for (int64_t j0 = 0; j0 < keys; j0 += 16) {
        for (int64_t j = j0; j < j0 + 16; j++)
            for (int64_t c = 0; c < dim; c += 16) {
                const __m512 zero = _mm512_setzero_ps();
                _mm512_storeu_ps(qp + j * dim + c,
                                 j < len ? load16(q, at[0] + j * stride[0] + c, bf16) : zero);
                _mm512_storeu_ps(vp + j * dim + c,
                                 j < len ? load16(v, at[2] + j * stride[2] + c, bf16) : zero);
            }
        for (int64_t c = 0; c < dim; c += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + i < len
                           ? _mm512_castps_si512(load16(k, at[1] + (j0 + i) * stride[1] + c, bf16))
                           : _mm512_setzero_si512();
            transpose16(r);
            float *to = kt + j0 * dim + c * 16;
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(to + 16 * i, r[i]);
        }
    }
}

/* Scores of 4 queries (q, `dim` apart) against nv blocks of 16 keys (kt, laid out by pack_f32)
   into s (rows `ld` apart), unscaled. */
static inline __attribute__((always_inline)) void scores_f32(const float *q, const float *kt,
                                                             int64_t dim, const int nv, float *s,
                                                             int64_t ld) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < nv; n++) acc[r][n] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d++) {
        __m512 kv[4];
        for (int n = 0; n < nv; n++) kv[n] = _mm512_loadu_ps(kt + n * dim * 16 + d * 16);
        for (int r = 0; r < 4; r++) {
            __m512 qb = _mm512_set1_ps(q[r * dim + d]);
            for (int n = 0; n < nv; n++) acc[r][n] = _mm512_fmadd_ps(qb, kv[n], acc[r][n]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < nv; n++) _mm512_storeu_ps(s + r * ld + n * 16, acc[r][n]);
}

/* o[r] = inv[r] (sum over j < len of p[r][j] v[j]) over nv vectors of v's rows (`ld_v`
   apart), for `rows` queries (p `ld` apart), each value one FMA chain over j in order; the
   first `valid` rows written to out from element `at` (`ld_out` apart; float32, or bfloat16
   where `bf16`). */
static inline __attribute__((always_inline)) void values_f32(const float *p, int64_t ld,
                                                             const float *v, int64_t ld_v,
                                                             int64_t len, const int rows,
                                                             const int nv, int valid,
                                                             const float *inv, void *out,
                                                             int64_t at, int64_t ld_out,
                                                             const int bf16) {
    __m512 acc[16];
    for (int i = 0; i < rows * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < len; j++) {
        __m512 vv[2];
        for (int n = 0; n < nv; n++) vv[n] = _mm512_loadu_ps(v + j * ld_v + n * 16);
        for (int r = 0; r < rows; r++) {
            __m512 pb = _mm512_set1_ps(p[r * ld + j]);
            for (int n = 0; n < nv; n++)
                acc[r * nv + n] = _mm512_fmadd_ps(pb, vv[n], acc[r * nv + n]);
        }
    }
    for (int r = 0; r < rows && r < valid; r++) {
        __m512 f = _mm512_set1_ps(inv[r]);
        for (int n = 0; n < nv; n++)
            store16(out, at + r * ld_out + n * 16, _mm512_mul_ps(acc[r * nv + n], f), bf16);
    }
}

/* A row of scores s[0..len) (Q K^T, then scaled and their bias `add` added where there is
   one) into e^(x - max x) in s[0..keys), zero past len; returns their sum. As `softmax_row`
   does for the bfloat16 attention, in base 2, but with the exponentials kept in float32: the
   argument's rounding (x log2 e less the row's shift) moves each exponential by about 1e-7 of
   the row's largest, as float32's own rounding of it does. */
static inline float softmax_f32(float *s, const float *add, float scale, int64_t len,
                                int64_t keys) {
    __m512 shift;
    const __m512 cv = _mm512_set1_ps(row_base2(s, add, scale, len, &shift));
    int64_t full = len / 16 * 16, j;
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (j = 0; j + 32 <= full; j += 32) {
        __m512 e0 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), cv, shift));
        __m512 e1 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), cv, shift));
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        _mm512_storeu_ps(s + j, e0);
        _mm512_storeu_ps(s + j + 16, e1);
    }
    for (; j < keys; j += 16) {
        __mmask16 m = lanes(len - j);
        __m512 e = _mm512_maskz_mov_ps(
            m, exp2_neg(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, s + j), cv, shift)));
        sum0 = _mm512_add_ps(sum0, e);
        _mm512_storeu_ps(s + j, e);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

/* One head of one sequence, 16 queries at a time, written to out from element `at`; `s`
   [16][keys]. */
static inline __attribute__((always_inline)) void attend_f32(
    const float *q, const float *kt, const float *v, int64_t len, int64_t keys, const int nv,
    float scale, const float *bias, int64_t span, void *out, int64_t at, int64_t ld_out,
    const int bf16, float *s) {
    const int64_t dim = nv * 16, blocks = keys / 16;
    /* P V 8 queries by 32 of V's columns at a time (16 by 16 for heads of 16): each load of V
       serves 8 queries (with 64-wide rows, 4 queries by 64 columns read V from L2 twice as
       often). */
    const int cols = nv < 2 ? nv : 2, rows = 16 / cols;
    for (int64_t i0 = 0; i0 < len; i0 += 16) {
        for (int64_t b = 0; b < blocks; b += 4) {
            const float *kb = kt + b * 16 * dim;
            for (int r = 0; r < 16; r += 4) {
                const float *qr = q + (i0 + r) * dim;
                float *sr = s + r * keys + b * 16;
                switch (blocks - b) {
                    case 1: scores_f32(qr, kb, dim, 1, sr, keys); break;
                    case 2: scores_f32(qr, kb, dim, 2, sr, keys); break;
                    case 3: scores_f32(qr, kb, dim, 3, sr, keys); break;
                    default: scores_f32(qr, kb, dim, 4, sr, keys);
                }
            }
        }
        int valid = len - i0 < 16 ? (int)(len - i0) : 16;
        float inv[16];
        for (int r = 0; r < valid; r++)
            inv[r] = 1.0f / softmax_f32(s + r * keys, bias ? bias + (i0 + r) * span : 0, scale,
                                        len, keys);
        for (int r = valid; r < 16; r++) memset(s + r * keys, 0, 4 * keys);
        for (int r = 0; r < valid; r += rows)
            for (int64_t c = 0; c < dim; c += cols * 16)
                values_f32(s + r * keys, keys, v + c, dim, len, rows, cols, valid - r, inv + r,
                           out, at + (i0 + r) * ld_out + c, ld_out, bf16);
    }
}

/* Floats a thread's (sequence, head) task needs for sequences of up to `longest` tokens, in
   whole cache lines: its scores [16][keys], then its head's Q, K^T and V [keys][dim] each. */
static int64_t attend_room(int64_t dim, int64_t longest) {
    return ((16 + 3 * dim) * ((longest + 15) / 16 * 16) + 15) / 16 * 16;
}

static int64_t longest_of(const int32_t *cu, int64_t seqs) {
    int64_t longest = 0;
    for (int64_t i = 0; i < seqs; i++)
        if (cu[i + 1] - cu[i] > longest) longest = cu[i + 1] - cu[i];
    return longest;
}

/* Head h of the sequence of `len` rows from row `start` (q, k, v and stride as in
   `attention_f32`), laid out in `room` (`attend_room`) and attended into out [rows][heads][dim];
   `dim` 16, 32, 64 or 128. */
static inline __attribute__((always_inline)) void attend_task(
    const void *q, const void *k, const void *v, const int64_t stride[3], int64_t start,
    int64_t len, int64_t h, int64_t heads, int64_t dim, float scale, const float *bias,
    int64_t span, const int bf16, void *out, float *room) {
    int64_t keys = (len + 15) / 16 * 16;
    float *s = room, *qp = s + 16 * keys, *kt = qp + dim * keys, *vp = kt + dim * keys;
    const int64_t from[3] = {start * stride[0] + h * dim, start * stride[1] + h * dim,
                             start * stride[2] + h * dim};
    pack_f32(q, k, v, from, stride, len, keys, dim, bf16, qp, kt, vp);
    const float *b = bias ? bias + h * span * span : 0;
    int64_t o = (start * heads + h) * dim, hidden = heads * dim;
    switch (dim) {
#define ATTEND(nv) attend_f32(qp, kt, vp, len, keys, nv, scale, b, span, out, o, hidden, bf16, s)
        case 16: ATTEND(1); break;
        case 32: ATTEND(2); break;
        case 64: ATTEND(4); break;
        default: ATTEND(8);
#undef ATTEND
    }
}

/* The short pass's attention where heads are 16, 32, 64 or 128 wide: each thread's
   (sequence, head) tasks as the longer passes' float32 attention runs them (`attend_task`), in
   `mine` (room for `attend_room` floats); the output rounded to bfloat16 after, with `rnd`.
   `attention` above, one query and one chain at a time, waits on each FMA's latency:
   all-MiniLM-L6-v2's 16-token pass ran 0.965x with this one, 64 tokens 0.94x (Zen 4,
   alternated). */
static void attend_heads(const float *qkv, const int32_t *cu, int64_t seqs, int64_t hidden,
                         int64_t heads, const float *bias, int64_t span, float *ctx, int rnd,
                         float *mine) {
    int64_t dim = hidden / heads;
    const int64_t stride[3] = {3 * hidden, 3 * hidden, 3 * hidden};
    float scale = 1.0f / sqrtf((float)dim);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < seqs * heads; task++) {
        int64_t i = task / heads, h = task % heads, start = cu[i], len = cu[i + 1] - start;
        attend_task(qkv, qkv + hidden, qkv + 2 * hidden, stride, start, len, h, heads, dim,
                    scale, bias, span, 0, ctx, mine);
        if (rnd)
            for (int64_t r = start; r < start + len; r++)
                for (int64_t d = 0; d < dim; d += 16) {
                    float *at = ctx + r * hidden + h * dim + d;
                    _mm512_storeu_ps(at, to_bf16_value(_mm512_loadu_ps(at)));
                }
    }
}

/* Attention within each of `seqs` sequences (bounds in `cu`) of packed rows, float32, or
   bfloat16 where `bf16` (widened as they are laid out, the work in float32, the output rounded
   to bfloat16): q, k and v [rows][heads][dim], stride[0], stride[1] and stride[2] values from one
   row to the next, out [rows][heads][dim] contiguous; `dim` 16, 32, 64 or 128. `bias` (or NULL)
   as in `vp_attention_bf16`. Returns 0, or -1 where it could not allocate its scratch. */
static inline __attribute__((always_inline)) int attention_f32(
    const void *q, const void *k, const void *v, const int64_t stride[3], const int32_t *cu,
    int64_t seqs, int64_t heads, int64_t dim, float scale, const float *bias, int64_t span,
    const int bf16, void *out, int threads) {
    size_t own = 4 * (size_t)attend_room(dim, longest_of(cu, seqs));
    char *mem = scratch(own * threads);
    if (!mem) return -1;
#pragma omp parallel num_threads(threads)
    {
        float *room = (float *)(mem + own * omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < seqs * heads; task++) {
            int64_t i = task / heads, h = task % heads;
            attend_task(q, k, v, stride, cu[i], cu[i + 1] - cu[i], h, heads, dim, scale, bias,
                        span, bf16, out, room);
        }
    }
    unscratch(mem, own * threads);
    return 0;
}

int vp_attention_f32(const float *q, const float *k, const float *v, const int64_t stride[3],
                     const int32_t *cu, int64_t seqs, int64_t heads, int64_t dim, float scale,
                     const float *bias, int64_t span, float *out, int threads) {
    return attention_f32(q, k, v, stride, cu, seqs, heads, dim, scale, bias, span, 0, out,
                         threads);
}

/* A bfloat16 model's attention where the CPU has no AMX (bf16_kernels.py says why). */
int vp_attention_bf16_f32(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          const int64_t stride[3], const int32_t *cu, int64_t seqs, int64_t heads,
                          int64_t dim, float scale, const float *bias, int64_t span,
                          uint16_t *out, int threads) {
    return attention_f32(q, k, v, stride, cu, seqs, heads, dim, scale, bias, span, 1, out,
                         threads);
}

/* A bfloat16 model's attention on AVX512-BF16's dot products, where the CPU has them but no AMX
   (bf16_kernels.py says why). As `attention_f32` is laid out and blocked, but Q K^T and P V
   each multiply pairs of bfloat16 values into float32 sums (vdpbf16ps: two products a lane,
   each exact in float32): Q's rows as they are, K^T in blocks of 16 keys by pairs of dimensions,
   V's rows in pairs; the softmax in float32 as `softmax_f32`, its exponentials rounded to
   bfloat16 for P V (as ATen's flash kernel and the AMX kernel round them), their sum not. With
   a bias (`split`), P goes in two bfloat16 parts, its rounding and what the rounding left off,
   as in `vp_attention_bf16`. It also takes float32 rows (`f32`: an int8 model's), rounded to
   bfloat16 as they are laid out, and writes float32 out. */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)

#define BF16DOT __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

/* The pairs of a row's values from element `at`, `m` lanes of them (16, or 8 for heads of 16):
   bfloat16 as they are, or float32 (`f32`) rounded to bfloat16. */
BF16DOT static inline __attribute__((always_inline)) __m512i pairs_at(const void *p, int64_t at,
                                                                      __mmask16 m,
                                                                      const int f32) {
    if (!f32) return _mm512_maskz_loadu_epi32(m, (const uint16_t *)p + at);
    const float *x = (const float *)p + at;
    __m512 hi = m == 0xFFFF ? _mm512_loadu_ps(x + 16) : _mm512_setzero_ps();
    return (__m512i)_mm512_cvtne2ps_pbh(hi, _mm512_loadu_ps(x));
}

/* 16 of a row's values from element `at` as bfloat16 in the low half of each 32-bit lane. */
BF16DOT static inline __attribute__((always_inline)) __m512i halves_at(const void *p, int64_t at,
                                                                       const int f32) {
    __m256i h = f32 ? (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)p + at))
                    : _mm256_loadu_si256((const void *)((const uint16_t *)p + at));
    return _mm512_cvtepu16_epi32(h);
}

/* One head of a sequence's `len` rows (as `pack_f32` takes them, bfloat16, or float32 where
   `f32`) laid out in pairs of bfloat16 values, `keys` (len rounded up to 16) rows, the rows past
   len zero: qp [keys][dim / 2] (the rows as they are), kt [keys / 16][dim / 2][16] (K^T by pairs
   of dimensions, in blocks of 16 keys), vp [keys / 2][dim] (V's rows j and j + 1 side by
   side). */
BF16DOT static inline __attribute__((always_inline)) void pack_dot(
    const void *q, const void *k, const void *v, const int64_t at[3], const int64_t stride[3],
    int64_t len, int64_t keys, int64_t dim, const int f32, uint32_t *qp, uint32_t *kt,
    uint32_t *vp) {
    const int64_t half = dim / 2;
    const __mmask16 m = lanes(half);
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t j0 = 0; j0 < keys; j0 += 16) {
        for (int64_t j = j0; j < j0 + 16; j++)
            for (int64_t c = 0; c < half; c += 16)
                _mm512_mask_storeu_epi32(
                    qp + j * half + c, m,
                    j < len ? pairs_at(q, at[0] + j * stride[0] + 2 * c, m, f32) : zero);
        for (int64_t j = j0; j < j0 + 16; j += 2)
            for (int64_t c = 0; c < dim; c += 16) {
                int64_t r = at[2] + j * stride[2] + c;
                __m512i lo = j < len ? halves_at(v, r, f32) : zero;
                __m512i hi =
                    j + 1 < len ? _mm512_slli_epi32(halves_at(v, r + stride[2], f32), 16) : zero;
                _mm512_storeu_si512(vp + j / 2 * dim + c, _mm512_or_si512(lo, hi));
            }
        for (int64_t c = 0; c < half; c += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + i < len ? pairs_at(k, at[1] + (j0 + i) * stride[1] + 2 * c, m, f32)
                                    : zero;
            transpose16(r);
            uint32_t *to = kt + j0 * half + c * 16;
            for (int i = 0; i < 16 && c + i < half; i++) _mm512_storeu_si512(to + 16 * i, r[i]);
        }
    }
}

/* As `scores_f32`, on pairs: 4 queries (qp's rows, `half` pairs apart) against nv blocks of 16
   keys. */
BF16DOT static inline __attribute__((always_inline)) void scores_dot(const uint32_t *q,
                                                                     const uint32_t *kt,
                                                                     int64_t half, const int nv,
                                                                     float *s, int64_t ld) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < nv; n++) acc[r][n] = _mm512_setzero_ps();
    for (int64_t d = 0; d < half; d++) {
        __m512i kv[4];
        for (int n = 0; n < nv; n++) kv[n] = _mm512_loadu_si512(kt + n * half * 16 + d * 16);
        for (int r = 0; r < 4; r++) {
            __m512bh qb = (__m512bh)_mm512_set1_epi32((int)q[r * half + d]);
            for (int n = 0; n < nv; n++)
                acc[r][n] = _mm512_dpbf16_ps(acc[r][n], qb, (__m512bh)kv[n]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < nv; n++) _mm512_storeu_ps(s + r * ld + n * 16, acc[r][n]);
}

/* The bfloat16 parts of 16 float32 values x: x rounded to bfloat16 in *hi, what that left off
   (x less *hi, itself rounded) in *lo. */
BF16DOT static inline void parts(__m512 x, __m256i *hi, __m256i *lo) {
    *hi = (__m256i)_mm512_cvtneps_pbh(x);
    *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, widened(*hi)));
}

/* As `softmax_f32`, the exponentials written to p[0..keys) in bfloat16 (zero past len), and
   where `lo` is not NULL in two parts (p and lo, `parts`); returns their sum in float32. */
BF16DOT static inline float softmax_dot(float *s, uint16_t *p, uint16_t *lo, const float *add,
                                        float scale, int64_t len, int64_t keys) {
    __m512 shift;
    const __m512 cv = _mm512_set1_ps(row_base2(s, add, scale, len, &shift));
    int64_t full = len / 16 * 16, j;
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    for (j = 0; j + 32 <= full; j += 32) {
        __m512 e0 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j), cv, shift));
        __m512 e1 = exp2_neg(_mm512_fmsub_ps(_mm512_loadu_ps(s + j + 16), cv, shift));
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        if (lo) {
            __m256i h, l;
            parts(e0, &h, &l);
            _mm256_storeu_si256((__m256i *)(p + j), h);
            _mm256_storeu_si256((__m256i *)(lo + j), l);
            parts(e1, &h, &l);
            _mm256_storeu_si256((__m256i *)(p + j + 16), h);
            _mm256_storeu_si256((__m256i *)(lo + j + 16), l);
        } else {
            _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
        }
    }
    for (; j < keys; j += 16) {
        __mmask16 m = lanes(len - j);
        __m512 e = _mm512_maskz_mov_ps(
            m, exp2_neg(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, s + j), cv, shift)));
        sum0 = _mm512_add_ps(sum0, e);
        if (lo) {
            __m256i h, l;
            parts(e, &h, &l);
            _mm256_storeu_si256((__m256i *)(p + j), h);
            _mm256_storeu_si256((__m256i *)(lo + j), l);
        } else {
            _mm256_storeu_si256((__m256i *)(p + j), (__m256i)_mm512_cvtneps_pbh(e));
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
}

/* As `values_f32`, on pairs: p's rows (`ld` pairs apart; and lo's, P's second parts, where
   `split`) against `pairs` pairs of V's rows (`ld_v` apart), the output rounded to bfloat16 (or
   float32 where `f32`). */
BF16DOT static inline __attribute__((always_inline)) void values_dot(
    const uint32_t *p, const uint32_t *lo, const int split, int64_t ld, const uint32_t *v,
    int64_t ld_v, int64_t pairs, const int rows, const int nv, int valid, const float *inv,
    void *out, int64_t at, int64_t ld_out, const int f32) {
    __m512 acc[16];
    for (int i = 0; i < rows * nv; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t j = 0; j < pairs; j++) {
        __m512i vv[2];
        for (int n = 0; n < nv; n++) vv[n] = _mm512_loadu_si512(v + j * ld_v + n * 16);
        for (int r = 0; r < rows; r++) {
            __m512bh pb = (__m512bh)_mm512_set1_epi32((int)p[r * ld + j]);
            for (int n = 0; n < nv; n++)
                acc[r * nv + n] = _mm512_dpbf16_ps(acc[r * nv + n], pb, (__m512bh)vv[n]);
            if (split) {
                __m512bh lb = (__m512bh)_mm512_set1_epi32((int)lo[r * ld + j]);
                for (int n = 0; n < nv; n++)
                    acc[r * nv + n] = _mm512_dpbf16_ps(acc[r * nv + n], lb, (__m512bh)vv[n]);
            }
        }
    }
    for (int r = 0; r < rows && r < valid; r++) {
        __m512 f = _mm512_set1_ps(inv[r]);
        for (int n = 0; n < nv; n++)
            store16(out, at + r * ld_out + n * 16, _mm512_mul_ps(acc[r * nv + n], f), !f32);
    }
}

/* One head of one sequence, 16 queries at a time, as `attend_f32`; `s` [16][keys] float32
   scores, `p` [16][keys] their exponentials in bfloat16 (and `lo` their second parts, or NULL
   for P in one part). */
BF16DOT static inline __attribute__((always_inline)) void attend_dot(
    const uint32_t *q, const uint32_t *kt, const uint32_t *v, int64_t len, int64_t keys,
    const int nv, float scale, const float *bias, int64_t span, void *out, int64_t at,
    int64_t ld_out, const int f32, float *s, uint16_t *p, uint16_t *lo) {
    const int64_t dim = nv * 16, half = dim / 2, blocks = keys / 16, pairs = (len + 1) / 2;
    const int cols = nv < 2 ? nv : 2, rows = 16 / cols;
    for (int64_t i0 = 0; i0 < len; i0 += 16) {
        for (int64_t b = 0; b < blocks; b += 4) {
            const uint32_t *kb = kt + b * 16 * half;
            for (int r = 0; r < 16; r += 4) {
                const uint32_t *qr = q + (i0 + r) * half;
                float *sr = s + r * keys + b * 16;
                switch (blocks - b) {
                    case 1: scores_dot(qr, kb, half, 1, sr, keys); break;
                    case 2: scores_dot(qr, kb, half, 2, sr, keys); break;
                    case 3: scores_dot(qr, kb, half, 3, sr, keys); break;
                    default: scores_dot(qr, kb, half, 4, sr, keys);
                }
            }
        }
        int valid = len - i0 < 16 ? (int)(len - i0) : 16;
        float inv[16];
        for (int r = 0; r < valid; r++)
            inv[r] = 1.0f / softmax_dot(s + r * keys, p + r * keys, lo ? lo + r * keys : 0,
                                        bias ? bias + (i0 + r) * span : 0, scale, len, keys);
        for (int r = valid; r < 16; r++) {
            memset(p + r * keys, 0, 2 * keys);
            if (lo) memset(lo + r * keys, 0, 2 * keys);
        }
        for (int r = 0; r < valid; r += rows)
            for (int64_t c = 0; c < dim; c += cols * 16) {
                const uint32_t *pr = (const uint32_t *)(p + r * keys);
                const uint32_t *lr = lo ? (const uint32_t *)(lo + r * keys) : 0;
                int64_t o = at + (i0 + r) * ld_out + c;
                if (lo)
                    values_dot(pr, lr, 1, keys / 2, v + c, dim, pairs, rows, cols, valid - r,
                               inv + r, out, o, ld_out, f32);
                else
                    values_dot(pr, lr, 0, keys / 2, v + c, dim, pairs, rows, cols, valid - r,
                               inv + r, out, o, ld_out, f32);
            }
    }
}

/* Arguments as `vp_attention_bf16`'s; q, k, v and out float32 where `f32`. */
BF16DOT static inline __attribute__((always_inline)) int attention_dot(
    const void *q, const void *k, const void *v, const int64_t stride[3], const int32_t *cu,
    int64_t seqs, int64_t heads, int64_t dim, float scale, const float *bias, int64_t span,
    int split, const int f32, void *out, int threads) {
    int64_t longest, *at = laid_out(cu, seqs, 16, &longest);
    if (!at) return -1;
    int64_t hidden = heads * dim;
    /* Each thread's scores [16][longest] (float32) and their exponentials' two parts
       (bfloat16), then its head's Q, K^T and V [longest][dim / 2] pairs each. */
    size_t own = ((size_t)(4 * 16 + 2 * 2 * 16 + 3 * 2 * dim) * longest + 63) / 64 * 64;
    char *mem = scratch(own * threads);
    if (!mem) {
        free(at);
        return -1;
    }
#pragma omp parallel num_threads(threads)
    {
        float *s = (float *)(mem + own * omp_get_thread_num());
        uint16_t *p = (uint16_t *)(s + 16 * longest), *lo = split ? p + 16 * longest : 0;
        uint32_t *qp = (uint32_t *)(p + 2 * 16 * longest), *kt = qp + dim / 2 * longest;
        uint32_t *vp = kt + dim / 2 * longest;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < seqs * heads; task++) {
            int64_t i = task / heads, h = task % heads, keys = at[i + 1] - at[i];
            int64_t start = cu[i], len = cu[i + 1] - start;
            const int64_t from[3] = {start * stride[0] + h * dim, start * stride[1] + h * dim,
                                     start * stride[2] + h * dim};
            pack_dot(q, k, v, from, stride, len, keys, dim, f32, qp, kt, vp);
            const float *b = bias ? bias + h * span * span : 0;
            int64_t o = (start * heads + h) * dim;
            switch (dim) {
                case 16:
                    attend_dot(qp, kt, vp, len, keys, 1, scale, b, span, out, o, hidden, f32, s,
                               p, lo);
                    break;
                case 32:
                    attend_dot(qp, kt, vp, len, keys, 2, scale, b, span, out, o, hidden, f32, s,
                               p, lo);
                    break;
                case 64:
                    attend_dot(qp, kt, vp, len, keys, 4, scale, b, span, out, o, hidden, f32, s,
                               p, lo);
                    break;
                default:
                    attend_dot(qp, kt, vp, len, keys, 8, scale, b, span, out, o, hidden, f32, s,
                               p, lo);
            }
        }
    }
    unscratch(mem, own * threads);
    free(at);
    return 0;
}

BF16DOT int vp_attention_bf16_dot(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const int64_t stride[3], const int32_t *cu, int64_t seqs,
                                  int64_t heads, int64_t dim, float scale, const float *bias,
                                  int64_t span, int split, uint16_t *out, int threads) {
    return attention_dot(q, k, v, stride, cu, seqs, heads, dim, scale, bias, span, split, 0, out,
                         threads);
}

/* An int8 model's attention on its float32 rows (int8.py says why). */
BF16DOT int vp_attention_f32_dot(const float *q, const float *k, const float *v,
                                 const int64_t stride[3], const int32_t *cu, int64_t seqs,
                                 int64_t heads, int64_t dim, float scale, const float *bias,
                                 int64_t span, int split, float *out, int threads) {
    return attention_dot(q, k, v, stride, cu, seqs, heads, dim, scale, bias, span, split, 1, out,
                         threads);
}

#endif

static void layer_norm(const float *in, int64_t rows, int64_t n, const float *w, const float *b,
                       float eps, float *out, int rnd) {
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
            _mm512_mask_storeu_ps(y + i, m, rnd ? to_bf16_value(v) : v);
        }
    }
}

/* A float32 model's embeddings of a pass's `rows` tokens into out[rows, hidden]: the rows
   tables[t][ids[t][r]] (row 0 where ids[t] is NULL) summed in the order of the tables, as the
   model's own additions run, then LayerNorm'd. One call where the model's embedding module is
   six torch ops, each through the dispatcher with its caches cold from the pass before: a
   16-token query's took 145 us there against 56. Returns 0, or -1 (nothing written) where an
   id is outside its table (`sizes` rows each). */
int vp_embed_norm(const float *const *tables, const int64_t *const *ids, const int64_t *sizes,
                  int64_t n_tables, int64_t rows, int64_t hidden, const float *w, const float *b,
                  float eps, float *out) {
    for (int64_t t = 0; t < n_tables; t++)
        for (int64_t r = 0; ids[t] && r < rows; r++)
            if (ids[t][r] < 0 || ids[t][r] >= sizes[t]) return -1;
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * hidden;
        for (int64_t i = 0; i < hidden; i += 16) {
            __mmask16 m = lanes(hidden - i);
            __m512 x = _mm512_setzero_ps();
            for (int64_t t = 0; t < n_tables; t++) {
                const float *row = tables[t] + (ids[t] ? ids[t][r] : 0) * hidden;
                __m512 v = _mm512_maskz_loadu_ps(m, row + i);
                x = t ? _mm512_add_ps(x, v) : v;
            }
            _mm512_mask_storeu_ps(o + i, m, x);
        }
    }
    layer_norm(out, rows, hidden, w, b, eps, out, 0);
    return 0;
}

/* Each sequence's vector from a pass's hidden states x[rows, hidden] (`cu`: the sequences'
   bounds) into out[seqs, hidden]: its first row (`first`), or the mean of its rows, added one
   after another in float32 from zero and divided by its length, as pooling.py's `pool` adds
   them (the same bits). */
void vp_pool(const float *x, const int32_t *cu, int64_t seqs, int64_t hidden, int first,
             float *out) {
    for (int64_t s = 0; s < seqs; s++) {
        const float *rows = x + (int64_t)cu[s] * hidden;
        int64_t n = cu[s + 1] - cu[s];
        __m512 length = _mm512_set1_ps((float)n);
        for (int64_t i = 0; i < hidden; i += 16) {
            __mmask16 m = lanes(hidden - i);
            __m512 v = _mm512_setzero_ps();
            if (first)
                v = _mm512_maskz_loadu_ps(m, rows + i);
            else {
                for (int64_t r = 0; r < n; r++)
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rows + r * hidden + i));
                v = _mm512_div_ps(v, length);
            }
            _mm512_mask_storeu_ps(out + s * hidden + i, m, v);
        }
    }
}

/* Runs `n_layers` layers over x[rows, hidden] in place, every layer adding `bias` (or NULL, see
   attention; `span` at least the longest sequence) to its scores; the layers' weights are
   bfloat16 ones, on AMX, where `bf16` is set (`vp_amx_ready` first), bfloat16 ones on the
   float32 path where `half` is (the work of their float32 copies), else float32. `work`
   holds rows * (5 * hidden + inner) floats, and for bfloat16 weights room for a multiple of 16 rows
   of max(hidden, inner), rounded up to a multiple of 32, bfloat16 values after them. */
void vp_post_norm_encoder(const Layer *layers, int64_t n_layers, float *x, int64_t rows,
                          int64_t hidden, int64_t inner, int64_t heads, const int32_t *cu,
                          int64_t seqs, const float *bias, int64_t span, float *work,
                          int threads, int bf16, int half) {
    float *qkv = work, *ctx = qkv + rows * 3 * hidden, *sum = ctx + rows * hidden;
    float *inner_out = sum + rows * hidden;
    uint16_t *abf = bf16 ? (uint16_t *)(inner_out + rows * inner) : 0;
    int64_t dim = hidden / heads, room = attend_room(dim, longest_of(cu, seqs));
    float *rooms = dim == 16 || dim == 32 || dim == 64 || dim == 128
                       ? (float *)scratch(4 * room * threads)
                       : 0;
#pragma omp parallel num_threads(threads)
    {
        float *mine = rooms ? rooms + room * omp_get_thread_num() : 0;
        if (bf16) tiles_on();
        for (int64_t l = 0; l < n_layers; l++) {
            const Layer *L = layers + l;
            const void *then = l + 1 < n_layers ? L[1].qkv : 0;
            linear(x, rows, hidden, L->qkv, L->qkv_bias, 3 * hidden, 0, qkv, 0, abf, half,
                   L->attn_out, hidden, hidden);
            if (mine)
                attend_heads(qkv, cu, seqs, hidden, heads, bias, span, ctx, bf16, mine);
            else
                attention(qkv, cu, seqs, hidden, heads, bias, span, ctx, bf16);
            linear(ctx, rows, hidden, L->attn_out, L->attn_out_bias, hidden, x, sum, 0, abf, half,
                   L->ffn_in, hidden, inner);
            layer_norm(sum, rows, hidden, L->norm1, L->norm1_bias, L->eps1, x, bf16);
            linear(x, rows, hidden, L->ffn_in, L->ffn_in_bias, inner, 0, inner_out, 1, abf, half,
                   L->ffn_out, inner, hidden);
            linear(inner_out, rows, inner, L->ffn_out, L->ffn_out_bias, hidden, x, sum, 0, abf,
                   half, then, hidden, 3 * hidden);
            layer_norm(sum, rows, hidden, L->norm2, L->norm2_bias, L->eps2, x, bf16);
        }
        if (bf16) tiles_off();
    }
    if (rooms) unscratch((char *)rooms, 4 * room * threads);
}

/* A pass of an int8 model's post-LayerNorm encoder (int8.py), one call for every layer:
   each linear's input rows quantized as the modules' passes quantize them (`quantize_row`),
   multiplied by the int8 weights on AVX512-VNNI's dot products (four u8 x s8 products a lane,
   summed exactly in int32), taken back to float32 as oneDNN's int8 GEMM takes its sums (the
   zero point's share subtracted, then times the input's scale, then times the column's), and
   finished as the modules' passes finish oneDNN's output (`int8_finish`); attention and the
   residual LayerNorms on the functions those call. So a token's values are those a pass through
   the modules on oneDNN's GEMM gives it, to the last bit: a text's vector does not depend on the
   pass it runs in. */
#if (defined(__clang__) && __clang_major__ >= 8) || (!defined(__clang__) && __GNUC__ >= 9)

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

typedef struct {
    /* [ceil(n / PANEL)][quads][PANEL][4]: each column's inputs by fours, `k` padded with zero
       weights to 4 * quads; columns past `n` zero. */
    const int8_t *w;
    /* Per column, padded to whole panels: the input's zero point times the column's weight
       sum, the column's scale, its bias (0 where none). */
    const int32_t *zero_sums;
    const float *scales, *bias;
    const float *unsmooth; /* per input */
    float low, step, in_scale;
    int32_t zero;
    int64_t k, quads, n;
} Int8Linear;

typedef struct {
    Int8Linear qkv, attn_out, ffn_in, ffn_out;
    const float *norm1, *norm1_bias, *norm2, *norm2_bias;
    float eps1, eps2;
} Int8Layer;

/* The int8 product's sums c of rows <= ROWS rows and one panel, from column panel * PANEL,
   taken back to float32 and finished into out. */
VNNI static inline void int8_store(__m512i (*c)[3], int rows, const Int8Linear *L,
                                   int64_t panel, const float *scale, float *out, int64_t ld,
                                   int act) {
    int64_t col = panel * PANEL, cols = L->n - col < PANEL ? L->n - col : PANEL;
    __m512 in_scale = _mm512_set1_ps(L->in_scale);
    for (int j = 0; j < 3; j++) {
        __mmask16 m = lanes(cols - 16 * j);
        if (!m) break;
        int64_t at = col + 16 * j;
        __m512i zs = _mm512_loadu_si512(L->zero_sums + at);
        __m512 ws = _mm512_loadu_ps(L->scales + at), b = _mm512_loadu_ps(L->bias + at);
        for (int r = 0; r < rows; r++) {
            __m512 y = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[r][j], zs));
            y = _mm512_mul_ps(_mm512_mul_ps(y, in_scale), ws);
            _mm512_mask_storeu_ps(out + r * ld + at, m,
                                  int8_finish(y, _mm512_set1_ps(scale[r]), b, act));
        }
    }
}

_Static_assert(ROWS == 8, "int8_block names its sums for 8 rows");

/* out[rows, cols] = the finished int8 product of u8 rows a (lda bytes apart) and one panel,
   1 <= rows <= ROWS, cols <= PANEL, of panel `panel`; `rows` a constant in each copy, as
   `block_of`'s. The 24 sums are named variables rather than an array: with
   `__m512i c[ROWS][3]`, read by the store's loop over a variable row count, GCC 12 kept the
   array in memory and stored every sum on each step of the inner loop, and the GEMM ran at half
   its rate (388 against 746 GOP/s on all-MiniLM-L6-v2's four linear shapes at 2,048 rows,
   Zen 4, two threads). */
VNNI static inline __attribute__((always_inline)) void int8_block_of(
    const uint8_t *a, int64_t lda, const int rows, const Int8Linear *L, int64_t panel,
    const float *scale, float *out, int64_t ld, int act) {
    const uint8_t *row[ROWS];
    for (int r = 0; r < ROWS; r++) row[r] = a + (r < rows ? r : 0) * lda;
    const int8_t *w = L->w + panel * L->quads * PANEL * 4;
#define SUMS(r) __m512i c##r##0 = _mm512_setzero_si512(), c##r##1 = c##r##0, c##r##2 = c##r##0;
    SUMS(0) SUMS(1) SUMS(2) SUMS(3) SUMS(4) SUMS(5) SUMS(6) SUMS(7)
#undef SUMS
    for (int64_t i = 0; i < L->quads; i++) {
        const int8_t *p = w + i * PANEL * 4;
        __m512i w0 = _mm512_loadu_si512(p), w1 = _mm512_loadu_si512(p + 64);
        __m512i w2 = _mm512_loadu_si512(p + 128);
        _mm_prefetch((const char *)(p + 8 * PANEL * 4), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + 8 * PANEL * 4 + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + 8 * PANEL * 4 + 128), _MM_HINT_T0);
#define STEP(r)                                            \
    if (r < rows) {                                        \
        int32_t four;                                      \
        memcpy(&four, row[r] + 4 * i, 4);                  \
        __m512i v = _mm512_set1_epi32(four);               \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, v, w0);     \
        c##r##1 = _mm512_dpbusd_epi32(c##r##1, v, w1);     \
        c##r##2 = _mm512_dpbusd_epi32(c##r##2, v, w2);     \
    }
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5) STEP(6) STEP(7)
#undef STEP
    }
    __m512i c[ROWS][3] = {{c00, c01, c02}, {c10, c11, c12}, {c20, c21, c22}, {c30, c31, c32},
                          {c40, c41, c42}, {c50, c51, c52}, {c60, c61, c62}, {c70, c71, c72}};
    int8_store(c, rows, L, panel, scale, out, ld, act);
}

VNNI static void int8_block(const uint8_t *a, int64_t lda, int rows, const Int8Linear *L,
                            int64_t panel, const float *scale, float *out, int64_t ld, int act) {
    switch (rows) {
#define BLOCK_OF(n)                                                                          \
    case n:                                                                                  \
        int8_block_of(a, lda, n, L, panel, scale, out, ld, act);                             \
        break;
        EACH_ROW_COUNT(BLOCK_OF)
#undef BLOCK_OF
    }
}

/* out[rows, n] = L(x[rows, k]), GELU'd where asked: rows quantized into q (rows of 4 * quads
   bytes) and their scales, then the panels shared out among the team. */
VNNI static void int8_linear(const float *x, int64_t rows, const Int8Linear *L, uint8_t *q,
                             float *scale, float *out, int act, int threads) {
    int64_t lda = 4 * L->quads, panels = (L->n + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            uint8_t *qr = q + r * lda;
            scale[r] = quantize_row(x + r * L->k, L->unsmooth, L->k, L->low, L->step, L->zero, qr);
            memset(qr + L->k, 0, lda - L->k);
        }
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++)
            for (int64_t r = 0; r < rows; r += ROWS)
                int8_block(q + r * lda, lda, rows - r < ROWS ? (int)(rows - r) : ROWS, L, p,
                           scale + r, out + r * L->n, L->n, act);
    }
}

/* Runs `n_layers` int8 layers over x[rows, hidden] in place (bias and span as
   vp_post_norm_encoder's). Attention as the modules' passes run it: on AVX512-BF16's dot products,
   the rows rounded (`rounded`, a model without a score bias), else in float32. `scratch` holds
   rows * (5 * hidden + inner + 1) floats, `q` rows * (max(hidden, inner) + 3) bytes. Returns 0,
   or -1 where attention found no memory for its scratch. */
VNNI int vp_int8_post_norm_encoder(const Int8Layer *layers, int64_t n_layers, float *x,
                                   int64_t rows, int64_t hidden, int64_t inner, int64_t heads,
                                   const int32_t *cu, int64_t seqs, const float *bias,
                                   int64_t span, int rounded, float *scratch, uint8_t *q,
                                   int threads) {
    float *qkv = scratch, *ctx = qkv + rows * 3 * hidden, *sum = ctx + rows * hidden;
    float *inner_out = sum + rows * hidden, *scale = inner_out + rows * inner;
    int64_t dim = hidden / heads, stride[3] = {3 * hidden, 3 * hidden, 3 * hidden};
    /* As the longer passes' caller computes it (in double, then taken to float). */
    float softmax_scale = (float)(1.0 / sqrt((double)dim));
    for (int64_t l = 0; l < n_layers; l++) {
        const Int8Layer *L = layers + l;
        int8_linear(x, rows, &L->qkv, q, scale, qkv, 0, threads);
        int failed;
#ifdef BF16DOT
        if (rounded && !bias)
            failed = vp_attention_f32_dot(qkv, qkv + hidden, qkv + 2 * hidden, stride, cu, seqs,
                                          heads, dim, softmax_scale, bias, span, 0, ctx, threads);
        else
#endif
            failed = vp_attention_f32(qkv, qkv + hidden, qkv + 2 * hidden, stride, cu, seqs,
                                      heads, dim, softmax_scale, bias, span, ctx, threads);
        if (failed) return -1;
        int8_linear(ctx, rows, &L->attn_out, q, scale, sum, 0, threads);
        vp_add_norm_f32(sum, x, rows, hidden, L->norm1, L->norm1_bias, L->eps1, x, threads);
        int8_linear(x, rows, &L->ffn_in, q, scale, inner_out, 1, threads);
        int8_linear(inner_out, rows, &L->ffn_out, q, scale, sum, 0, threads);
        vp_add_norm_f32(sum, x, rows, hidden, L->norm2, L->norm2_bias, L->eps2, x, threads);
    }
    return 0;
}

int vp_int8_encoder_built(void) { return 1; }

#else

int vp_int8_encoder_built(void) { return 0; }

#endif
