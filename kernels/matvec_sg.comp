#version 450
// matvec_sg: the decode matrix-vector product with subgroup reductions.
//   C[m, c_col0 + n] (+)= sum_k A'[m, k] * W[n, k] (+ bias[bias_off + n]),  m < M <= 8
// where A' is row a_row0 + m of A, or with PRENORM that row RMS-normalized and scaled by
// g (the block's norm fused in: sum_k W x g / rms(x), both sums taken in the same pass).
// GATED: W holds gate and up rows interleaved (row 2j = gate j, row 2j + 1 = up j) and the
// output j is act(gate . a) * (up . a), the MLP's middle fused in (N counts outputs).
// One token (M = 1, decode), two mappings chosen by the host (pc.rows_per_wg):
//  - K split (rows_per_wg = R <= 8): a workgroup owns R consecutive outputs and its subgroups
//    split K between them: its lanes together read 8 * (workgroup size) consecutive weights of
//    each of the R rows per iteration, the activations once for all R rows, and every lane has
//    R (gated: 2R) weight loads in flight; each subgroup sums with subgroupAdd, then the
//    subgroups' sums meet in shared memory. Long rows (K >= 8192, or 4096 with more
//    outputs than K) gain: on the H100 a 4096 x 14336 Q4_0 product went from 51.4 to 45.3 us.
//  - one output per subgroup (rows_per_wg = 0): the subgroups take ROWS outputs in turn, each
//    over the whole K, MV_STEPS = 4 steps of k per iteration (four, gated eight, loads in flight
//    per lane; Q4_0 two steps of 16 weights), and a row not gated 2 MV_STEPS while they fit K
//    (eight loads in the gated rows' registers: on the H100 the F16 128256 x 2048 head 251 ->
//    215 us, 2048 x 8192 18.4 -> 17.0); no shared memory, no barrier. Faster for K = 2048
//    (F16 gate|up 33.5 us against 42.8 split), for plain formats at K = 8192 (F16 2048 x 8192
//    21.2 us against 27.7 split) and on CPU devices (lavapipe ran stories260K's decode at 42
//    tok/s split, 60 this way).
// Q4_0 (W_PAIRED, weights.glsl): in both mappings a lane takes 16 weights of a row at a time,
// the low and high nibbles of the same 8 bytes, loading them and the block's scale once.
// Several tokens (M <= 8, short prefill tails): the subgroups take ROWS outputs in turn.
// Mixture of experts (decode, flags EXPERTS): W is a chunk of an expert weight, experts e0 ..
// e0 + n_exp - 1 of N (GATED: 2N) rows each; route holds (expert, weight bits) per (token,
// choice) pair p = t * top_k + j. Workgroup z is the pair p: the product of its expert with
// A row p / a_div (a_div = top_k: the token's activations; 1: the pair's own row) into C row p;
// pairs of another chunk's experts are left alone.
// POST_ADD (the modules matvec_sg_post_*, one token, plain formats, gated, N even): A' is first
//   x + rmsnorm(p) * pw, p and pw bindings 8 and 9 (a sandwich-norm model's post-attention norm,
// Gemma 2 / 3, whose output would otherwise be added to the residual stream x by an rmsnorm
// dispatch before this product: on the H100 10.8 us each, 52 a token of the Gemma3-1B shape);
// each subgroup takes p's RMS itself, and subgroup 0 of workgroup 0 writes that A' row to
// binding 10 for the residual stream (the same value every subgroup forms: the rmsnorm
// kernel's arithmetic, x + (p / rms) * pw, its sum of squares in another order). Two outputs
// a subgroup, as MV_PAIRS's gated products.
// MV_PAIRS (the modules matvec_sg_pair_*, one token, plain formats, N even: host): each
// subgroup takes two outputs, 2 (wg ROWS + r) and the one after: not gated their two rows, as
// the gated mapping takes a gate and an up row; gated their four rows (one_token_gated_pair).
// The activations are loaded once for the rows, twice the weight loads in flight (on the H100
// the F16 128256 x 2048 head: 1.55 TB/s one row a subgroup, 2.95 in pairs; the 1B F16 gate|up
// 16384 x 2048: 39.2 us, 1.71 TB/s, one output a subgroup, 29.3 us, 2.29 TB/s, two).
// Correct for any subgroup size. Built with MV_NO_SPLIT (the plain formats, which forge.c never
// splits) the K split is left out.
// Bindings: 0 A [*, K] f32 | 1 W chunk [rows, K] (format per build) | 2 C [*, ldc] f32
//           3 bias f32 | 4, 5 MLX scales and biases | 6 g f32 [K] (PRENORM) | 7 route uvec2 [pairs]
//           POST_ADD: 8 p f32 [K] | 9 pw f32 [K] | 10 A' f32 [K] (written)
// flags: 1 bias, 2 accumulate into C, 4 soft-cap, 8 PRENORM, 16 GATED (act in bit 5: 0 SiLU, 1 GELU-tanh),
//        512 EXPERTS
// Spec constants: 0 = workgroup size, 1 = ROWS per workgroup (pinned by the host), 2 = PATHS:
// the code compiled in, bit 0 the experts' mapping (EXPERTS flag), bit 1 several tokens' (M > 1),
// bit 2 one token's MV_STEPS unrolled loads (without it the step-at-a-time loop takes all of
// K); the host never asks for a mapping left out. GPUs take all (7). A CPU device compiles only
// what it runs, since lavapipe's LLVM compiles a module whole, every path inlined and unrolled,
// at its first dispatch: matvec_sg_f32 took 82 s with all, 32 s without several tokens', 38 s
// without the experts', 13 s without both, 2.2 s without the unrolled steps too (the host sends
// several tokens to matmul there, and experts exist only in MoE models).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 16;
layout(constant_id = 2) const uint PATHS = 7u;
const bool UNROLLED = (PATHS & 4u) != 0u;

