#version 450
// matmul_cm: the products of many rows on tensor cores (VK_NV_cooperative_matrix, fp16 x fp16
// + fp32): prefill, classify, training's forward, batch decode:
//   C[m, c_col0 + n] (+)= sum_k A[a_row0 + m, k] * W[n, k] (+ bias[bias_off + n])
// A comes as f16 (act_f16.comp rounds the f32 activations first, K % 8 == 0): read as f32
// and converted here, A's loads were twice as long and bounded the kernel (the 8B shape's
// 512 x 4096 -> 28672 Q4_0 product 1.19 -> 0.87 ms, F16 1.07 -> 0.70, bench/RESULTS.md).
// Tiles of BM (m) x BN (n), k in steps of BK = 64: A and W dequantized to f16 go through shared
// memory; each subgroup multiplies a (BM / WARPS_M) x (BN / WARPS_N) part as FM x FN fragments
// of 16 x 16 with f32 accumulators; the next step's values are read from memory into registers
// while the tensor cores work on the current one, as they are stored (Q4_0 a whole block a
// thread, f16 as is), and converted only when they go to shared memory: registers hold the raw
// bytes, not eight floats for every eight weights. On the H100 that took the 8B shape's Q4_0
// products from 72-75 to 94-100 TFLOP/s and the 1B shape's F16 ones from 50-65 to 70-105
// (bench/RESULTS.md). The shape macros (BM, BN, WARPS_M, WARPS_N, BK, STAGES: 2 for two
// shared-memory stages and one barrier a step) can be set when compiling a variant for
// tests/test_kernel_bench.cpp; on the H100 none beat the default (bench/RESULTS.md: 4
// subgroups of 64 x 64, BK = 32 in one or two stages, 128 x 256 and 256 x 128 tiles).
//   default: 128 x 128 tiles, 8 subgroups of 64 x 32 (4 x 2 fragments)
//   SKINNY (batch decode's <= 32 rows, f16 weights only): 32 x 64 tiles, 4 subgroups of 32 x 16
//     (2 x 1 fragments), W's fragments loaded straight from memory (f16 needs no conversion, and
//     no shared-memory round trip: 32 x 2048 x 16384 in 0.059 ms against 0.122 ms for the
//     default tiles on the H200, bench/RESULTS.md); needs N % 16 == 0 and K % 8 == 0 (host).
// The epilogue (bias, soft-cap, residual) runs on the f32 results, one fragment at a time
// through a per-subgroup scratch; whole tiles with none of them are stored straight to C.
// Split along k (batch decode's few rows, too few tiles to fill the device), as matmul.comp:
// flags 64, workgroup z takes k in [z k_split, (z + 1) k_split) (k_split a multiple of 64) and
// writes its raw sums to C = partials [z, M, N]; linear_reduce.comp adds them up.
// MOE (matmul_cm_moe): a mixture of experts' product grouped by expert (the prefill), as
// matmul.comp's MOE build: W is a chunk of an expert weight (experts e0 .. e0 + n_exp - 1 of N
// rows each), workgroup y a tile of moe_group.comp's table (binding 6: the tile count, then
// (expert, first, rows) per tile, rows <= 32, and from word order_off the (token, choice) pairs
// sorted by expert); tile row m is pair p = order[first + m], whose A row is p / a_div (a_div =
// top_k: the token's f16 activations; 1: the pair's own row) and whose C row is p. 32 x 128
// tiles, 4 subgroups of 32 x 32; every store goes through the epilogue (the rows scatter).
// Where the experts' products ran on matmul_moe_s (SIMT, 32 x 128 tiles) the Qwen3.5-35B-A3B
// shape's 512-token prefill spent 5.4 + 2.5 s of a profiled run in them at 0.8-1.3 TFLOP/s.
// BACK (matmul_cm_back): training's input gradient through a frozen weight (matmul_back.comp's
// product on the tensor cores), the reduction along W's rows instead of its columns:
//   C[m, c_col0 + k] (+)= rs[m] * sum_n A[m, n] * W[n, k]     (n < N: the chunk's rows)
// A = dY [M, N] f16 (rows padded to a multiple of 8 with zeros), each row scaled by a power of two first (act_f16.comp's ROW_SCALE build:
// a gradient's values lie far below f16's normal range, 6e-5: the head's are ~1e-4 / tokens),
// rs[m] the inverse of that power (binding 3). The W tile is a BK-row step of the reduction by
// the BN output columns, read as forward reads its tiles (the same rows of W in memory, the
// same dequantization) and loaded as B row-major. Every store goes through the epilogue (the
// row scale; flags 2: accumulate into C). Split along n (flags 64, the head's few rows and
// 128k-long reduction): workgroup z takes n in [z k_split, (z + 1) k_split) and writes its
// row-scaled sums to C = partials [z, M, K] for linear_reduce.comp.
// Needs subgroups of 32 (checked by the host).
// Bindings: 0 A [*, K] f16 (packed; BACK: [M, N]) | 1 W chunk [N, K] (format per build)
//           2 C [*, ldc] f32 | 3 bias f32 (BACK: rs [M]) | 4, 5 MLX scales and biases, unused
//           by other formats | 6 MOE: the tiles
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#ifdef MOE
#define BM 32
#define BN 128
#define WARPS_M 1
#define WARPS_N 4
#endif
#ifdef SKINNY
#define BM 32
#define BN 64
#define WARPS_M 1
#define WARPS_N 4
#define W_DIRECT 1
#endif
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#ifndef BK
#define BK 64
#endif
#ifndef STAGES
#define STAGES 1
#endif
#ifdef BACK
#define BACK_ROWS true
#else
#define BACK_ROWS false
#endif
#define FM (BM / WARPS_M / 16)   /* fragments per subgroup along m */
#define FN (BN / WARPS_N / 16)   /* and along n */
#define THREADS (WARPS_M * WARPS_N * 32)
layout(local_size_x = THREADS) in;

