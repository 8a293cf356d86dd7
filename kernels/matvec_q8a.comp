#version 450
// matvec_q8a: the decode matrix-vector product of Q4_0 or Q8_0 weights (one token) on int8
// activations from act_q8.comp, with 4-way integer dot products (SPV_KHR_integer_dot_product,
// dp4a on NVIDIA):
//   Q4_0: C[c_col0 + n] (+)= sum_b dw(n, b) * (da_b * dot(w codes, a codes) - 8 * sa_b)
//   Q8_0: C[c_col0 + n] (+)= sum_b dw(n, b) * da_b * dot(w codes, a codes)
// over the blocks b of 32 (dw the weight block's scale, da_b and sa_b = da_b * sum of the
// activation codes from act_q8); with PRENORM times 1 / rms(A) = 1 / sqrt(sum_b ss_b / K + eps),
// ss_b the blocks' sums of squares from act_q8 (which applied the norm's weight g), summed by
// the lanes as they read the blocks; then bias, soft-cap, accumulate (linear_out.glsl). GATED:
// W holds gate and up rows interleaved and output j is act(gate . a) * (up . a).
// Why: matvec_sg turns every weight into an f32 and reads an f32 activation for it from L1 (8
// bytes of activation for each byte of Q4_0 weight) at 5-6 instructions a weight, which held
// the Q4_0 products at a third of the H100's bandwidth. Here a lane takes whole blocks: one
// Q4_0 block is 5 aligned words (9 for Q8_0) and 32 activation bytes, 8 integer dot products.
// Not exact: the activations are rounded to 8 bits per block of 32 (as llama.cpp's quantized
// products do); used where the model is not `exact`.
// Mapping: one output per subgroup at a time, ROWS outputs per workgroup; the lanes take the
// row's blocks in turn, two at a time (10 or 18 weight loads in flight per lane).
// Q8_OUT (flags 128): the product also quantizes its output row as act_q8.comp would, for the
// next product (one dependent dispatch fewer: on the H100 each costs about 4 us, and a decode
// token of the 1B Q4_0 shape had 49 act_q8 dispatches, bench/RESULTS.md). A block of 32
// outputs is written by 32 / ROWS workgroups; each counts its rows in done[block] and the last
// to arrive reads the block back and quantizes it (times g, with its squares, under
// Q8_OUT_NORM, flags 1024: the next product's RMS norm, as act_q8's PRENORM). Needs M = 1, a
// product that writes all ldc columns of C with ldc % 32 == 0, and c_col0 % ROWS == 0 (host).
// Bindings: 0 activations (act_q8: [K / 4] u32 codes, then [K / 32] vec4) | 1 W chunk [rows, K]
//           2 C f32 | 3 bias f32 | 4 Q8_OUT: the output as int8 blocks (act_q8's layout, ldc
//           values) | 5 g f32 [ldc] (Q8_OUT_NORM) | 6 done u32 [ldc / 32], zero between products
// flags: as matvec_sg (8 PRENORM, 16 GATED, linear_out.glsl's), 128 Q8_OUT, 1024 Q8_OUT_NORM
// Spec constants: 0 = workgroup size, 1 = ROWS per workgroup (pinned by the host).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_spirv_intrinsics : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 16;

layout(push_constant) uniform PC {
    uint M, K, N, a_row0, ldc, c_col0, flags, bias_off;
    float softcap;
    uint qbits, qgroup, qflags;
    float eps;
    uint rows_per_wg;
} pc;

#include "common.glsl"
#define W_BINDING 1
#include "weights.glsl"
#include "linear_out.glsl"

layout(binding = 0) readonly buffer QA_ { uvec4 qa4[]; };
layout(binding = 0) readonly buffer SA_ { vec4 sa4[]; };
layout(binding = 2) coherent buffer C4_ { vec4 c4[]; }; // (C, read back by Q8_OUT)
layout(binding = 4) writeonly buffer QO_ { uvec4 qo4[]; };
layout(binding = 4) writeonly buffer SO_ { vec4 so4[]; };
layout(binding = 5) readonly buffer G4_ { vec4 g4[]; };
layout(binding = 6) coherent buffer D_ { uint done[]; };
shared bool sm_last;

// OpSDot / OpSUDot on 4 packed 8-bit integers (PackedVectorFormat4x8Bit = 0); capabilities
// DotProduct (6019) and DotProductInput4x8BitPacked (6018)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dot_s8_s8(uint a, uint b, spirv_literal int packed_format);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int dot_s8_u8(uint a, uint b, spirv_literal int packed_format);