#include "pc_linear.glsl"

#include "common.glsl"
#define W_BINDING 1
#define AUX0_BINDING 4
#define AUX1_BINDING 5
#define QBITS pc.qbits
#define QGROUP pc.qgroup
#define QFLAGS pc.qflags
#include "weights.glsl"
#include "linear_out.glsl"

layout(binding = 0) readonly buffer A_ { float a[]; };
layout(binding = 0) readonly buffer A4_ { vec4 a4[]; };
layout(binding = 6) readonly buffer G_ { float g[]; };
layout(binding = 6) readonly buffer G4_ { vec4 g4[]; };
layout(binding = 7) readonly buffer R_ { uvec2 route[]; }; // (expert, floatBitsToUint(weight)) per pair

#ifdef POST_ADD
layout(binding = 8) readonly buffer P4_ { vec4 p4[]; };
layout(binding = 9) readonly buffer PW4_ { vec4 pw4[]; };
layout(binding = 10) writeonly buffer XO4_ { vec4 xo4[]; };
float post_inv = 0.0;    // 1 / rms(p)
bool post_write = false; // this subgroup writes A' (its first row's reads cover every k once)
#endif

const uint MAX_M = 8;
#ifndef MV_STEPS
#define MV_STEPS 4u   /* one_token, formats read 8 weights at a time: steps of k a lane has in flight */
#endif

// 8 elements of A' row m at k (zero past K); ss += their squares before the norm weight
void a8(uint m, uint k, bool vec_a, bool prenorm, out vec4 lo, out vec4 hi, inout float ss) {
    uint ab = (pc.a_row0 + m) * pc.K + k;
    if (vec_a) {
        lo = a4[ab >> 2];
        hi = a4[(ab >> 2) + 1u];
#ifdef POST_ADD
        lo += p4[k >> 2] * post_inv * pw4[k >> 2];
        hi += p4[(k >> 2) + 1u] * post_inv * pw4[(k >> 2) + 1u];
        if (post_write) {
            xo4[k >> 2] = lo;
            xo4[(k >> 2) + 1u] = hi;
        }
#endif
        if (prenorm) {
            ss += dot(lo, lo) + dot(hi, hi);
            lo *= g4[k >> 2];
            hi *= g4[(k >> 2) + 1u];
        }
    } else {
        float v[8];
        for (uint i = 0; i < 8u; i++) {
            float x = k + i < pc.K ? a[ab + i] : 0.0;
            if (prenorm && k + i < pc.K) {
                ss += x * x;
                x *= g[k + i];
            }
            v[i] = x;
        }
        lo = vec4(v[0], v[1], v[2], v[3]);
        hi = vec4(v[4], v[5], v[6], v[7]);
    }
}