#include "pc_linear.glsl"

#define FORGE_F16_TYPES 1
#include "common.glsl"
#define W_BINDING 1
#define AUX0_BINDING 4
#define AUX1_BINDING 5
#define QBITS pc.qbits
#define QGROUP pc.qgroup
#define QFLAGS pc.qflags
#include "weights.glsl"

layout(binding = 0) readonly buffer A8_ { uvec4 a8[]; };
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer Bias_ { float bias[]; };
#ifdef MOE
layout(binding = 6) readonly buffer Moe_ { uint moe[]; };
#endif

// The tile's rows of A and C, and W's first row: a plain product's m0 + m (m < M); a MOE
// tile's pair order[first + m] (m < tile_rows) and its expert's rows.
uint tile_rows = 0u, tile_first = 0u, w_base = 0u;
bool c_row_of(uint m, out uint row) {
#ifdef MOE
    row = m < tile_rows ? moe[pc.order_off + tile_first + m] : 0u;
    return m < tile_rows;
#else
    row = m;
    return m < pc.M;
#endif
}
bool a_row_of(uint m, out uint row) {
#ifdef MOE
    row = m < tile_rows ? moe[pc.order_off + tile_first + m] / pc.a_div : 0u;
    return m < tile_rows;
#else
    row = m;
    return m < pc.M;
#endif
}

