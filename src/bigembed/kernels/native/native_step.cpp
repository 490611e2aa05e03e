// One training step of bigembed's sampled-negative path in one call, for small dimensions.
//
// The eager path (bigembed.kernels.step.BatchTrainer.step with bigembed.model.fused) is the
// reference; this computes the same thing for the configurations bigembed.kernels.native.step
// admits: standard (non-dynamic) relations with the identity, translation or diagonal operator
// on the rhs side, dot or cos comparator without bias, no global embeddings, no regulariser,
// no max_norm, fp32, ranking / softmax / logistic loss over batch negatives (chunks of
// num_batch_negs, own positive and padding masked at -1e9), uniform negatives (num_uniform
// rows shared by uniform_group consecutive positives) and, with self_negative, the query entity
// (the edge's own head as a tail candidate and its tail as a head candidate, prepared as that
// side's candidates, masked where head and tail are the same entity). It gathers the rows, scores the batch,
// computes the loss, its gradients and the backward of the comparator and operator, and applies
// PBG's Hogwild row Adagrad to the touched rows in place (duplicates summed first, in the
// eager path's order). No threads: one call per Hogwild worker process.
//
// Matrix products are blocked in registers (rows x 16 columns per micro-kernel, GCC vector
// extensions: AVX2 + FMA when compiled with -mavx2 -mfma). Every block of rows (one chunk of
// batch negatives within one uniform group) is scored, turned into score gradients and
// backpropagated while it is in cache.
//
// Built by bigembed.kernels.native.build with the system C++ compiler; plain C ABI (ctypes),
// whose structs are described to the loader by LAYOUT (see below).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float* p) {
    v8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
static inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof v); }
static inline v8 splat(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline float hsum(v8 v) {
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += v[i];
    return s;
}

static const float MASKED = -1e9f;
static const float NORM_EPS = 1e-12f;
static const float ADAGRAD_EPS = 1e-10f;

extern "C" {

// Mirrored by bigembed.kernels.native.abi.StepArgs (ctypes), checked against LAYOUT below.
struct StepArgs {
    float* lhs_emb;
    float* lhs_state;
    float* rhs_emb;
    float* rhs_state;
    const int64_t* lhs_idx;
    const int64_t* rhs_idx;
    const int64_t* lhs_uidx;
    const int64_t* rhs_uidx;
    const float* weight;  // (batch,) or null
    const float* op_param;  // (dim,) or null (identity)
    float* op_grad;  // (dim,) zeroed by the caller, or null
    const float* lhs_glob;  // (dim,) the lhs type's global embedding, or null
    const float* rhs_glob;
    float* lhs_glob_grad;  // (dim,) zeroed by the caller (may be rhs_glob_grad), or null
    float* rhs_glob_grad;
    int64_t lhs_rows;
    int64_t rhs_rows;
    int64_t dim;
    int64_t batch;
    int64_t num_batch_negs;
    int64_t num_uniform;
    int64_t uniform_group;
    int64_t cos;
    int64_t loss_kind;  // 0 softmax, 1 ranking, 2 logistic
    int64_t op_kind;  // 0 identity, 1 translation, 2 diagonal
    int64_t enable_lhs;
    int64_t enable_rhs;
    int64_t shared_table;  // lhs_emb is rhs_emb
    int64_t self_negative;  // the query entity as one more negative of each side
    double margin;
    double rel_weight;
    double lr;
    // outputs
    double loss;
    int64_t violators_lhs;
    int64_t violators_rhs;
};

// Mirrored by bigembed.kernels.native.abi.EvalArgs (ctypes), checked against LAYOUT below.
// One corrupted side of one batch of the withheld-edge eval: scores only, no update.
struct EvalArgs {
    const float* lhs_emb;
    const float* rhs_emb;
    const int64_t* lhs_idx;
    const int64_t* rhs_idx;
    const int64_t* uidx;  // the corrupted side's uniform negatives (groups * num_uniform), or null
    const float* op_param;  // (dim,) or null (identity)
    const float* lhs_glob;  // (dim,) or null
    const float* rhs_glob;
    int64_t dim;
    int64_t batch;
    int64_t num_batch_negs;
    int64_t num_uniform;
    int64_t uniform_group;
    int64_t cos;
    int64_t loss_kind;  // 0 softmax, 1 ranking, 2 logistic
    int64_t op_kind;  // 0 identity, 1 translation, 2 diagonal
    int64_t side;  // the corrupted side: 0 lhs, 1 rhs
    double margin;
    // outputs, (batch,) each
    int64_t* at_least;  // unmasked negatives scoring >= the positive
    int64_t* below;  // unmasked negatives scoring < the positive
    int64_t* valid;  // unmasked negatives
    float* row_loss;  // the loss of each positive (before the edge weight)
};

// The layout of every struct above, for the loader to compare with its ctypes mirror before
// the first call (bigembed.kernels.native.abi.check_layout): per struct one row with its size
// (field ""), then one row per field with its offset, size and kind ('p' pointer, 'i' integer,
// 'f' floating point). A struct changed here and not in the mirror (or the reverse) is refused.
struct LayoutRow {
    const char* type;
    const char* field;
    int64_t offset;
    int64_t size;
    char kind;
};

#define BIGEMBED_STRUCT(S) {#S, "", 0, static_cast<int64_t>(sizeof(S)), 's'}
#define BIGEMBED_FIELD(S, f)                                                              \
    {#S, #f, static_cast<int64_t>(offsetof(S, f)), static_cast<int64_t>(sizeof(S::f)),   \
     std::is_pointer<decltype(S::f)>::value          ? 'p'                              \
     : std::is_integral<decltype(S::f)>::value       ? 'i'                              \
     : std::is_floating_point<decltype(S::f)>::value ? 'f'                              \
                                                     : '?'}

static const LayoutRow LAYOUT[] = {
    BIGEMBED_STRUCT(StepArgs),
    BIGEMBED_FIELD(StepArgs, lhs_emb),
    BIGEMBED_FIELD(StepArgs, lhs_state),
    BIGEMBED_FIELD(StepArgs, rhs_emb),
    BIGEMBED_FIELD(StepArgs, rhs_state),
    BIGEMBED_FIELD(StepArgs, lhs_idx),
    BIGEMBED_FIELD(StepArgs, rhs_idx),
    BIGEMBED_FIELD(StepArgs, lhs_uidx),
    BIGEMBED_FIELD(StepArgs, rhs_uidx),
    BIGEMBED_FIELD(StepArgs, weight),
    BIGEMBED_FIELD(StepArgs, op_param),
    BIGEMBED_FIELD(StepArgs, op_grad),
    BIGEMBED_FIELD(StepArgs, lhs_glob),
    BIGEMBED_FIELD(StepArgs, rhs_glob),
    BIGEMBED_FIELD(StepArgs, lhs_glob_grad),
    BIGEMBED_FIELD(StepArgs, rhs_glob_grad),
    BIGEMBED_FIELD(StepArgs, lhs_rows),
    BIGEMBED_FIELD(StepArgs, rhs_rows),
    BIGEMBED_FIELD(StepArgs, dim),
    BIGEMBED_FIELD(StepArgs, batch),
    BIGEMBED_FIELD(StepArgs, num_batch_negs),
    BIGEMBED_FIELD(StepArgs, num_uniform),
    BIGEMBED_FIELD(StepArgs, uniform_group),
    BIGEMBED_FIELD(StepArgs, cos),
    BIGEMBED_FIELD(StepArgs, loss_kind),
    BIGEMBED_FIELD(StepArgs, op_kind),
    BIGEMBED_FIELD(StepArgs, enable_lhs),
    BIGEMBED_FIELD(StepArgs, enable_rhs),
    BIGEMBED_FIELD(StepArgs, shared_table),
    BIGEMBED_FIELD(StepArgs, self_negative),
    BIGEMBED_FIELD(StepArgs, margin),
    BIGEMBED_FIELD(StepArgs, rel_weight),
    BIGEMBED_FIELD(StepArgs, lr),
    BIGEMBED_FIELD(StepArgs, loss),
    BIGEMBED_FIELD(StepArgs, violators_lhs),
    BIGEMBED_FIELD(StepArgs, violators_rhs),
    BIGEMBED_STRUCT(EvalArgs),
    BIGEMBED_FIELD(EvalArgs, lhs_emb),
    BIGEMBED_FIELD(EvalArgs, rhs_emb),
    BIGEMBED_FIELD(EvalArgs, lhs_idx),
    BIGEMBED_FIELD(EvalArgs, rhs_idx),
    BIGEMBED_FIELD(EvalArgs, uidx),
    BIGEMBED_FIELD(EvalArgs, op_param),
    BIGEMBED_FIELD(EvalArgs, lhs_glob),
    BIGEMBED_FIELD(EvalArgs, rhs_glob),
    BIGEMBED_FIELD(EvalArgs, dim),
    BIGEMBED_FIELD(EvalArgs, batch),
    BIGEMBED_FIELD(EvalArgs, num_batch_negs),
    BIGEMBED_FIELD(EvalArgs, num_uniform),
    BIGEMBED_FIELD(EvalArgs, uniform_group),
    BIGEMBED_FIELD(EvalArgs, cos),
    BIGEMBED_FIELD(EvalArgs, loss_kind),
    BIGEMBED_FIELD(EvalArgs, op_kind),
    BIGEMBED_FIELD(EvalArgs, side),
    BIGEMBED_FIELD(EvalArgs, margin),
    BIGEMBED_FIELD(EvalArgs, at_least),
    BIGEMBED_FIELD(EvalArgs, below),
    BIGEMBED_FIELD(EvalArgs, valid),
    BIGEMBED_FIELD(EvalArgs, row_loss),
};

// The rows of LAYOUT: their number, and each through the out-parameters.
int64_t bigembed_native_layout_rows(void) { return sizeof(LAYOUT) / sizeof(LAYOUT[0]); }
int bigembed_native_layout_row(int64_t i, const char** type, const char** field,
                               int64_t* offset, int64_t* size, char* kind) {
    if (i < 0 || i >= bigembed_native_layout_rows()) return -1;
    *type = LAYOUT[i].type;
    *field = LAYOUT[i].field;
    *offset = LAYOUT[i].offset;
    *size = LAYOUT[i].size;
    *kind = LAYOUT[i].kind;
    return 0;
}

}  // extern "C"

namespace {

// ------------------------------------------------------------------ matrix products
// C[M x N] (ldc) = or += X Y, X(i, k) = X[i * xi + k * xk], Y row-major (K x N, ldy), N % 8 == 0.
template <int R, int V>
inline void micro(int64_t K, const float* X, int64_t xi, int64_t xk, const float* Y, int64_t ldy,
                  float* C, int64_t ldc, bool acc) {
    v8 c[R][V];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) c[r][v] = acc ? load8(C + r * ldc + 8 * v) : (v8){};
    for (int64_t k = 0; k < K; ++k) {
        v8 y[V];
        for (int v = 0; v < V; ++v) y[v] = load8(Y + k * ldy + 8 * v);
        for (int r = 0; r < R; ++r) {
            v8 b = splat(X[r * xi + k * xk]);
            for (int v = 0; v < V; ++v) c[r][v] += b * y[v];
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) store8(C + r * ldc + 8 * v, c[r][v]);
}

template <int R>
inline void row_block(int64_t N, int64_t K, const float* X, int64_t xi, int64_t xk,
                      const float* Y, int64_t ldy, float* C, int64_t ldc, bool acc) {
    int64_t j = 0;
    for (; j + 16 <= N; j += 16) micro<R, 2>(K, X, xi, xk, Y + j, ldy, C + j, ldc, acc);
    if (j < N) micro<R, 1>(K, X, xi, xk, Y + j, ldy, C + j, ldc, acc);
}

template <int R0>
void gemm_rows(int64_t M, int64_t N, int64_t K, const float* X, int64_t xi, int64_t xk,
               const float* Y, int64_t ldy, float* C, int64_t ldc, bool acc) {
    int64_t i = 0;
    for (; i + R0 <= M; i += R0)
        row_block<R0>(N, K, X + i * xi, xi, xk, Y, ldy, C + i * ldc, ldc, acc);
    const float* x = X + i * xi;
    float* c = C + i * ldc;
    switch (M - i) {
        case 5: row_block<5>(N, K, x, xi, xk, Y, ldy, c, ldc, acc); break;
        case 4: row_block<4>(N, K, x, xi, xk, Y, ldy, c, ldc, acc); break;
        case 3: row_block<3>(N, K, x, xi, xk, Y, ldy, c, ldc, acc); break;
        case 2: row_block<2>(N, K, x, xi, xk, Y, ldy, c, ldc, acc); break;
        case 1: row_block<1>(N, K, x, xi, xk, Y, ldy, c, ldc, acc); break;
        default: break;
    }
}

// Blocks of 6 rows (12 accumulators), or of 5 when that leaves no small remainder (M = 50).
void gemm(int64_t M, int64_t N, int64_t K, const float* X, int64_t xi, int64_t xk, const float* Y,
          int64_t ldy, float* C, int64_t ldc, bool acc) {
    if (M % 6 != 0 && M % 6 < 4 && M % 5 == 0)
        gemm_rows<5>(M, N, K, X, xi, xk, Y, ldy, C, ldc, acc);
    else
        gemm_rows<6>(M, N, K, X, xi, xk, Y, ldy, C, ldc, acc);
}

inline float dot(const float* a, const float* b, int64_t dp) {
    v8 s = {};
    for (int64_t d = 0; d < dp; d += 8) s += load8(a + d) * load8(b + d);
    return hsum(s);
}

inline void axpy(float alpha, const float* x, float* y, int64_t dp) {
    v8 a = splat(alpha);
    for (int64_t d = 0; d < dp; d += 8) store8(y + d, load8(y + d) + a * load8(x + d));
}

// (rows, dp) -> (dp, cols_padded) transposed copy of `rows` rows; padding columns zero.
void transpose(const float* src, int64_t rows, int64_t dp, float* dst, int64_t ldd) {
    for (int64_t d = 0; d < dp; ++d) {
        float* out = dst + d * ldd;
        for (int64_t r = 0; r < rows; ++r) out[r] = src[r * dp + d];
        for (int64_t r = rows; r < ldd; ++r) out[r] = 0.f;
    }
}

inline int64_t pad8(int64_t n) { return (n + 7) / 8 * 8; }

// ------------------------------------------------------------------ scratch
struct Scratch {
    std::vector<float> buf;
    std::vector<int32_t> slot_of;  // table row -> slot of the dedup, -1 when untouched
    std::vector<int64_t> row_of;
    std::vector<float> summed;
};
thread_local Scratch scratch;

// One side's rows: raw gathered, operator output (diagonal backward), prepared (normalised),
// inverse norms, gradients. All (rows + spare, dp), zero padded.
struct Rows {
    float* raw;
    float* prep;
    float* inv;
    float* grad;
    int64_t n;
};

void gather(const float* table, const int64_t* idx, int64_t n, int64_t dim, int64_t dp,
            float* out) {
    for (int64_t i = 0; i < n; ++i) {
        std::memcpy(out + i * dp, table + idx[i] * dim, dim * sizeof(float));
        for (int64_t d = dim; d < dp; ++d) out[i * dp + d] = 0.f;
    }
}

// prep = normalize(op(raw + glob)) (cos) or op(raw + glob) (dot); op: 0 none, 1 + param,
// 2 * param; glob: the entity type's global embedding or null.
void prepare(Rows& s, int64_t dp, bool cos, int op, const float* param, const float* glob) {
    for (int64_t i = 0; i < s.n; ++i) {
        const float* x = s.raw + i * dp;
        float* y = s.prep + i * dp;
        if (glob != nullptr)
            for (int64_t d = 0; d < dp; ++d) y[d] = x[d] + glob[d];
        else if (y != x)
            std::memcpy(y, x, dp * sizeof(float));
        if (op == 1)
            for (int64_t d = 0; d < dp; ++d) y[d] += param[d];
        else if (op == 2)
            for (int64_t d = 0; d < dp; ++d) y[d] *= param[d];
        if (cos) {
            float inv = 1.f / std::fmax(std::sqrt(dot(y, y, dp)), NORM_EPS);
            s.inv[i] = inv;
            v8 vi = splat(inv);
            for (int64_t d = 0; d < dp; d += 8) store8(y + d, load8(y + d) * vi);
        }
    }
}

// grad of prep -> grad of raw, in place; accumulates the operator's and the global
// embedding's parameter gradients.
void unprepare(Rows& s, int64_t dp, bool cos, int op, const float* param, float* op_grad,
               const float* glob, float* glob_grad) {
    for (int64_t i = 0; i < s.n; ++i) {
        float* g = s.grad + i * dp;
        if (cos) {
            const float* y = s.prep + i * dp;
            float inv = s.inv[i];
            float proj = inv >= 1.f / NORM_EPS ? 0.f : dot(g, y, dp);
            v8 p = splat(proj), vi = splat(inv);
            for (int64_t d = 0; d < dp; d += 8)
                store8(g + d, (load8(g + d) - load8(y + d) * p) * vi);
        }
        if (op == 1) {
            for (int64_t d = 0; d < dp; ++d) op_grad[d] += g[d];
        } else if (op == 2) {
            const float* x = s.raw + i * dp;
            for (int64_t d = 0; d < dp; ++d) {
                op_grad[d] += g[d] * (glob != nullptr ? x[d] + glob[d] : x[d]);
                g[d] *= param[d];
            }
        }
        if (glob != nullptr)
            for (int64_t d = 0; d < dp; ++d) glob_grad[d] += g[d];
    }
}

inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

typedef int32_t v8i __attribute__((vector_size(32)));

// exp of 8 floats (Cephes' expf: range reduction by ln 2, degree-5 polynomial; ~1 ulp).
// Below -87 (masked scores) the result is exactly 0, as expf's underflow.
inline v8 exp8(v8 x) {
    const v8 lo = splat(-87.0f);
    v8 xc = x < lo ? lo : x;
    xc = xc > splat(88.0f) ? splat(88.0f) : xc;
    const v8 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    v8 fx = (xc * splat(1.44269504088896341f) + magic) - magic;
    v8 r = xc - fx * splat(0.693359375f) - fx * splat(-2.12194440e-4f);
    v8 y = splat(1.9875691500e-4f);
    y = y * r + splat(1.3981999507e-3f);
    y = y * r + splat(8.3334519073e-3f);
    y = y * r + splat(4.1665795894e-2f);
    y = y * r + splat(1.6666665459e-1f);
    y = y * r + splat(5.0000001201e-1f);
    y = y * (r * r) + r + splat(1.0f);
    v8i n = __builtin_convertvector(fx, v8i);
    v8i bits = (n + 127) << 23;
    v8 pow2;
    std::memcpy(&pow2, &bits, sizeof pow2);
    v8 out = y * pow2;
    return x < lo ? (v8){} : out;
}

inline v8 vmax(v8 a, v8 b) { return a > b ? a : b; }
inline float hmax(v8 v) {
    float m = v[0];
    for (int i = 1; i < 8; ++i) m = std::fmax(m, v[i]);
    return m;
}

// One corrupted side: anchors A, batch negatives from src S (chunks of k), uniform negatives U
// (groups of nu rows, group g shared by rows [g * gs, (g + 1) * gs)), and with C the query
// entity: row r of C is one more negative of anchor r only, masked where same[r] is nonzero.
// Accumulates gradients into gA, gS, gU, gC and gpos; returns the summed weighted loss, counts
// violators.
struct Direction {
    const float* A;
    const float* S;
    const float* U;
    float* gA;
    float* gS;
    float* gU;
    const float* C = nullptr;  // (B, dp) or null: no query-entity column
    float* gC = nullptr;
    const float* same = nullptr;  // (B,) 1 where the query entity is the true answer
};

// A block's score tile is (rows, W): columns [0, kp) the batch negatives, [kp, kp + up) the
// uniform ones, then with C one 8-wide block whose first column is the query entity's score;
// the padding and masked columns hold MASKED, which every loss maps to a zero gradient. The
// loss pass replaces each score by d loss / d score.
double direction(const Direction& dir, const float* pos, float* gpos, const StepArgs& a,
                 int64_t dp, float* tile, float* st, float* ut, int64_t* violators) {
    const int64_t B = a.batch, D = a.dim;
    const int64_t k = a.num_batch_negs > 0 ? (a.num_batch_negs < B ? a.num_batch_negs : B) : 0;
    const int64_t kp = pad8(k), nu = a.num_uniform, up = pad8(nu), gs = a.uniform_group;
    const bool self_col = dir.C != nullptr;
    const int64_t sc = kp + up;  // the query entity's column
    const int64_t W = sc + (self_col ? 8 : 0);
    const int kind = static_cast<int>(a.loss_kind);
    const float margin = static_cast<float>(a.margin);
    const float num_negs = static_cast<float>(k + nu + (self_col ? 1 : 0));
    const float scale = static_cast<float>(a.rel_weight);
    double loss = 0.0;
    int64_t viol = 0;
    int64_t cur_chunk = -1, cur_group = -1;
    for (int64_t r0 = 0; r0 < B;) {
        const int64_t chunk = k > 0 ? r0 / k : 0, group = r0 / gs;
        int64_t r1 = (group + 1) * gs;
        if (k > 0 && (chunk + 1) * k < r1) r1 = (chunk + 1) * k;
        if (r1 > B) r1 = B;
        const int64_t rows = r1 - r0, c0 = chunk * k;
        const int64_t kreal = k > 0 ? ((B - c0) < k ? (B - c0) : k) : 0;
        const float* Ug = dir.U + group * nu * dp;
        if (k > 0 && chunk != cur_chunk) {
            transpose(dir.S + c0 * dp, kreal, dp, st, kp);
            cur_chunk = chunk;
        }
        if (group != cur_group) {
            transpose(Ug, nu, dp, ut, up);
            cur_group = group;
        }
        const float* Ab = dir.A + r0 * dp;
        if (k > 0) gemm(rows, kp, D, Ab, dp, 1, st, kp, tile, W, false);
        gemm(rows, up, D, Ab, dp, 1, ut, up, tile + kp, W, false);
        for (int64_t i = 0; i < rows; ++i) {
            const int64_t r = r0 + i;
            float* x = tile + i * W;
            for (int64_t j = kreal; j < kp; ++j) x[j] = MASKED;
            if (k > 0) x[r - c0] = MASKED;
            for (int64_t j = kp + nu; j < W; ++j) x[j] = MASKED;
            if (self_col && dir.same[r] == 0.f)  // else MASKED: the query entity is the answer
                x[sc] = dot(Ab + i * dp, dir.C + r * dp, dp);
            const float x0 = pos[r];
            const v8 vx0 = splat(x0);
            v8i vcount = {};
            for (int64_t j = 0; j < W; j += 8) vcount -= (v8i)(load8(x + j) > vx0);
            for (int l = 0; l < 8; ++l) viol += vcount[l];
            float row_loss, g0;
            if (kind == 0) {  // softmax
                v8 vm = vx0;
                for (int64_t j = 0; j < W; j += 8) vm = vmax(vm, load8(x + j));
                const float m = hmax(vm);
                const v8 vmm = splat(m);
                const float e0 = std::exp(x0 - m);
                v8 vs = {};
                for (int64_t j = 0; j < W; j += 8) {
                    v8 e = exp8(load8(x + j) - vmm);
                    store8(x + j, e);
                    vs += e;
                }
                const float sum = e0 + hsum(vs);
                const float inv = 1.f / sum;
                const float p0 = e0 * inv;
                row_loss = -std::log(std::fmax(p0, 1e-38f));
                g0 = p0 - 1.f;
                const float w = a.weight != nullptr ? a.weight[r] : 1.f;
                const v8 vg = splat(inv * w * scale);
                for (int64_t j = 0; j < W; j += 8) store8(x + j, load8(x + j) * vg);
            } else if (kind == 1) {  // ranking
                const v8 thr = splat(x0 - margin), one = splat(1.f);
                v8 vl = {}, vc = {};
                const float w = a.weight != nullptr ? a.weight[r] : 1.f;
                const v8 vg = splat(w * scale);
                for (int64_t j = 0; j < W; j += 8) {
                    const v8 d = load8(x + j) - thr;
                    const v8 on = d > (v8){} ? one : (v8){};
                    vl += d * on;
                    vc += on;
                    store8(x + j, on * vg);
                }
                row_loss = hsum(vl);
                g0 = -hsum(vc);
            } else {  // logistic
                float l = 0.f;
                const float w = a.weight != nullptr ? a.weight[r] : 1.f;
                const float gw = w * scale;
                for (int64_t j = 0; j < W; ++j) {
                    const bool real =
                        j < kreal || (j >= kp && j < kp + nu) || (self_col && j == sc);
                    if (real) l += softplus(x[j]);
                    x[j] = real ? sigmoid(x[j]) / num_negs * gw : 0.f;
                }
                row_loss = softplus(-x0) + l / num_negs;
                g0 = sigmoid(x0) - 1.f;
            }
            const float w = a.weight != nullptr ? a.weight[r] : 1.f;
            loss += static_cast<double>(row_loss * w);
            gpos[r] += g0 * w * scale;
            if (self_col) {  // x[sc]: d loss / d (A_r . C_r), zero when masked
                axpy(x[sc], dir.C + r * dp, dir.gA + r * dp, dp);
                axpy(x[sc], Ab + i * dp, dir.gC + r * dp, dp);
            }
        }
        float* gAb = dir.gA + r0 * dp;
        if (k > 0) {
            gemm(rows, dp, kreal, tile, W, 1, dir.S + c0 * dp, dp, gAb, dp, true);
            gemm(kreal, dp, rows, tile, 1, W, Ab, dp, dir.gS + c0 * dp, dp, true);
        }
        gemm(rows, dp, nu, tile + kp, W, 1, Ug, dp, gAb, dp, true);
        gemm(nu, dp, rows, tile + kp, 1, W, Ab, dp, dir.gU + group * nu * dp, dp, true);
        r0 = r1;
    }
    *violators = viol;
    return loss;
}

struct Update {
    const int64_t* idx;
    const float* grad;
    int64_t n;
};

// PBG's row Adagrad over the rows of `updates` (duplicates summed first, in order).
void row_adagrad(float* table, float* state, int64_t rows, int64_t dim, int64_t dp,
                 const Update* updates, int count, float lr) {
    Scratch& s = scratch;
    if (static_cast<int64_t>(s.slot_of.size()) < rows) s.slot_of.resize(rows, -1);
    int64_t total = 0;
    for (int u = 0; u < count; ++u) total += updates[u].n;
    if (static_cast<int64_t>(s.row_of.size()) < total) s.row_of.resize(total);
    if (static_cast<int64_t>(s.summed.size()) < total * dp) s.summed.resize(total * dp);
    int64_t slots = 0;
    for (int u = 0; u < count; ++u) {
        const Update& up = updates[u];
        for (int64_t i = 0; i < up.n; ++i) {
            const int64_t row = up.idx[i];
            int32_t slot = s.slot_of[row];
            const float* g = up.grad + i * dp;
            if (slot < 0) {
                slot = static_cast<int32_t>(slots++);
                s.slot_of[row] = slot;
                s.row_of[slot] = row;
                std::memcpy(&s.summed[slot * dp], g, dp * sizeof(float));
            } else {
                float* acc = &s.summed[slot * dp];
                for (int64_t d = 0; d < dp; d += 8) store8(acc + d, load8(acc + d) + load8(g + d));
            }
        }
    }
    for (int64_t slot = 0; slot < slots; ++slot) {
        const int64_t row = s.row_of[slot];
        s.slot_of[row] = -1;
        float* g = &s.summed[slot * dp];
        const float sq = dot(g, g, dp) / static_cast<float>(dim);
        const float local = std::fmax(state[row], 0.f) + sq;
        state[row] += sq;
        const float step = (1.f / (std::sqrt(local) + ADAGRAD_EPS)) * -lr;
        float* out = table + row * dim;
        for (int64_t d = 0; d < dim; ++d) out[d] += g[d] * step;
    }
}

}  // namespace

extern "C" int bigembed_native_step(StepArgs* a) {
    const int64_t B = a->batch, D = a->dim, dp = pad8(D), nu = a->num_uniform;
    const int64_t groups = (B + a->uniform_group - 1) / a->uniform_group;
    const int64_t nuni = groups * nu;
    const int64_t k = a->num_batch_negs > 0 ? (a->num_batch_negs < B ? a->num_batch_negs : B) : 0;
    const bool cos = a->cos != 0;
    const int op = static_cast<int>(a->op_kind);
    // Rows of each block of scratch: spare rows at the end stay zero (the products read whole
    // 8-wide blocks of padded operands).
    const int64_t spare = 16;
    const int64_t side_rows = B + spare, uni_rows = nuni + spare;
    const int64_t tile_rows = (k > 0 && k < a->uniform_group) ? k : a->uniform_group;
    const int64_t trows = tile_rows < B ? tile_rows : B;
    const int64_t kp = pad8(k), up = pad8(nu);
    const bool self_neg = a->self_negative != 0;
    const int64_t sw = self_neg ? 8 : 0;  // the tile's query-entity block
    // raw, prep, grad per side and per uniform set; inv norms; pos; gpos; tiles; transposes;
    // with self_neg the query entities' prep, grad and inv per side and the h == t mask.
    const int64_t need = 2 * 3 * side_rows * dp + 2 * 3 * uni_rows * dp + 2 * side_rows +
                         2 * uni_rows + 2 * B + trows * (kp + up + sw) + dp * (kp + up) +
                         (self_neg ? 4 * side_rows * dp + 3 * side_rows : 0);
    std::vector<float>& buf = scratch.buf;
    if (static_cast<int64_t>(buf.size()) < need) buf.assign(need, 0.f);
    float* p = buf.data();
    auto take = [&p](int64_t n) {
        float* out = p;
        p += n;
        return out;
    };
    Rows L{take(side_rows * dp), nullptr, nullptr, take(side_rows * dp), B};
    Rows R{take(side_rows * dp), nullptr, nullptr, take(side_rows * dp), B};
    Rows UL{take(uni_rows * dp), nullptr, nullptr, take(uni_rows * dp), nuni};
    Rows UR{take(uni_rows * dp), nullptr, nullptr, take(uni_rows * dp), nuni};
    float* prep_l = take(side_rows * dp);
    float* prep_r = take(side_rows * dp);
    float* prep_ul = take(uni_rows * dp);
    float* prep_ur = take(uni_rows * dp);
    L.inv = take(side_rows);
    R.inv = take(side_rows);
    UL.inv = take(uni_rows);
    UR.inv = take(uni_rows);
    float* pos = take(B);
    float* gpos = take(B);
    float* tile = take(trows * (kp + up + sw));
    float* st = take(dp * kp);
    float* ut = take(dp * up);

    gather(a->lhs_emb, a->lhs_idx, B, D, dp, L.raw);
    gather(a->rhs_emb, a->rhs_idx, B, D, dp, R.raw);
    gather(a->lhs_emb, a->lhs_uidx, nuni, D, dp, UL.raw);
    gather(a->rhs_emb, a->rhs_uidx, nuni, D, dp, UR.raw);
    std::vector<float> param(dp, 0.f), op_grad(dp, 0.f);
    std::vector<float> lglob(dp, 0.f), rglob(dp, 0.f), lglob_grad(dp, 0.f), rglob_grad(dp, 0.f);
    if (op != 0) std::memcpy(param.data(), a->op_param, D * sizeof(float));
    const float* lg = nullptr;
    const float* rg = nullptr;
    if (a->lhs_glob != nullptr) lg = static_cast<const float*>(std::memcpy(lglob.data(), a->lhs_glob, D * sizeof(float)));
    if (a->rhs_glob != nullptr) rg = static_cast<const float*>(std::memcpy(rglob.data(), a->rhs_glob, D * sizeof(float)));
    const bool moved_l = cos || lg != nullptr, moved_r = cos || op != 0 || rg != nullptr;
    // without normalisation, operator or global embedding, prepared rows are the raw rows.
    L.prep = moved_l ? prep_l : L.raw;
    UL.prep = moved_l ? prep_ul : UL.raw;
    R.prep = moved_r ? prep_r : R.raw;
    UR.prep = moved_r ? prep_ur : UR.raw;
    prepare(L, dp, cos, 0, nullptr, lg);
    prepare(R, dp, cos, op, param.data(), rg);
    prepare(UL, dp, cos, 0, nullptr, lg);
    prepare(UR, dp, cos, op, param.data(), rg);
    for (Rows* s : {&L, &R, &UL, &UR}) std::memset(s->grad, 0, s->n * dp * sizeof(float));
    // The query entity as a candidate of the other side, from the same raw rows: the head as a
    // tail (HT: the rhs type's global embedding, the operator) and the tail as a head (TH).
    Rows HT{L.raw, L.raw, nullptr, nullptr, B}, TH{R.raw, R.raw, nullptr, nullptr, B};
    float* same = nullptr;
    if (self_neg) {
        for (Rows* s : {&HT, &TH}) {
            s->grad = take(side_rows * dp);
            s->inv = take(side_rows);
            std::memset(s->grad, 0, B * dp * sizeof(float));
        }
        float* prep_ht = take(side_rows * dp);
        float* prep_th = take(side_rows * dp);
        if (moved_r) HT.prep = prep_ht;
        if (moved_l) TH.prep = prep_th;
        prepare(HT, dp, cos, op, param.data(), rg);
        prepare(TH, dp, cos, 0, nullptr, lg);
        // h == t: the same offset and the same row, as the eager path decides it.
        same = take(side_rows);
        for (int64_t i = 0; i < B; ++i) {
            bool eq = a->lhs_idx[i] == a->rhs_idx[i];
            for (int64_t d = 0; eq && d < D; ++d) eq = L.raw[i * dp + d] == R.raw[i * dp + d];
            same[i] = eq ? 1.f : 0.f;
        }
    }
    for (int64_t i = 0; i < B; ++i) {
        pos[i] = dot(L.prep + i * dp, R.prep + i * dp, dp);
        gpos[i] = 0.f;
    }
    double loss = 0.0;
    a->violators_lhs = a->violators_rhs = 0;
    if (a->enable_lhs) {
        Direction d{R.prep, L.prep, UL.prep, R.grad, L.grad, UL.grad};
        if (self_neg) d.C = TH.prep, d.gC = TH.grad, d.same = same;
        loss += direction(d, pos, gpos, *a, dp, tile, st, ut, &a->violators_lhs);
    }
    if (a->enable_rhs) {
        Direction d{L.prep, R.prep, UR.prep, L.grad, R.grad, UR.grad};
        if (self_neg) d.C = HT.prep, d.gC = HT.grad, d.same = same;
        loss += direction(d, pos, gpos, *a, dp, tile, st, ut, &a->violators_rhs);
    }
    a->loss = loss * a->rel_weight;
    for (int64_t i = 0; i < B; ++i) {
        axpy(gpos[i], R.prep + i * dp, L.grad + i * dp, dp);
        axpy(gpos[i], L.prep + i * dp, R.grad + i * dp, dp);
    }
    unprepare(L, dp, cos, 0, nullptr, nullptr, lg, lglob_grad.data());
    unprepare(R, dp, cos, op, param.data(), op_grad.data(), rg, rglob_grad.data());
    if (a->enable_lhs) unprepare(UL, dp, cos, 0, nullptr, nullptr, lg, lglob_grad.data());
    if (a->enable_rhs) unprepare(UR, dp, cos, op, param.data(), op_grad.data(), rg, rglob_grad.data());
    if (self_neg) {  // the query entities' gradients join their rows' own
        if (a->enable_rhs) {
            unprepare(HT, dp, cos, op, param.data(), op_grad.data(), rg, rglob_grad.data());
            for (int64_t i = 0; i < B; ++i) axpy(1.f, HT.grad + i * dp, L.grad + i * dp, dp);
        }
        if (a->enable_lhs) {
            unprepare(TH, dp, cos, 0, nullptr, nullptr, lg, lglob_grad.data());
            for (int64_t i = 0; i < B; ++i) axpy(1.f, TH.grad + i * dp, R.grad + i * dp, dp);
        }
    }
    for (int64_t d = 0; d < D; ++d) {
        if (op != 0 && a->op_grad != nullptr) a->op_grad[d] += op_grad[d];
        if (lg != nullptr && a->lhs_glob_grad != nullptr) a->lhs_glob_grad[d] += lglob_grad[d];
        if (rg != nullptr && a->rhs_glob_grad != nullptr) a->rhs_glob_grad[d] += rglob_grad[d];
    }

    const float lr = static_cast<float>(a->lr);
    Update lhs_up[2] = {{a->lhs_idx, L.grad, B}, {a->lhs_uidx, UL.grad, nuni}};
    Update rhs_up[2] = {{a->rhs_idx, R.grad, B}, {a->rhs_uidx, UR.grad, nuni}};
    const int nl = a->enable_lhs ? 2 : 1, nr = a->enable_rhs ? 2 : 1;
    if (a->shared_table) {
        Update all[4];
        int n = 0;
        for (int u = 0; u < nl; ++u) all[n++] = lhs_up[u];
        for (int u = 0; u < nr; ++u) all[n++] = rhs_up[u];
        row_adagrad(a->lhs_emb, a->lhs_state, a->lhs_rows, D, dp, all, n, lr);
    } else {
        row_adagrad(a->lhs_emb, a->lhs_state, a->lhs_rows, D, dp, lhs_up, nl, lr);
        row_adagrad(a->rhs_emb, a->rhs_state, a->rhs_rows, D, dp, rhs_up, nr, lr);
    }
    return 0;
}

// ------------------------------------------------------------------ withheld-edge eval
// bigembed.ranking.sampled.eval_unit is the reference: the same scores (up to the
// products' float rounding), the masks of bigembed.model.negatives (own positive and a short
// chunk's padding at -1e9), the counts of bigembed.ranking.metrics.ranks_and_auc (a negative
// counts only if its score is above -1e9 / 2; ties count against the positive) and the loss of
// bigembed.model.losses per positive. No backward, no update.

namespace {

const int64_t PANEL = 16;  // columns per packed panel (micro<R, 2>)
const float MASK_THRESHOLD = MASKED / 2;

struct EvalScratch {
    std::vector<float> buf;
};
thread_local EvalScratch eval_scratch;

// Rows [0, n) of `src` (dp-strided) as panels of PANEL columns: panel p holds, for each of the
// K coordinates, the PANEL rows 16p..16p+15 (zero beyond n): the products read it contiguously.
void pack_panels(const float* src, int64_t n, int64_t K, int64_t dp, float* out) {
    const int64_t panels = (n + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; ++p) {
        float* o = out + p * K * PANEL;
        for (int64_t l = 0; l < PANEL; ++l) {
            const int64_t r = p * PANEL + l;
            if (r < n) {
                const float* x = src + r * dp;
                for (int64_t k = 0; k < K; ++k) o[k * PANEL + l] = x[k];
            } else {
                for (int64_t k = 0; k < K; ++k) o[k * PANEL + l] = 0.f;
            }
        }
    }
}

// C[M x 16 * panels] (ldc) = X (M x K, row stride xi) times the packed panels.
void gemm_panels(int64_t M, int64_t panels, int64_t K, const float* X, int64_t xi,
                 const float* packed, float* C, int64_t ldc) {
    for (int64_t p = 0; p < panels; ++p) {
        const float* P = packed + p * K * PANEL;
        float* Cp = C + p * PANEL;
        int64_t i = 0;
        for (; i + 6 <= M; i += 6) micro<6, 2>(K, X + i * xi, xi, 1, P, PANEL, Cp + i * ldc, ldc, false);
        const float* x = X + i * xi;
        float* c = Cp + i * ldc;
        switch (M - i) {
            case 5: micro<5, 2>(K, x, xi, 1, P, PANEL, c, ldc, false); break;
            case 4: micro<4, 2>(K, x, xi, 1, P, PANEL, c, ldc, false); break;
            case 3: micro<3, 2>(K, x, xi, 1, P, PANEL, c, ldc, false); break;
            case 2: micro<2, 2>(K, x, xi, 1, P, PANEL, c, ldc, false); break;
            case 1: micro<1, 2>(K, x, xi, 1, P, PANEL, c, ldc, false); break;
            default: break;
        }
    }
}

inline int64_t hsum_count(v8i v) {
    int64_t s = 0;
    for (int i = 0; i < 8; ++i) s += v[i];
    return s;
}

// Counts and loss of one positive `p` against its scores x[0, W): columns [0, kb) the batch
// negatives, [kb, W) the uniform ones (masked entries already at MASKED). `total`: the
// negatives the logistic loss averages over (the eager blocks' widths, masked ones included).
float score_row(const float* x, int64_t kb, int64_t W, float p, int kind, float margin,
                float total, int64_t* at_least, int64_t* below, int64_t* valid) {
    const v8 vp = splat(p), vthr = splat(MASK_THRESHOLD);
    v8i c_ge = {}, c_lt = {}, c_ok = {}, c_nan = {};
    for (int64_t j = 0; j < W; j += 8) {
        const v8 s = load8(x + j);
        const v8i ok = (v8i)(s > vthr);
        c_ge -= ok & (v8i)(s >= vp);
        c_lt -= ok & (v8i)(s < vp);
        c_ok -= ok;
        c_nan |= (v8i)(s != s);
    }
    *at_least = hsum_count(c_ge);
    *below = hsum_count(c_lt);
    *valid = hsum_count(c_ok);
    bool nan = p != p;
    for (int l = 0; l < 8; ++l) nan = nan || c_nan[l] != 0;
    if (nan) return std::nanf("");  // every loss propagates a NaN score, as torch's do
    const int64_t bounds[3] = {0, kb, W};
    if (kind == 1) {  // ranking: sum of max(0, s - (p - margin)), block by block
        const v8 thr = splat(p - margin), zero = {};
        float per = 0.f;
        for (int blk = 0; blk < 2; ++blk) {
            v8 acc = {};
            for (int64_t j = bounds[blk]; j < bounds[blk + 1]; j += 8) {
                const v8 d = load8(x + j) - thr;
                acc += d > zero ? d : zero;
            }
            per += hsum(acc);
        }
        return per;
    }
    if (kind == 0) {  // softmax: -log(e^p / (e^p + sum e^s)), shifted by the row's max
        v8 vm = vp;
        for (int64_t j = 0; j < W; j += 8) vm = vmax(vm, load8(x + j));
        const float m = hmax(vm);
        const v8 vmm = splat(m);
        const float e0 = std::exp(p - m);
        float denom = e0;
        for (int blk = 0; blk < 2; ++blk) {
            v8 acc = {};
            for (int64_t j = bounds[blk]; j < bounds[blk + 1]; j += 8) acc += exp8(load8(x + j) - vmm);
            denom += hsum(acc);
        }
        return -std::log(std::fmax(e0 / denom, 1e-38f));
    }
    // logistic: softplus(-p) + mean of softplus(s) (a masked score adds exactly 0)
    float sum = 0.f;
    for (int blk = 0; blk < 2; ++blk) {
        float part = 0.f;
        for (int64_t j = bounds[blk]; j < bounds[blk + 1]; ++j)
            if (x[j] > MASK_THRESHOLD) part += softplus(x[j]);
        sum += part;
    }
    return total > 0.f ? softplus(-p) + sum / total : softplus(-p);
}

}  // namespace

extern "C" int bigembed_native_eval(EvalArgs* a) {
    const int64_t B = a->batch, D = a->dim, dp = pad8(D), nu = a->num_uniform;
    const int64_t gs = a->uniform_group;
    const int64_t groups = nu > 0 ? (B + gs - 1) / gs : 0;
    const int64_t nuni = groups * nu;
    const int64_t k = a->num_batch_negs > 0 ? (a->num_batch_negs < B ? a->num_batch_negs : B) : 0;
    const bool cos = a->cos != 0;
    const int op = static_cast<int>(a->op_kind);
    const int kind = static_cast<int>(a->loss_kind);
    const int64_t pb = (k + PANEL - 1) / PANEL, pu = (nu + PANEL - 1) / PANEL;
    const int64_t kb = pb * PANEL, W = kb + pu * PANEL;
    // Rows per score tile: about 128 KiB of scores (stays in L2 for the row pass).
    int64_t T = W > 0 ? (32768 / W) / 6 * 6 : B;
    if (T < 6) T = 6;
    const int64_t need = 2 * B * dp + nuni * dp + (pb + pu) * D * PANEL + T * W + B + 8;
    std::vector<float>& buf = eval_scratch.buf;
    if (static_cast<int64_t>(buf.size()) < need) buf.assign(need, 0.f);
    float* p = buf.data();
    auto take = [&p](int64_t n) {
        float* out = p;
        p += n;
        return out;
    };
    float* lrows = take(B * dp);
    float* rrows = take(B * dp);
    float* urows = take(nuni * dp);
    float* packed_b = take(pb * D * PANEL);
    float* packed_u = take(pu * D * PANEL);
    float* tile = take(T * W);
    float* pos = take(B);

    std::vector<float> param(dp, 0.f), lglob(dp, 0.f), rglob(dp, 0.f), inv(B > nuni ? B : nuni);
    if (op != 0) std::memcpy(param.data(), a->op_param, D * sizeof(float));
    const float* lg = nullptr;
    const float* rg = nullptr;
    if (a->lhs_glob != nullptr) lg = static_cast<const float*>(std::memcpy(lglob.data(), a->lhs_glob, D * sizeof(float)));
    if (a->rhs_glob != nullptr) rg = static_cast<const float*>(std::memcpy(rglob.data(), a->rhs_glob, D * sizeof(float)));
    const bool rhs_side = a->side == 1;
    gather(a->lhs_emb, a->lhs_idx, B, D, dp, lrows);
    gather(a->rhs_emb, a->rhs_idx, B, D, dp, rrows);
    if (nuni > 0) gather(rhs_side ? a->rhs_emb : a->lhs_emb, a->uidx, nuni, D, dp, urows);
    // Prepared in place (no backward here): lhs rows, rhs rows through the operator, and the
    // uniform rows as their side's positives.
    Rows L{lrows, lrows, inv.data(), nullptr, B};
    prepare(L, dp, cos, 0, nullptr, lg);
    Rows R{rrows, rrows, inv.data(), nullptr, B};
    prepare(R, dp, cos, op, param.data(), rg);
    Rows U{urows, urows, inv.data(), nullptr, nuni};
    if (rhs_side)
        prepare(U, dp, cos, op, param.data(), rg);
    else
        prepare(U, dp, cos, 0, nullptr, lg);
    // The corrupted side's rows are the batch negatives; the other side's rows the anchors.
    const float* A = rhs_side ? lrows : rrows;
    const float* S = rhs_side ? rrows : lrows;
    // Each positive's score by the products' own kernel (anchor times a one-column panel):
    // a negative that is the positive's own entity ties with it exactly and counts against
    // it, whatever the rounding (the order of the sum and whether it is fused).
    {
        std::vector<float> col(D * 8, 0.f);
        float out[8];
        for (int64_t i = 0; i < B; ++i) {
            for (int64_t d = 0; d < D; ++d) col[d * 8] = S[i * dp + d];
            micro<1, 1>(D, A + i * dp, dp, 1, col.data(), 8, out, 8, false);
            pos[i] = out[0];
        }
    }
    const float margin = static_cast<float>(a->margin);
    const float total = static_cast<float>(k + nu);
    int64_t cur_chunk = -1, cur_group = -1;
    for (int64_t r0 = 0; r0 < B;) {
        const int64_t chunk = k > 0 ? r0 / k : 0, group = r0 / gs;
        int64_t r1 = r0 + T;
        if (nu > 0 && (group + 1) * gs < r1) r1 = (group + 1) * gs;
        if (k > 0 && (chunk + 1) * k < r1) r1 = (chunk + 1) * k;
        if (r1 > B) r1 = B;
        const int64_t rows = r1 - r0, c0 = chunk * k;
        const int64_t kreal = k > 0 ? ((B - c0) < k ? (B - c0) : k) : 0;
        if (k > 0 && chunk != cur_chunk) {
            pack_panels(S + c0 * dp, kreal, D, dp, packed_b);
            cur_chunk = chunk;
        }
        if (nu > 0 && group != cur_group) {
            pack_panels(urows + group * nu * dp, nu, D, dp, packed_u);
            cur_group = group;
        }
        const float* Ab = A + r0 * dp;
        if (pb > 0) gemm_panels(rows, pb, D, Ab, dp, packed_b, tile, W);
        if (pu > 0) gemm_panels(rows, pu, D, Ab, dp, packed_u, tile + kb, W);
        for (int64_t i = 0; i < rows; ++i) {
            const int64_t r = r0 + i;
            float* x = tile + i * W;
            for (int64_t j = kreal; j < kb; ++j) x[j] = MASKED;
            if (k > 0) x[r - c0] = MASKED;
            for (int64_t j = kb + nu; j < W; ++j) x[j] = MASKED;
            a->row_loss[r] = score_row(x, kb, W, pos[r], kind, margin, total, a->at_least + r,
                                       a->below + r, a->valid + r);
        }
        r0 = r1;
    }
    return 0;
}
