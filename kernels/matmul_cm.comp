#version 450
// matmul_cm: the products of many rows on tensor cores (VK_NV_cooperative_matrix, fp16 x fp16
// + fp32): prefill, classify, training's forward, batch decode:
//   C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n])
// Tiles of BM (m) x BN (n), k in steps of BK = 64: A rounded to f16 (clamped to its range) and
// W dequantized to f16 go through shared memory; each subgroup multiplies a (BM / WARPS_M) x
// (BN / WARPS_N) part as FM x FN fragments of 16 x 16 with f32 accumulators; the next step's
// values are read from memory into registers while the tensor cores work on the current one,
// as they are stored (Q4_0 a whole block a thread, f16 as is), and converted only when they go
// to shared memory: registers hold the raw bytes, not eight floats for every eight weights. On
// the H100 that took the 8B shape's Q4_0 products from 72-75 to 94-100 TFLOP/s and the 1B
// shape's F16 ones from 50-65 to 70-105 (bench/RESULTS.md). Two shared-memory stages of
// BK = 32 (one barrier a step, what fits 48 KB) ran at 82-85: not kept.
//   default: 128 x 128 tiles, 8 subgroups of 64 x 32 (4 x 2 fragments)
//   SKINNY (batch decode's <= 32 rows, f16 weights only): 32 x 64 tiles, 4 subgroups of 32 x 16
//     (2 x 1 fragments), W's fragments loaded straight from memory (f16 needs no conversion, and
//     no shared-memory round trip: 32 x 2048 x 16384 in 0.059 ms against 0.122 ms for the
//     default tiles on the H200, bench/RESULTS.md); needs N % 16 == 0 and K % 8 == 0 (host).
// The epilogue (bias, soft-cap, residual) runs on the f32 results, one fragment at a time
// through a per-subgroup scratch; whole tiles with none of them are stored straight to C.
// Split along k (batch decode's few rows, too few tiles to fill the device), as matmul.comp:
// flags 64, workgroup z takes k in [z k_split, (z + 1) k_split) (k_split a multiple of 64) and
// writes its raw sums to C = partials [z, M, N]; matmul.comp's flags 128 adds them up.
// Needs subgroups of 32 (checked by the host).
// Bindings: 0 A [*, K] f32 | 1 W chunk [N, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases, unused by other formats
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#ifdef SKINNY
#define BM 32
#define BN 64
#define WARPS_M 1
#define W_DIRECT 1
#else
#define BM 128
#define BN 128
#define WARPS_M 2
#endif
#define WARPS_N 4
#define BK 64
#define FM (BM / WARPS_M / 16)   /* fragments per subgroup along m */
#define FN (BN / WARPS_N / 16)   /* and along n */
#define THREADS (WARPS_M * WARPS_N * 32)
layout(local_size_x = THREADS) in;

layout(push_constant) uniform PC {
    uint M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;
    uint qbits, qgroup, qflags;   // MLX affine: bits, group size, 1 = bf16 scales
    float eps;                    // (matvec_sg only)
    uint rows_per_wg;             // (matvec_sg only)
    uint k_split;                 // flags 64: k per split
} pc;

#include "common.glsl"
#define W_BINDING 1
#define AUX0_BINDING 4
#define AUX1_BINDING 5
#define QBITS pc.qbits
#define QGROUP pc.qgroup
#define QFLAGS pc.qflags
#include "weights.glsl"

layout(binding = 0) readonly buffer A_ { float a[]; };
layout(binding = 0) readonly buffer A4_ { vec4 a4[]; };
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer Bias_ { float bias[]; };

const uint LDS = BK + 8;             // padded row stride (halves): 144 bytes
const uint LDS4 = LDS / 4u;          // the same in units of 4 halves
// One shared array, 4 halves an element: the A tile, row-major [m][k], at AS; the W tile,
// row-major [n][k] = B column-major, at WS; after the k loop the epilogue's scratch (each
// subgroup's 16 x 16 f32 fragment, two floats an element) over the A tile at CS.
const uint AS = 0u, CS = 0u;
#ifdef W_DIRECT
const uint WS = 0u, SMEM = max(BM * LDS4, WARPS_M * WARPS_N * 128u);
#else
const uint WS = BM * LDS4, SMEM = max(BM * LDS4 + BN * LDS4, WARPS_M * WARPS_N * 128u);
#endif
shared uvec2 smem[SMEM];