const uint LDS = BK + 8;             // padded row stride of the A tile (halves): 144 bytes
const uint LDS4 = LDS / 4u;          // the same in units of 4 halves
// The W tile: WR rows of W by WC columns, row-major in shared memory with stride LDW. Forward:
// BN rows (the outputs) by a BK step of the reduction, B column-major; BACK: a BK step of the
// reduction (W's rows) by BN output columns, B row-major.
#ifdef BACK
const uint WR = BK, WC = BN;
#else
const uint WR = BN, WC = BK;
#endif
const uint LDW = WC + 8u, LDW4 = LDW / 4u;
// A's row length: the reduction (BACK: the chunk's rows of W, N, rounded up to 8; else K)
#ifdef BACK
#define A_LD ((pc.N + 7u) & ~7u)
#else
#define A_LD pc.K
#endif
// One shared array, 4 halves an element: the A tile, row-major [m][k], at AS; the W tile,
// row-major [n][k] = B column-major, at WS; after the k loop the epilogue's scratch (each
// subgroup's 16 x 16 f32 fragment, two floats an element) over the A tile at CS.
const uint AS = 0u, CS = 0u;
#ifdef W_DIRECT
const uint WS = 0u, STAGE = BM * LDS4;
#else
const uint WS = BM * LDS4, STAGE = BM * LDS4 + WR * LDW4;
#endif
const uint SMEM = max(STAGES * STAGE, WARPS_M * WARPS_N * 128u);
shared uvec2 smem[SMEM];

uint tid_() { return gl_LocalInvocationID.x; }

// this thread's share of the next k step, brought to registers while the tensor cores work
// on the current one, as loaded (the conversions to f16 wait for convert, so that the loads
// of the next step are in flight during the products and hold as few registers as they can):
// A_PER x 8 halves of A (rows idx / (BK / 8), columns 8 (idx % (BK / 8)), idx = tid + r THREADS),
// copied as they are, and of W
//   Q4_0, Q8_0: QB_PER whole blocks a thread (block idx = tid + r THREADS: tile row
//         idx / (WC / 32), block idx % (WC / 32) of the tile's columns): its 18 / 34 bytes in
//         the 5 / 9 aligned words that hold them
//   F16, BF16: W_PER x 8 halves (tile rows idx / (WC / 8), columns 8 (idx % (WC / 8))), as
//         they are (bf16 converted by convert, in place)
//   else: W_PER x 8 values dequantized to f32 (weights.glsl)
const uint A_PER = BM * BK / 8u / THREADS;
uvec4 ra[A_PER];
const uint W_PER = WR * WC / 8u / THREADS;
#if defined(W_DIRECT)
#elif defined(W_Q4_0) || defined(W_Q8_0)
#define W_RAW_BLOCKS 1
#ifdef W_Q4_0
const uint QB_BYTES = 18u, QB_WORDS = 5u;   // f16 d, 16 bytes of nibbles
#else
const uint QB_BYTES = 34u, QB_WORDS = 9u;   // f16 d, 32 int8 codes
#endif
const uint QB_PER = WR * WC / 32u / THREADS;
#if (BN * BK / 32) % THREADS != 0
#error "Q4_0 / Q8_0 fetch: whole blocks a thread"
#endif
uint rq[QB_PER][QB_WORDS];    // each block's words
bool rq_odd[QB_PER];          // its f16 scale in the high half of rq[r][0]
uvec2 wq[QB_PER][8];          // ... converted: its 32 weights in f16
#elif defined(W_F16) || defined(W_BF16)
#define W_RAW_16 1
uvec4 rh[W_PER];
#else
vec4 rw[2u * W_PER];
uvec2 rwq[2u * W_PER];        // ... converted to f16
#endif