#ifndef MV_NO_SPLIT
const uint MAX_R = 8, MAX_SG = 64;
shared float red_s[MAX_SG][MAX_R], red_u[MAX_SG][MAX_R], red_ss[MAX_SG];

// One token, K split: outputs row0 .. row0 + R of this workgroup (R uniform).
// In scalars and fully unrolled loops, so that nothing spills to local memory.
void one_token_split(uint row0, uint R, uint lane, uint width, bool vec_a, bool prenorm, bool gated) {
    uint sg = gl_SubgroupID, nsg = gl_NumSubgroups;
    float s[MAX_R], u[MAX_R];
    [[unroll]] for (uint r = 0; r < MAX_R; r++) { s[r] = 0.0; u[r] = 0.0; }
    float ss = 0.0;
#ifdef W_PAIRED
    // 16 weights per lane and row: two 8-element pieces 16 apart in a block (weights.glsl)
    for (uint t = sg * width + lane; t < (pc.K >> 4); t += nsg * width) {
        uint k = ((t >> 1) << 5) | ((t & 1u) << 3);
        vec4 alo, ahi, blo, bhi;
        a8(0u, k, vec_a, prenorm, alo, ahi, ss);
        a8(0u, k + 16u, vec_a, prenorm, blo, bhi, ss);
        [[unroll]] for (uint r = 0; r < MAX_R; r++) {
            if (r < R) {
                uint w0 = gated ? 2u * (row0 + r) : row0 + r;
                vec4 w0lo, w0hi, w1lo, w1hi;
                w_get8x2(w0, k, pc.K, w0lo, w0hi, w1lo, w1hi);
                s[r] += dot(w0lo, alo) + dot(w0hi, ahi) + dot(w1lo, blo) + dot(w1hi, bhi);
                if (gated) {
                    w_get8x2(w0 + 1u, k, pc.K, w0lo, w0hi, w1lo, w1hi);
                    u[r] += dot(w0lo, alo) + dot(w0hi, ahi) + dot(w1lo, blo) + dot(w1hi, bhi);
                }
            }
        }
    }
#else
    for (uint k = (sg * width + lane) * 8u; k < pc.K; k += nsg * width * 8u) {
        vec4 alo, ahi;
        a8(0u, k, vec_a, prenorm, alo, ahi, ss);
        [[unroll]] for (uint r = 0; r < MAX_R; r++) {
            if (r < R) {
                uint w0 = gated ? 2u * (row0 + r) : row0 + r;   // gated: the up row after it
                vec4 wlo, whi;
                w_get8_any(w0, k, pc.K, wlo, whi);
                s[r] += dot(wlo, alo) + dot(whi, ahi);
                if (gated) {
                    w_get8_any(w0 + 1u, k, pc.K, wlo, whi);
                    u[r] += dot(wlo, alo) + dot(whi, ahi);
                }
            }
        }
    }
#endif
    [[unroll]] for (uint r = 0; r < MAX_R; r++) {
        if (r < R) {
            float sv = subgroupAdd(s[r]), uv = gated ? subgroupAdd(u[r]) : 0.0;
            if (lane == 0u) { red_s[sg][r] = sv; red_u[sg][r] = uv; }
        }
    }
    float sst = prenorm ? subgroupAdd(ss) : 0.0;
    if (lane == 0u) red_ss[sg] = sst;
    barrier();
    uint r = gl_LocalInvocationIndex;
    if (r < R) {
        float v = 0.0, uv = 0.0, sq = 0.0;
        for (uint i = 0; i < nsg; i++) {
            v += red_s[i][r];
            uv += red_u[i][r];
            sq += red_ss[i];
        }
        float inv = prenorm ? 1.0 / sqrt(sq / float(pc.K) + pc.eps) : 1.0;
        v *= inv;
        if (gated) v = act(v) * (uv * inv);
        store(row0 + r, 0u, v);
    }
}
#endif

#ifdef MV_PAIRS
const bool PAIRS = true;
#else
const bool PAIRS = false;
#endif