// four values rounded to f16 (clamped to its range), packed in two words
uvec2 to_f16(vec4 x) {
    f16vec4 h = f16vec4(clamp(x, vec4(-65504.0), vec4(65504.0)));
    return uvec2(packFloat2x16(h.xy), packFloat2x16(h.zw));
}

uint tid_() { return gl_LocalInvocationID.x; }

// this thread's share of the next k step, brought to registers while the tensor cores work
// on the current one, as loaded (the conversions to f16 wait for stash, so that the loads of
// the next step are in flight during the products and hold as few registers as they can):
// A_PER x 4 values of A (rows idx / 16, columns 4 (idx % 16), idx = tid + r THREADS), and of W
//   Q4_0: one whole block a thread (row tid / 2, block tid % 2 of the step): its 18 bytes
//         in the 5 aligned words that hold them
//   F16:  W_PER x 8 halves (rows idx / 8, columns 8 (idx % 8)), copied as they are
//   else: W_PER x 8 values dequantized to f32 (weights.glsl)
const uint A_PER = BM * BK / 4u / THREADS, W_PER = BN * BK / 8u / THREADS;
vec4 ra[A_PER];
#if defined(W_DIRECT)
#elif defined(W_Q4_0)
#define W_RAW_Q4_0 1
#if BN * BK / 32 != THREADS
#error "Q4_0 fetch: one block a thread"
#endif
uint rq[5];           // the block's words
bool rq_odd, rq_in;   // its f16 scale in the high half of rq[0]; the block lies in the matrix
#elif defined(W_F16)
#define W_RAW_F16 1
uvec4 rh[W_PER];
#else
vec4 rw[2u * W_PER];
#endif

void fetch(uint m0, uint n0, uint k0, uint ke, bool vec_a) { // k < ke
    [[unroll]] for (uint r = 0; r < A_PER; r++) {
        uint idx = tid_() + r * THREADS, m = m0 + idx / (BK / 4u), k = k0 + (idx % (BK / 4u)) * 4u;
        vec4 v = vec4(0.0);
        if (m < pc.M && k < ke) {
            uint ab = (pc.a_row0 + m) * pc.K + k;
            if (vec_a && k + 4u <= ke) v = a4[ab >> 2];
            else for (uint i = 0; i < 4u; i++) v[i] = k + i < ke ? a[ab + i] : 0.0;
        }
        ra[r] = v;
    }
#if defined(W_RAW_Q4_0)
    {
        uint n = n0 + tid_() / (BK / 32u), kb = (k0 >> 5) + tid_() % (BK / 32u);
        rq_in = n < pc.N && (kb << 5) < ke;   // ke: K or a multiple of 64, K a multiple of 32
        uint bo = rq_in ? (n * (pc.K >> 5) + kb) * 18u : 0u, w = bo >> 2;
        rq_odd = (bo & 2u) != 0u;
        // the 5 words from w hold bytes bo .. bo + 17 (the binding's size is a multiple of 4)
        [[unroll]] for (uint i = 0; i < 5u; i++) rq[i] = rq_in ? w_u32[w + i] : 0u;
    }
#elif defined(W_RAW_F16)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, n = n0 + idx / (BK / 8u), k = k0 + (idx % (BK / 8u)) * 8u;
        uvec4 h = uvec4(0u);
        if (n < pc.N && k < ke) {
            if ((pc.K & 7u) == 0u) h = w_u4[(n * pc.K + k) >> 3];
            else { // rows that are not 16-byte aligned (rare): a value at a time
                vec4 lo, hi;
                w_get8_any(n, k, pc.K, lo, hi);
                h = uvec4(to_f16(lo), to_f16(hi));
            }
        }
        rh[r] = h;
    }