void fetch(uint m0, uint n0, uint k0, uint ke) { // the reduction's k0 .. min(k0 + BK, ke); n0: the output tile's
    [[unroll]] for (uint r = 0; r < A_PER; r++) {
        uint idx = tid_() + r * THREADS, m = m0 + idx / (BK / 8u), k = k0 + (idx % (BK / 8u)) * 8u;
        uint row;
        bool in_ = a_row_of(m, row);
        ra[r] = in_ && k < ke ? a8[((pc.a_row0 + row) * A_LD + k) >> 3] : uvec4(0u); // (A_LD % 8 == 0)
    }
    // the W tile: rows wr0 .. < wr_end of W, columns wc0 .. < wc_end (of K, W's row length)
#ifdef BACK
    uint wr0 = k0, wr_end = ke, wc0 = n0, wc_end = pc.K;
#else
    uint wr0 = n0, wr_end = pc.N, wc0 = k0, wc_end = ke;
#endif
#if defined(W_RAW_BLOCKS)
    [[unroll]] for (uint r = 0; r < QB_PER; r++) {
        uint idx = tid_() + r * THREADS;
        uint n = wr0 + idx / (WC / 32u), kb = (wc0 >> 5) + idx % (WC / 32u);
        bool in_ = n < wr_end && (kb << 5) < wc_end;   // wc_end: K or a multiple of BK, K a multiple of 32
        uint bo = in_ ? ((w_base + n) * (pc.K >> 5) + kb) * QB_BYTES : 0u, w = bo >> 2;
        rq_odd[r] = (bo & 2u) != 0u;
        // the QB_WORDS words from w hold bytes bo .. bo + QB_BYTES - 1 (blocks start 2-byte
        // aligned; the binding's size is a multiple of 4)
        [[unroll]] for (uint i = 0; i < QB_WORDS; i++) rq[r][i] = in_ ? w_u32[w + i] : 0u;
    }
#elif defined(W_RAW_16)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, n = wr0 + idx / (WC / 8u), k = wc0 + (idx % (WC / 8u)) * 8u;
        rh[r] = n < wr_end && k < wc_end ? w_u4[((w_base + n) * pc.K + k) >> 3] : uvec4(0u); // (K % 8 == 0)
    }
#elif !defined(W_DIRECT)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, n = wr0 + idx / (WC / 8u), k = wc0 + (idx % (WC / 8u)) * 8u;
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n < wr_end && k < wc_end) w_get8_any(w_base + n, k, pc.K, lo, hi); // wc_end: K or a multiple of BK
        rw[2u * r] = lo;
        rw[2u * r + 1u] = hi;
    }
#endif
}

// The weights of the next step to f16, in registers, just before stash stores them. BF16
// weights are converted earlier (CONVERT_EARLY), by each subgroup as soon as its products of
// the current step are issued, before the barrier, so that one subgroup's conversion overlaps
// the products of those still multiplying: on the H100 that took Gemma3-1B's prefill from
// 21.0 k to 21.7 k tok/s, while Q4_0 blocks converted early (or halfway through the products)
// ran 6-8% slower than converted after the barrier (bench/RESULTS.md).
#ifdef W_BF16
#define CONVERT_EARLY 1
#endif
void convert() {
#if defined(W_RAW_BLOCKS)
    [[unroll]] for (uint r = 0; r < QB_PER; r++) {
        // d, then the codes as words (rq_odd: from word 1; else across the word boundaries).
        // In packed f16, two weights an instruction: the bits 0x6400 | u are 1024 + u (u a
        // byte), minus 1024 + the code's offset is the code (exact), times d is rounded once,
        // as the f32 product (exact: 11 x 8 bits at most) rounded to f16 was; only a block
        // whose d times a code overflows f16 (garbage) differs: infinity where f32 then a
        // clamp gave 65504.
        //   Q4_0: word i holds bytes 4i .. 4i + 3 of the 16: element j < 16 is the low nibble
        //         of byte j, 16 + j its high nibble (u = nibble, offset 8)
        //   Q8_0: word i holds codes 4i .. 4i + 3, int8 (u = code ^ 0x80, offset 128)
        f16vec2 d = unpackFloat2x16(rq_odd[r] ? rq[r][0] >> 16 : rq[r][0] & 0xffffu).xx;
#ifdef W_Q4_0
        const uint CODE_WORDS = 4u, PARTS = 2u;
        const f16vec2 OFF = f16vec2(1032.0);
#else
        const uint CODE_WORDS = 8u, PARTS = 1u;
        const f16vec2 OFF = f16vec2(1152.0);
#endif
        [[unroll]] for (uint i = 0; i < CODE_WORDS; i++) {
            uint q = rq_odd[r] ? rq[r][i + 1u] : (rq[r][i] >> 16) | (rq[r][i + 1u] << 16);
            [[unroll]] for (uint h = 0; h < PARTS; h++) { // Q4_0: low nibbles (elements 4i ..), high (16 + 4i ..)
#ifdef W_Q4_0
                uint u = (q >> (4u * h)) & 0x0F0F0F0Fu;
#else
                uint u = q ^ 0x80808080u;
#endif
                uint u01 = (u & 0xFFu) | ((u & 0xFF00u) << 8), u23 = ((u >> 16) & 0xFFu) | ((u >> 8) & 0xFF0000u);
                f16vec2 v01 = (unpackFloat2x16(u01 | 0x64006400u) - OFF) * d;
                f16vec2 v23 = (unpackFloat2x16(u23 | 0x64006400u) - OFF) * d;
                wq[r][4u * h + i] = uvec2(packFloat2x16(v01), packFloat2x16(v23));
            }
        }
    }
#elif defined(W_RAW_16) && defined(W_BF16)
    [[unroll]] for (uint r = 0; r < W_PER; r++) { // bf16 is the high half of an f32: to f16, clamped to its range
        uvec4 h = rh[r];
        rh[r] = uvec4(to_f16(vec4(bf16_lo(h.x), bf16_hi(h.x), bf16_lo(h.y), bf16_hi(h.y))),
                      to_f16(vec4(bf16_lo(h.z), bf16_hi(h.z), bf16_lo(h.w), bf16_hi(h.w))));
    }
#elif !defined(W_DIRECT) && !defined(W_RAW_16)
    [[unroll]] for (uint r = 0; r < 2u * W_PER; r++) rwq[r] = to_f16(rw[r]);
#endif
}