// One token, one output per subgroup: weight row w0 (gated: and the up row after it) times
// A' row a_m, normalized and activated as the flags say; every lane returns it (x). With PAIRS
// rows w0 and w0 + 1 are two outputs (x, y). In scalars so that nothing spills to local memory.
vec2 one_token(uint w0, uint a_m, uint lane, uint width, bool vec_a, bool prenorm, bool gated) {
    bool two = gated || PAIRS; // (a second row's loads)
    float s0 = 0.0, s1 = 0.0, u0 = 0.0, u1 = 0.0, ss = 0.0;
#ifdef W_PAIRED
    for (uint t = lane; t < (pc.K >> 4); t += width) {
        uint k = ((t >> 1) << 5) | ((t & 1u) << 3);
        vec4 wa0, wa1, wb0, wb1, ua0 = vec4(0.0), ua1 = vec4(0.0), ub0 = vec4(0.0), ub1 = vec4(0.0);
        w_get8x2(w0, k, pc.K, wa0, wa1, wb0, wb1);
        if (two) w_get8x2(w0 + 1u, k, pc.K, ua0, ua1, ub0, ub1);
        vec4 alo, ahi;
        a8(a_m, k, vec_a, prenorm, alo, ahi, ss);
        s0 += dot(wa0, alo) + dot(wa1, ahi);
        u0 += dot(ua0, alo) + dot(ua1, ahi);
        a8(a_m, k + 16u, vec_a, prenorm, alo, ahi, ss);
        s1 += dot(wb0, alo) + dot(wb1, ahi);
        u1 += dot(ub0, alo) + dot(ub1, ahi);
    }
#else
    // MV_STEPS steps of k a lane (gated: twice as many rows' loads) in flight: the loads of a
    // whole round first, then their products
    uint stride = width * 8u, k = lane * 8u;
    if (UNROLLED && vec_a && !two) { // one row: twice the steps in the same registers
        for (; k + (2u * MV_STEPS - 1u) * stride < pc.K; k += 2u * MV_STEPS * stride) {
            vec4 wl[2u * MV_STEPS], wh[2u * MV_STEPS];
            [[unroll]] for (uint i = 0; i < 2u * MV_STEPS; i++) w_get8(w0, k + i * stride, pc.K, wl[i], wh[i]);
            [[unroll]] for (uint i = 0; i < 2u * MV_STEPS; i++) {
                vec4 alo, ahi;
                a8(a_m, k + i * stride, vec_a, prenorm, alo, ahi, ss);
                s0 += dot(wl[i], alo) + dot(wh[i], ahi);
            }
        }
    }
    if (UNROLLED && vec_a) {
        for (; k + (MV_STEPS - 1u) * stride < pc.K; k += MV_STEPS * stride) {
            vec4 wl[MV_STEPS], wh[MV_STEPS], ul[MV_STEPS], uh[MV_STEPS];
            [[unroll]] for (uint i = 0; i < MV_STEPS; i++) {
                w_get8(w0, k + i * stride, pc.K, wl[i], wh[i]);
                if (two) w_get8(w0 + 1u, k + i * stride, pc.K, ul[i], uh[i]);
            }
            [[unroll]] for (uint i = 0; i < MV_STEPS; i++) {
                vec4 alo, ahi;
                a8(a_m, k + i * stride, vec_a, prenorm, alo, ahi, ss);
                s0 += dot(wl[i], alo) + dot(wh[i], ahi);
                if (two) u0 += dot(ul[i], alo) + dot(uh[i], ahi);
            }
        }
    }
    for (; k < pc.K; k += stride) { // the rest a step at a time (and rows of K % 8 != 0)
        vec4 wa0, wa1, ua0 = vec4(0.0), ua1 = vec4(0.0);
        w_get8_any(w0, k, pc.K, wa0, wa1);
        if (two) w_get8_any(w0 + 1u, k, pc.K, ua0, ua1);
        vec4 alo, ahi;
        a8(a_m, k, vec_a, prenorm, alo, ahi, ss);
        s1 += dot(wa0, alo) + dot(wa1, ahi);
        u1 += dot(ua0, alo) + dot(ua1, ahi);
    }
#endif
    float inv = prenorm ? 1.0 / sqrt(subgroupAdd(ss) / float(pc.K) + pc.eps) : 1.0;
    float v = subgroupAdd(s0 + s1) * inv;
    float u = subgroupAdd(u0 + u1) * inv;
    if (gated) v = act(v) * u;
    return vec2(v, u);
}