#elif !defined(W_DIRECT)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, n = n0 + idx / (BK / 8u), k = k0 + (idx % (BK / 8u)) * 8u;
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n < pc.N && k < ke) w_get8_any(n, k, pc.K, lo, hi); // ke: K or a multiple of 64
        rw[2u * r] = lo;
        rw[2u * r + 1u] = hi;
    }
#endif
}

void stash() {
    [[unroll]] for (uint r = 0; r < A_PER; r++) {
        uint idx = tid_() + r * THREADS;
        smem[AS + (idx / (BK / 4u)) * LDS4 + idx % (BK / 4u)] = to_f16(ra[r]);
    }
#if defined(W_RAW_Q4_0)
    {
        // d, then the 16 bytes of nibbles as 4 words: element j < 16 is the low nibble of byte
        // j, 16 + j its high nibble
        float d = unpackHalf2x16(rq_odd ? rq[0] >> 16 : rq[0] & 0xffffu).x;
        uint q[4];
        [[unroll]] for (uint i = 0; i < 4u; i++) q[i] = rq_odd ? rq[i + 1u] : (rq[i] >> 16) | (rq[i + 1u] << 16);
        uint row = WS + (tid_() / (BK / 32u)) * LDS4 + (tid_() % (BK / 32u)) * 8u;
        [[unroll]] for (uint i = 0; i < 4u; i++) {
            smem[row + i] = to_f16(d * bytes_f(q[i] & 0x0F0F0F0Fu, 8.0));
            smem[row + 4u + i] = to_f16(d * bytes_f((q[i] >> 4) & 0x0F0F0F0Fu, 8.0));
        }
    }
#elif defined(W_RAW_F16)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, row = WS + (idx / (BK / 8u)) * LDS4 + (idx % (BK / 8u)) * 2u;
        smem[row] = rh[r].xy;
        smem[row + 1u] = rh[r].zw;
    }
#elif !defined(W_DIRECT)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, row = WS + (idx / (BK / 8u)) * LDS4 + (idx % (BK / 8u)) * 2u;
        smem[row] = to_f16(rw[2u * r]);
        smem[row + 1u] = to_f16(rw[2u * r + 1u]);
    }
#endif
}

void main() {
    uint warp = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint wm = (warp / WARPS_N) * (BM / WARPS_M), wn = (warp % WARPS_N) * (BN / WARPS_N); // this subgroup's part
    bool vec_a = (pc.K & 3u) == 0u;
    bool part = (pc.flags & 64u) != 0u;
    uint kb = part ? gl_WorkGroupID.z * pc.k_split : 0u, ke = part ? min(pc.K, kb + pc.k_split) : pc.K;
    // where the results go: C, or split z's partial sums [M, N]
    uint ldc = part ? pc.N : pc.ldc, col0 = part ? 0u : pc.c_col0, row0 = part ? gl_WorkGroupID.z * pc.M : 0u;
    uint flags = part ? 0u : pc.flags;
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
    [[unroll]] for (uint i = 0; i < FM; i++)
        [[unroll]] for (uint j = 0; j < FN; j++) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
#ifdef W_DIRECT
    bool w_in = n0 + wn < pc.N;   // this subgroup's FN = 1 fragment holds rows of W (N % 16 == 0)
#endif
    fetch(m0, n0, kb, ke, vec_a);
    stash();
    barrier();
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        bool more = k0 + BK < ke;
        if (more) fetch(m0, n0, k0 + BK, ke, vec_a); /* in flight during the products below */
        [[unroll]] for (uint ks = 0; ks < BK; ks += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN];
            [[unroll]] for (uint i = 0; i < FM; i++) coopMatLoadNV(fa[i], smem, AS + (wm + 16u * i) * LDS4 + ks / 4u, LDS4, false);
#ifdef W_DIRECT
            if (w_in && k0 + ks < ke) { // (ke is K or a multiple of 64: whole 16-steps)
                coopMatLoadNV(fb[0], w_u4, (n0 + wn) * (pc.K / 8u) + (k0 + ks) / 8u, pc.K / 8u, true);
                [[unroll]] for (uint i = 0; i < FM; i++) acc[i][0] = coopMatMulAddNV(fa[i], fb[0], acc[i][0]);
            }
#else
            [[unroll]] for (uint j = 0; j < FN; j++) coopMatLoadNV(fb[j], smem, WS + (wn + 16u * j) * LDS4 + ks / 4u, LDS4, true);
            [[unroll]] for (uint i = 0; i < FM; i++)
                [[unroll]] for (uint j = 0; j < FN; j++) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
#endif
        }
        barrier();
        if (more) {
            stash();
            barrier();
        }
    }
    // The epilogue names every fragment with constant indices: written as a loop over i and j
    // (which the driver did not unroll, its body holding a loop and barriers) it indexed acc
    // dynamically, which put all the accumulators in local memory for the whole k loop: the
    // kernel ran at 30 TFLOP/s instead of 70-100 (bench/RESULTS.md).
    // Whole tiles without bias, cap or residual go straight to C (ldc and c_col0 multiples of 4:
    // 16-byte aligned rows); the rest through a per-subgroup scratch, one fragment at a time.
    bool direct = flags == 0u && m0 + BM <= pc.M && n0 + BN <= pc.N && (ldc & 3u) == 0u && (col0 & 3u) == 0u;