void stash(uint base) { // base: the stage's first element; the weights converted already
    [[unroll]] for (uint r = 0; r < A_PER; r++) {
        uint idx = tid_() + r * THREADS, row = base + AS + (idx / (BK / 8u)) * LDS4 + (idx % (BK / 8u)) * 2u;
        smem[row] = ra[r].xy;
        smem[row + 1u] = ra[r].zw;
    }
#if defined(W_RAW_BLOCKS)
    [[unroll]] for (uint r = 0; r < QB_PER; r++) {
        uint idx = tid_() + r * THREADS, row = base + WS + (idx / (WC / 32u)) * LDW4 + (idx % (WC / 32u)) * 8u;
        [[unroll]] for (uint i = 0; i < 8u; i++) smem[row + i] = wq[r][i];
    }
#elif defined(W_RAW_16)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, row = base + WS + (idx / (WC / 8u)) * LDW4 + (idx % (WC / 8u)) * 2u;
        smem[row] = rh[r].xy;
        smem[row + 1u] = rh[r].zw;
    }
#elif !defined(W_DIRECT)
    [[unroll]] for (uint r = 0; r < W_PER; r++) {
        uint idx = tid_() + r * THREADS, row = base + WS + (idx / (WC / 8u)) * LDW4 + (idx % (WC / 8u)) * 2u;
        smem[row] = rwq[2u * r];
        smem[row + 1u] = rwq[2u * r + 1u];
    }
#endif
}