#if defined(MV_PAIRS) || defined(POST_ADD)
// One token, two gated outputs a subgroup: weight rows w0 .. w0 + 3 (gate, up, gate, up), the
// activations loaded once for the four, twice the weight loads in flight of one_token's gated
// mapping (MV_STEPS steps of four rows); K % 8 == 0 (host). Returns the two outputs.
vec2 one_token_gated_pair(uint w0, uint lane, uint width, bool prenorm) {
    float s0 = 0.0, u0 = 0.0, s1 = 0.0, u1 = 0.0, ss = 0.0;
    uint stride = width * 8u, k = lane * 8u;
    for (; UNROLLED && k + (MV_STEPS - 1u) * stride < pc.K; k += MV_STEPS * stride) {
        vec4 g0l[MV_STEPS], g0h[MV_STEPS], u0l[MV_STEPS], u0h[MV_STEPS], g1l[MV_STEPS], g1h[MV_STEPS], u1l[MV_STEPS], u1h[MV_STEPS];
        [[unroll]] for (uint i = 0; i < MV_STEPS; i++) {
            w_get8(w0, k + i * stride, pc.K, g0l[i], g0h[i]);
            w_get8(w0 + 1u, k + i * stride, pc.K, u0l[i], u0h[i]);
            w_get8(w0 + 2u, k + i * stride, pc.K, g1l[i], g1h[i]);
            w_get8(w0 + 3u, k + i * stride, pc.K, u1l[i], u1h[i]);
        }
        [[unroll]] for (uint i = 0; i < MV_STEPS; i++) {
            vec4 alo, ahi;
            a8(0u, k + i * stride, true, prenorm, alo, ahi, ss);
            s0 += dot(g0l[i], alo) + dot(g0h[i], ahi);
            u0 += dot(u0l[i], alo) + dot(u0h[i], ahi);
            s1 += dot(g1l[i], alo) + dot(g1h[i], ahi);
            u1 += dot(u1l[i], alo) + dot(u1h[i], ahi);
        }
    }
    for (; k < pc.K; k += stride) { // the rest a step at a time
        vec4 g0lo, g0hi, u0lo, u0hi, g1lo, g1hi, u1lo, u1hi, alo, ahi;
        w_get8(w0, k, pc.K, g0lo, g0hi);
        w_get8(w0 + 1u, k, pc.K, u0lo, u0hi);
        w_get8(w0 + 2u, k, pc.K, g1lo, g1hi);
        w_get8(w0 + 3u, k, pc.K, u1lo, u1hi);
        a8(0u, k, true, prenorm, alo, ahi, ss);
        s0 += dot(g0lo, alo) + dot(g0hi, ahi);
        u0 += dot(u0lo, alo) + dot(u0hi, ahi);
        s1 += dot(g1lo, alo) + dot(g1hi, ahi);
        u1 += dot(u1lo, alo) + dot(u1hi, ahi);
    }
    float inv = prenorm ? 1.0 / sqrt(subgroupAdd(ss) / float(pc.K) + pc.eps) : 1.0;
    float g0 = subgroupAdd(s0) * inv, up0 = subgroupAdd(u0) * inv, g1 = subgroupAdd(s1) * inv, up1 = subgroupAdd(u1) * inv;
    return vec2(act(g0) * up0, act(g1) * up1);
}
#endif

// Mixture of experts, one output per subgroup (the header's EXPERTS).
void experts(uint lane, uint width, bool vec_a, bool gated) {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, z = gl_WorkGroupID.z;
    uint e = route[z].x;
    if (e < pc.e0 || e >= pc.e0 + pc.n_exp) return; // another chunk's expert (uniform: z is the workgroup's)
    uint w_expert = (e - pc.e0) * (gated ? 2u * pc.N : pc.N);
    for (uint r = gl_SubgroupID; r < ROWS; r += gl_NumSubgroups) {
        uint out_row = wg * ROWS + r;
        if (out_row >= pc.N) break; // uniform across the subgroup
        float v = one_token(w_expert + (gated ? 2u * out_row : out_row), z / pc.a_div, lane, width, vec_a, false, gated).x;
        if (lane == 0u) store(out_row, z, v);
    }
}