#define STORE_DIRECT(i, j) coopMatStoreNV(acc[i][j], c, (row0 + m0 + wm + 16u * i) * ldc + col0 + n0 + wn + 16u * j, ldc, false);
#define STORE_EPILOGUE(i, j) {                                                                  \
        coopMatStoreNV(acc[i][j], smem, CS + warp * 128u, 8u, false);                           \
        subgroupMemoryBarrierShared();                                                          \
        subgroupBarrier();                                                                      \
        for (uint e = lane; e < 256u; e += 32u) {                                               \
            uint m = m0 + wm + 16u * i + e / 16u, n = n0 + wn + 16u * j + e % 16u;             \
            if (m >= pc.M || n >= pc.N) continue;                                               \
            uvec2 pair = smem[CS + warp * 128u + e / 2u];                                       \
            float v = uintBitsToFloat((e & 1u) != 0u ? pair.y : pair.x);                        \
            if ((flags & 1u) != 0u) v += bias[pc.bias_off + n];                                 \
            if ((flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;                 \
            uint ci = (row0 + m) * ldc + col0 + n;                                              \
            if ((flags & 2u) != 0u) v += c[ci];                                                 \
            c[ci] = v;                                                                          \
        }                                                                                       \
        subgroupBarrier();                                                                      \
    }
    // every fragment this subgroup holds (FM x FN, at most 4 x 2), by name
    if (direct) {
        STORE_DIRECT(0u, 0u)
#if FN > 1
        STORE_DIRECT(0u, 1u)
#endif
#if FM > 1
        STORE_DIRECT(1u, 0u)
#endif
#if FM > 1 && FN > 1
        STORE_DIRECT(1u, 1u)
#endif
#if FM > 2
        STORE_DIRECT(2u, 0u)
#endif
#if FM > 2 && FN > 1
        STORE_DIRECT(2u, 1u)
#endif
#if FM > 3
        STORE_DIRECT(3u, 0u)
#endif
#if FM > 3 && FN > 1
        STORE_DIRECT(3u, 1u)
#endif
        return;
    }
    STORE_EPILOGUE(0u, 0u)
#if FN > 1
    STORE_EPILOGUE(0u, 1u)
#endif
#if FM > 1
    STORE_EPILOGUE(1u, 0u)
#endif
#if FM > 1 && FN > 1
    STORE_EPILOGUE(1u, 1u)
#endif
#if FM > 2
    STORE_EPILOGUE(2u, 0u)
#endif
#if FM > 2 && FN > 1
    STORE_EPILOGUE(2u, 1u)
#endif
#if FM > 3
    STORE_EPILOGUE(3u, 0u)
#endif
#if FM > 3 && FN > 1
    STORE_EPILOGUE(3u, 1u)
#endif
}