void main() {
    uint warp = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
#ifdef MOE
    uint tile = gl_WorkGroupID.y;
    if (tile >= moe[0]) return;
    uint expert = moe[4u + 4u * tile];
    if (expert < pc.e0 || expert >= pc.e0 + pc.n_exp) return; // another chunk's expert
    tile_first = moe[5u + 4u * tile];
    tile_rows = moe[6u + 4u * tile];
    w_base = (expert - pc.e0) * pc.N;
    m0 = 0u;
#endif
    uint wm = (warp / WARPS_N) * (BM / WARPS_M), wn = (warp % WARPS_N) * (BN / WARPS_N); // this subgroup's part
    bool part = (pc.flags & 64u) != 0u;
#ifdef BACK
    uint red = pc.N; // the reduction's length
    const uint n_out = pc.K; // C's columns
#else
    uint red = pc.K;
    const uint n_out = pc.N;
#endif
    uint kb = part ? gl_WorkGroupID.z * pc.k_split : 0u, ke = part ? min(red, kb + pc.k_split) : red;
    // where the results go: C, or split z's partial sums [M, n_out]
    uint ldc = part ? n_out : pc.ldc, col0 = part ? 0u : pc.c_col0, row0 = part ? gl_WorkGroupID.z * pc.M : 0u;
    uint flags = part ? 0u : pc.flags;
    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
    [[unroll]] for (uint i = 0; i < FM; i++)
        [[unroll]] for (uint j = 0; j < FN; j++) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
#ifdef W_DIRECT
    bool w_in = n0 + wn < pc.N;   // this subgroup's FN = 1 fragment holds rows of W (N % 16 == 0)
#endif
    fetch(m0, n0, kb, ke);
    convert();
    stash(0u);
    barrier();
    uint cur = 0u;   // the stage the products read
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        bool more = k0 + BK < ke;
        if (more) fetch(m0, n0, k0 + BK, ke); /* in flight during the products below */
        [[unroll]] for (uint ks = 0; ks < BK; ks += 16u) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN];
            [[unroll]] for (uint i = 0; i < FM; i++) coopMatLoadNV(fa[i], smem, cur + AS + (wm + 16u * i) * LDS4 + ks / 4u, LDS4, false);
#ifdef W_DIRECT
            if (w_in && k0 + ks < ke) { // (ke is K or a multiple of 64: whole 16-steps)
                coopMatLoadNV(fb[0], w_u4, (n0 + wn) * (pc.K / 8u) + (k0 + ks) / 8u, pc.K / 8u, true);
                [[unroll]] for (uint i = 0; i < FM; i++) acc[i][0] = coopMatMulAddNV(fa[i], fb[0], acc[i][0]);
            }
#else
#ifdef BACK
            [[unroll]] for (uint j = 0; j < FN; j++) coopMatLoadNV(fb[j], smem, cur + WS + ks * LDW4 + (wn + 16u * j) / 4u, LDW4, false);
#else
            [[unroll]] for (uint j = 0; j < FN; j++) coopMatLoadNV(fb[j], smem, cur + WS + (wn + 16u * j) * LDW4 + ks / 4u, LDW4, true);
#endif
            [[unroll]] for (uint i = 0; i < FM; i++)
                [[unroll]] for (uint j = 0; j < FN; j++) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
#endif
        }
#ifdef CONVERT_EARLY
        if (more) convert();
#endif
#if STAGES == 2
        // the next step goes to the other stage while slower subgroups still read this one:
        // one barrier a step
        cur = STAGE - cur;
        if (more) {
#ifndef CONVERT_EARLY
            convert();
#endif
            stash(cur);
        }
        barrier();
#else
        barrier();
        if (more) {
#ifndef CONVERT_EARLY
            convert();
#endif
            stash(0u);
            barrier();
        }
#endif
    }
    // The epilogue names every fragment with constant indices: written as a loop over i and j
    // (which the driver did not unroll, its body holding a loop and barriers) it indexed acc
    // dynamically, which put all the accumulators in local memory for the whole k loop: the
    // kernel ran at 30 TFLOP/s instead of 70-100 (bench/RESULTS.md).
    // Whole tiles without bias, cap or residual go straight to C (ldc and c_col0 multiples of 4:
    // 16-byte aligned rows); the rest through a per-subgroup scratch, one fragment at a time.
#if defined(MOE) || defined(BACK)
    const bool direct = false;
#else
    bool direct = flags == 0u && m0 + BM <= pc.M && n0 + BN <= pc.N && (ldc & 3u) == 0u && (col0 & 3u) == 0u;