#if defined(W_Q4_0)
// block b of weight row `row`: f16 d, then 16 bytes of nibbles (element j < 16 the low nibble
// of byte j, j >= 16 the high nibble of byte j - 16); 18 bytes at a 2-byte aligned offset,
// read as 5 aligned words either way
float block_dot(uint row, uint b, uint nb, uvec4 a0, uvec4 a1, vec4 sa) {
    uint bo = (row * nb + b) * 18u, w = bo >> 2;
    uint x0 = w_u32[w], x1 = w_u32[w + 1u], x2 = w_u32[w + 2u], x3 = w_u32[w + 3u], x4 = w_u32[w + 4u];
    bool odd = (bo & 2u) != 0u;
    float d = unpackHalf2x16(odd ? x0 >> 16 : x0 & 0xffffu).x;
    uvec4 q = odd ? uvec4(x1, x2, x3, x4) : uvec4((x0 >> 16) | (x1 << 16), (x1 >> 16) | (x2 << 16), (x2 >> 16) | (x3 << 16), (x3 >> 16) | (x4 << 16));
    uvec4 lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
    int s = dot_s8_u8(a0.x, lo.x, 0) + dot_s8_u8(a0.y, lo.y, 0) + dot_s8_u8(a0.z, lo.z, 0) + dot_s8_u8(a0.w, lo.w, 0)
          + dot_s8_u8(a1.x, hi.x, 0) + dot_s8_u8(a1.y, hi.y, 0) + dot_s8_u8(a1.z, hi.z, 0) + dot_s8_u8(a1.w, hi.w, 0);
    return d * (sa.x * float(s) - 8.0 * sa.y);
}
#elif defined(W_Q8_0)
// block b: f16 d, then 32 int8 codes; 34 bytes at a 2-byte aligned offset, 9 aligned words
float block_dot(uint row, uint b, uint nb, uvec4 a0, uvec4 a1, vec4 sa) {
    uint bo = (row * nb + b) * 34u, w = bo >> 2;
    uint x[9];
    [[unroll]] for (uint i = 0u; i < 9u; i++) x[i] = w_u32[w + i];
    bool odd = (bo & 2u) != 0u;
    float d = unpackHalf2x16(odd ? x[0] >> 16 : x[0] & 0xffffu).x;
    uint q[8];
    [[unroll]] for (uint i = 0u; i < 8u; i++) q[i] = odd ? x[i + 1u] : (x[i] >> 16) | (x[i + 1u] << 16);
    int s = dot_s8_s8(a0.x, q[0], 0) + dot_s8_s8(a0.y, q[1], 0) + dot_s8_s8(a0.z, q[2], 0) + dot_s8_s8(a0.w, q[3], 0)
          + dot_s8_s8(a1.x, q[4], 0) + dot_s8_s8(a1.y, q[5], 0) + dot_s8_s8(a1.z, q[6], 0) + dot_s8_s8(a1.w, q[7], 0);
    return d * sa.x * float(s);
}
#else
#error "matvec_q8a: W_Q4_0 or W_Q8_0"
#endif

void main() {
    uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    bool gated = (pc.flags & 16u) != 0u, prenorm = (pc.flags & 8u) != 0u;
    uint nb = pc.K >> 5, sa0 = pc.K >> 4;
    for (uint r = gl_SubgroupID; r < ROWS; r += gl_NumSubgroups) {
        uint out_row = wg * ROWS + r;
        if (out_row >= pc.N) break; // uniform across the subgroup
        uint w0 = gated ? 2u * out_row : out_row; // the weight row (gated: and the up row after it)
        float s = 0.0, u = 0.0, ss = 0.0;
        for (uint b = lane; b < nb; b += 2u * width) {
            uint b1 = b + width;
            bool has1 = b1 < nb;
            uvec4 a0 = qa4[2u * b], a1 = qa4[2u * b + 1u];
            vec4 sa = sa4[sa0 + b];
            uvec4 c0 = uvec4(0u), c1 = uvec4(0u);
            vec4 sc = vec4(0.0);
            if (has1) {
                c0 = qa4[2u * b1];
                c1 = qa4[2u * b1 + 1u];
                sc = sa4[sa0 + b1];
            }
            ss += sa.z + sc.z;
            s += block_dot(w0, b, nb, a0, a1, sa);
            if (has1) s += block_dot(w0, b1, nb, c0, c1, sc);
            if (gated) {
                u += block_dot(w0 + 1u, b, nb, a0, a1, sa);
                if (has1) u += block_dot(w0 + 1u, b1, nb, c0, c1, sc);
            }
        }
        float inv = prenorm ? 1.0 / sqrt(subgroupAdd(ss) / float(pc.K) + pc.eps) : 1.0;
        float v = subgroupAdd(s) * inv;
        if (gated) v = act(v) * (subgroupAdd(u) * inv);
        if (lane == 0u) store(out_row, 0u, v);
    }
    if ((pc.flags & 128u) == 0u || wg * ROWS >= pc.N) return; // (uniform across the workgroup)
    // Q8_OUT: this workgroup's rows are in one block (ROWS divides 32, c_col0 % ROWS == 0)
    uint first = wg * ROWS, blk = (pc.c_col0 + first) >> 5, rows = min(ROWS, pc.N - first);
    memoryBarrierBuffer(); // this workgroup's outputs before its count
    barrier();
    if (gl_LocalInvocationIndex == 0u) sm_last = atomicAdd(done[blk], rows) == 32u - rows;
    barrier();
    if (!sm_last || gl_LocalInvocationIndex != 0u) return;
    memoryBarrierBuffer(); // the other workgroups' outputs after their counts
    done[blk] = 0u;
    bool norm = (pc.flags & 1024u) != 0u;
    vec4 q[8];
    float ss = 0.0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        q[i] = c4[8u * blk + i];
        ss += dot(q[i], q[i]);
        if (norm) q[i] *= g4[8u * blk + i];
    }
    uint w[8];
    vec2 ds;
    quantize_q8_block(q, w, ds);
    qo4[2u * blk] = uvec4(w[0], w[1], w[2], w[3]);
    qo4[2u * blk + 1u] = uvec4(w[4], w[5], w[6], w[7]);
    so4[(pc.ldc >> 4) + blk] = vec4(ds, ss, 0.0);
}
