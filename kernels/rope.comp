#version 450
// rope: rotates pairs of each head of x by angle (pos0 + t) * inv_freq[i].
//   rotate-half (HF):        pair (i, i + D/2)
//   adjacent pairs (GGUF):   pair (2i, 2i + 1)
// Positions come from the params buffer, so a recorded command buffer serves every step.
// With STORE_KV the rotated K and the untouched V go into the KV cache at slot
// pos % cache_slots (a rotating cache when cache_slots < context); without it x is
// rotated in place (queries).
// Bindings: 0 params {pos0, n} | 1 inv_freq f32 [D/2] | 2 x f32 [n, heads, D]
//           3 out f32 (x itself, or the K cache [slots, heads, D]) | 4 v f32 [n, heads, D]
//           5 V cache [slots, heads, D]
// One invocation per pair.
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 64) in;

#include "common.glsl"

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; } params;
layout(binding = 1) readonly buffer F_ { float inv_freq[]; };
layout(binding = 2) readonly buffer X_ { float x[]; };
layout(binding = 3) buffer O_ { float o[]; };
layout(binding = 4) readonly buffer V_ { float v[]; };
layout(binding = 5) writeonly buffer VC_ { float vc[]; };

layout(push_constant) uniform PC {
    uint n_tokens, n_heads, head_dim, adjacent, cache_slots, store_kv;
} pc;

void main() {
    uint half_d = pc.head_dim / 2u;
    uint idx = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    if (idx >= pc.n_tokens * pc.n_heads * half_d) return;
    uint i = idx % half_d;
    uint th = idx / half_d;
    uint h = th % pc.n_heads, t = th / pc.n_heads;
    uint pos = params.pos0 + t;
    uint i0 = pc.adjacent != 0u ? 2u * i : i;
    uint i1 = pc.adjacent != 0u ? 2u * i + 1u : i + half_d;
    uint src = (t * pc.n_heads + h) * pc.head_dim;
    vec2 cs = cos_sin(float(pos) * inv_freq[i]);
    float x0 = x[src + i0], x1 = x[src + i1];
    float y0 = x0 * cs.x - x1 * cs.y;
    float y1 = x1 * cs.x + x0 * cs.y;
    uint dst = src;
    if (pc.store_kv != 0u) {
        dst = ((pos % pc.cache_slots) * pc.n_heads + h) * pc.head_dim;
        vc[dst + i0] = v[src + i0];
        vc[dst + i1] = v[src + i1];
    }
    o[dst + i0] = y0;
    o[dst + i1] = y1;
}
