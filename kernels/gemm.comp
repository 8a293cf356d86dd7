#version 450
// gemm: C(m, n) (+)= alpha * sum_k A(m, k) B(k, n), all f32, every operand through strides:
//   A(m, k) = a[a_off + m * a_sm + k * a_sk]
//   B(k, n) = b[b_off + k * b_sk + n * b_sn]
//   C(m, n) = c[c_off + m * c_sm + n * c_sn]
// so transposes and column ranges need no copies. This is the LoRA path: u = x A^T,
// y += s u B^T, and in the backward pass dB = s dy^T u, du = s dy B, dA = du^T x, dx += du A.
// Optional dropout (PEFT's on the adapter's input): elements of x are kept with probability
// 1 - p and scaled by 1 / (1 - p), the mask a hash of (seed, stream, index) so the backward
// pass recomputes it instead of storing it. x is operand A (drop_on 1: index m * drop_ld + k),
// operand B (2: index k * drop_ld + n) or sits behind the output (3: index m * drop_ld + n,
// masking the product before it is added). Its index is always token * in_features + column.
// Tiles of 32 (m) x 32 (n), k in steps of 32 through shared memory; 64 threads, 4 x 4 each
// (small tiles: the low-rank products have 8 to 64 columns).
// Split-K: the low-rank products are skinny with a long k (tokens, or 8192 features), too few
// tiles to fill a GPU; with splits > 1 workgroup z sums k in [z k_chunk, (z + 1) k_chunk) into
// part[z, m, n], and a second dispatch (reduce = 1, one invocation per element) adds the
// partial sums in a fixed order (the result does not depend on scheduling) and finishes.
// Bindings: 0 A f32 | 1 B f32 | 2 C f32 (in/out) | 3 the step params (the dropout seed)
//           4 partial sums f32 [splits, M, N] (split-K)
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer A_ { float a[]; };
layout(binding = 1) readonly buffer B_ { float b[]; };
layout(binding = 2) buffer C_ { float c[]; };
layout(binding = 3) readonly buffer P_ { uint pos0, n_tok, n_penalty; float penalty, inv_temp; uint seed; } params;   // the step params
layout(binding = 4) buffer Part_ { float part[]; };

// push constants: forge__pc_gemm (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC {
    uint M, N, K;
    uint a_off, a_sm, a_sk;
    uint b_off, b_sk, b_sn;
    uint c_off, c_sm, c_sn;
    float alpha;
    uint accumulate;
    uint drop_on, drop_ld, drop_stream, drop_threshold;   // threshold = p * 2^32
    float drop_scale;                                      // 1 / (1 - p)
    uint splits, k_chunk, reduce;
} pc;

const uint BM = 32, BN = 32, BK = 32;
shared float As[BK][BM + 1];
shared float Bs[BK][BN + 1];

float keep(uint idx, uint key) { return lowbias_hash(idx ^ key) >= pc.drop_threshold ? pc.drop_scale : 0.0; }

// alpha * v, masked (output dropout), added to C or written
void finish(uint m, uint n, float v, uint key) {
    v *= pc.alpha;
    if (pc.drop_on == 3u) v *= keep(m * pc.drop_ld + n, key);
    uint ci = pc.c_off + m * pc.c_sm + n * pc.c_sn;
    if (pc.accumulate != 0u) v += c[ci];
    c[ci] = v;
}

// The A and B tiles at k0 into registers: element i of each at (slow0 + 2 i, fast) of the
// operand's (slow, fast) dimensions, zero outside the matrix and past kend.
void load_tiles(uint k0, uint kend, uint m0, uint n0, uint slow0, uint fast, bool a_k_fast, bool b_n_fast, uint key,
                out float ra[16], out float rb[16]) {
    for (uint i = 0; i < 16u; i++) {
        uint slow = slow0 + 2u * i;
        uint m = m0 + (a_k_fast ? slow : fast), k = k0 + (a_k_fast ? fast : slow);
        float v = 0.0;
        if (m < pc.M && k < kend) {
            v = a[pc.a_off + m * pc.a_sm + k * pc.a_sk];
            if (pc.drop_on == 1u) v *= keep(m * pc.drop_ld + k, key);
        }
        ra[i] = v;
        uint n = n0 + (b_n_fast ? fast : slow), kb = k0 + (b_n_fast ? slow : fast);
        v = 0.0;
        if (n < pc.N && kb < kend) {
            v = b[pc.b_off + kb * pc.b_sk + n * pc.b_sn];
            if (pc.drop_on == 2u) v *= keep(kb * pc.drop_ld + n, key);
        }
        rb[i] = v;
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint key = pc.drop_on != 0u ? lowbias_hash(params.seed ^ lowbias_hash(pc.drop_stream + 0x9e3779b9u)) : 0u;
    if (pc.reduce != 0u) {
        uint e = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
        if (e >= pc.M * pc.N) return;
        float s = 0.0;
        for (uint z = 0; z < pc.splits; z++) s += part[z * pc.M * pc.N + e];
        finish(e / pc.N, e % pc.N, s, key);
        return;
    }
    uint tx = tid % 8u, ty = tid / 8u;
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint kz = gl_WorkGroupID.z * pc.k_chunk, kend = min(pc.K, kz + pc.k_chunk);
    float acc[4][4];
    for (uint i = 0; i < 4u; i++)
        for (uint j = 0; j < 4u; j++) acc[i][j] = 0.0;
    // consecutive invocations load along the operand's contiguous dimension (coalesced)
    bool a_k_fast = pc.a_sk <= pc.a_sm, b_n_fast = pc.b_sn <= pc.b_sk;
    // Each thread's 16 elements of each tile: element i sits at (tid / 32 + 2 i, tid % 32) along
    // (slow, fast) of the operand's layout. The next tile's 32 loads are issued into registers
    // before the current tile's products, so they are in flight together and behind the math
    // (a load-then-store loop keeps one load in flight and waits on each in turn).
    uint slow0 = tid / 32u, fast = tid % 32u;
    float ra[16], rb[16];
    load_tiles(kz, kend, m0, n0, slow0, fast, a_k_fast, b_n_fast, key, ra, rb);
    for (uint k0 = kz; k0 < kend; k0 += BK) {
        for (uint i = 0; i < 16u; i++) {
            uint slow = slow0 + 2u * i;
            if (a_k_fast) As[fast][slow] = ra[i]; else As[slow][fast] = ra[i];
            if (b_n_fast) Bs[slow][fast] = rb[i]; else Bs[fast][slow] = rb[i];
        }
        barrier();
        if (k0 + BK < kend) load_tiles(k0 + BK, kend, m0, n0, slow0, fast, a_k_fast, b_n_fast, key, ra, rb);
        for (uint k = 0; k < BK; k++) {
            float av[4], bv[4];
            for (uint i = 0; i < 4u; i++) av[i] = As[k][ty * 4u + i];
            for (uint j = 0; j < 4u; j++) bv[j] = Bs[k][tx * 4u + j];
            for (uint i = 0; i < 4u; i++)
                for (uint j = 0; j < 4u; j++) acc[i][j] += av[i] * bv[j];
        }
        barrier();
    }
    for (uint i = 0; i < 4u; i++) {
        uint m = m0 + ty * 4u + i;
        if (m >= pc.M) break;
        for (uint j = 0; j < 4u; j++) {
            uint n = n0 + tx * 4u + j;
            if (n >= pc.N) break;
            if (pc.splits > 1u) part[(gl_WorkGroupID.z * pc.M + m) * pc.N + n] = acc[i][j];
            else finish(m, n, acc[i][j], key);
        }
    }
}