#endif
#define STORE_DIRECT(i, j) coopMatStoreNV(acc[i][j], c, (row0 + m0 + wm + 16u * i) * ldc + col0 + n0 + wn + 16u * j, ldc, false);
#define STORE_EPILOGUE(i, j) {                                                                  \
        coopMatStoreNV(acc[i][j], smem, CS + warp * 128u, 8u, false);                           \
        subgroupMemoryBarrierShared();                                                          \
        subgroupBarrier();                                                                      \
        for (uint e = lane; e < 256u; e += 32u) {                                               \
            uint m, n = n0 + wn + 16u * j + e % 16u;                                            \
            if (!c_row_of(m0 + wm + 16u * i + e / 16u, m) || n >= n_out) continue;              \
            uvec2 pair = smem[CS + warp * 128u + e / 2u];                                       \
            float v = uintBitsToFloat((e & 1u) != 0u ? pair.y : pair.x);                        \
            if (BACK_ROWS) v *= bias[m]; /* BACK: the row's scale undone */                     \
            if ((flags & 1u) != 0u) v += bias[pc.bias_off + n];                                 \
            if ((flags & 4u) != 0u) v = safe_tanh(v / pc.softcap) * pc.softcap;                 \
            uint ci = (row0 + m) * ldc + col0 + n;                                              \
            if ((flags & 2u) != 0u) v += c[ci];                                                 \
            c[ci] = v;                                                                          \
        }                                                                                       \
        subgroupBarrier();                                                                      \
    }
    // every fragment this subgroup holds (FM x FN, at most 4 x 4), by name
    if (direct) {
        STORE_DIRECT(0u, 0u)
#if FN > 1
        STORE_DIRECT(0u, 1u)
#endif
#if FN > 2
        STORE_DIRECT(0u, 2u)
#endif
#if FN > 3
        STORE_DIRECT(0u, 3u)
#endif
#if FM > 1
        STORE_DIRECT(1u, 0u)
#endif
#if FM > 1 && FN > 1
        STORE_DIRECT(1u, 1u)
#endif
#if FM > 1 && FN > 2
        STORE_DIRECT(1u, 2u)
#endif
#if FM > 1 && FN > 3
        STORE_DIRECT(1u, 3u)
#endif
#if FM > 2
        STORE_DIRECT(2u, 0u)
#endif
#if FM > 2 && FN > 1
        STORE_DIRECT(2u, 1u)
#endif
#if FM > 2 && FN > 2
        STORE_DIRECT(2u, 2u)
#endif
#if FM > 2 && FN > 3
        STORE_DIRECT(2u, 3u)
#endif
#if FM > 3
        STORE_DIRECT(3u, 0u)
#endif
#if FM > 3 && FN > 1
        STORE_DIRECT(3u, 1u)
#endif
#if FM > 3 && FN > 2
        STORE_DIRECT(3u, 2u)
#endif
#if FM > 3 && FN > 3
        STORE_DIRECT(3u, 3u)
#endif
        return;
    }
    STORE_EPILOGUE(0u, 0u)
#if FN > 1
    STORE_EPILOGUE(0u, 1u)
#endif
#if FN > 2
    STORE_EPILOGUE(0u, 2u)
#endif
#if FN > 3
    STORE_EPILOGUE(0u, 3u)
#endif
#if FM > 1
    STORE_EPILOGUE(1u, 0u)
#endif
#if FM > 1 && FN > 1
    STORE_EPILOGUE(1u, 1u)
#endif
#if FM > 1 && FN > 2
    STORE_EPILOGUE(1u, 2u)
#endif
#if FM > 1 && FN > 3
    STORE_EPILOGUE(1u, 3u)
#endif
#if FM > 2
    STORE_EPILOGUE(2u, 0u)
#endif
#if FM > 2 && FN > 1
    STORE_EPILOGUE(2u, 1u)
#endif
#if FM > 2 && FN > 2
    STORE_EPILOGUE(2u, 2u)
#endif
#if FM > 2 && FN > 3
    STORE_EPILOGUE(2u, 3u)
#endif
#if FM > 3
    STORE_EPILOGUE(3u, 0u)
#endif
#if FM > 3 && FN > 1
    STORE_EPILOGUE(3u, 1u)
#endif
#if FM > 3 && FN > 2
    STORE_EPILOGUE(3u, 2u)
#endif
#if FM > 3 && FN > 3
    STORE_EPILOGUE(3u, 3u)
#endif
}