// Several tokens (M <= 8, rare: short prefill tails): one output at a time.
void few_tokens(uint out_row, uint lane, uint width, bool vec_a, bool prenorm, bool gated) {
    uint w0 = gated ? 2u * out_row : out_row;
    float acc[MAX_M], acc2[MAX_M], ss[MAX_M];
    for (uint m = 0; m < MAX_M; m++) { acc[m] = 0.0; acc2[m] = 0.0; ss[m] = 0.0; }
    for (uint k = lane * 8u; k < pc.K; k += width * 8u) {
        vec4 wlo, whi, ulo = vec4(0.0), uhi = vec4(0.0);
        w_get8_any(w0, k, pc.K, wlo, whi);
        if (gated) w_get8_any(w0 + 1u, k, pc.K, ulo, uhi);
        for (uint m = 0; m < MAX_M; m++) {
            if (m >= pc.M) break;
            vec4 alo, ahi;
            a8(m, k, vec_a, prenorm, alo, ahi, ss[m]);
            acc[m] += dot(wlo, alo) + dot(whi, ahi);
            acc2[m] += dot(ulo, alo) + dot(uhi, ahi);
        }
    }
    for (uint m = 0; m < MAX_M; m++) {
        if (m >= pc.M) break;
        float inv = prenorm ? 1.0 / sqrt(subgroupAdd(ss[m]) / float(pc.K) + pc.eps) : 1.0;
        float v = subgroupAdd(acc[m]) * inv;
        float u = subgroupAdd(acc2[m]) * inv;
        if (gated) v = act(v) * u;
        if (lane == 0u) store(out_row, m, v);
    }
}

void main() {
    uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    bool vec_a = (pc.K & 7u) == 0u, prenorm = (pc.flags & 8u) != 0u, gated = (pc.flags & 16u) != 0u;
    if ((PATHS & 1u) != 0u && (pc.flags & 512u) != 0u) {
        experts(lane, width, vec_a, gated);
        return;
    }
#ifndef MV_NO_SPLIT
    if (pc.rows_per_wg != 0u) {
        uint row0 = wg * pc.rows_per_wg;
        if (row0 < pc.N) one_token_split(row0, min(pc.rows_per_wg, pc.N - row0), lane, width, vec_a, prenorm, gated); // uniform
        return;
    }
#endif
#if defined(MV_PAIRS) || defined(POST_ADD) // (one token, N even; gated: K % 8 == 0; POST_ADD: gated, K % 8 == 0: host)
#ifdef POST_ADD
    float pss = 0.0;
    for (uint i = lane; i < (pc.K >> 2); i += width) pss += dot(p4[i], p4[i]);
    post_inv = 1.0 / sqrt(subgroupAdd(pss) / float(pc.K) + pc.eps);
#endif
    for (uint r = gl_SubgroupID; r < ROWS; r += gl_NumSubgroups) {
        uint row = 2u * (wg * ROWS + r);
        if (row >= pc.N) break; // uniform across the subgroup
#ifdef POST_ADD
        post_write = wg == 0u && gl_SubgroupID == 0u && r == 0u;
#endif
        vec2 v = gated ? one_token_gated_pair(2u * row, lane, width, prenorm) : one_token(row, 0u, lane, width, vec_a, prenorm, false);
        if (lane == 0u) {
            store(row, 0u, v.x);
            store(row + 1u, 0u, v.y);
        }
    }
#else
    for (uint r = gl_SubgroupID; r < ROWS; r += gl_NumSubgroups) {
        uint out_row = wg * ROWS + r;
        if (out_row >= pc.N) break; // uniform across the subgroup
        if (pc.M == 1u) {
            float v = one_token(gated ? 2u * out_row : out_row, 0u, lane, width, vec_a, prenorm, gated).x;
            if (lane == 0u) store(out_row, 0u, v);
        } else if ((PATHS & 2u) != 0u) {
            few_tokens(out_row, lane, width, vec_a, prenorm, gated);
        }
    }
#endif
}
