#version 450
// moe_route: a mixture-of-experts router's choice for each token. Row t of the router logits
// [n_tokens, n_experts] becomes probabilities p = softmax(logits) (f32, as transformers
// computes them), then the top_k experts by probability (ties: the lower index first), their
// weights p (flags 1: renormalized to sum 1 over the chosen; flags 2: then times
// expert_scale[e], Gemma 4's per_expert_scale), written in order of rank as
// route[t * top_k + j] = (expert, floatBitsToUint(weight)).
// One workgroup of 256 per token.
// Bindings: 0 logits f32 [n_tokens, n_experts] | 1 route uvec2 [n_tokens * top_k] (out)
//           2 expert_scale f32 [n_experts] (flags 2)
layout(local_size_x = 256) in;

const uint MAXE = 1024;  // forge.c FORGE__MAX_EXPERTS
const uint MAXK = 32;    // forge.c FORGE__MAX_EXPERTS_USED

layout(binding = 0) readonly buffer L_ { float logits[]; };
layout(binding = 1) writeonly buffer R_ { uvec2 route[]; };
layout(binding = 2) readonly buffer S_ { float expert_scale[]; };

// push constants: forge__pc_moe_route (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint n_experts, top_k, flags, n_tokens; } pc;

shared float prob[MAXE];
shared float red_v[256];
shared uint chosen[MAXK];

void main() {
    uint tid = gl_LocalInvocationID.x, t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= pc.n_tokens) return; // (the grid's last row)
    uint E = pc.n_experts, base = t * E;
    // max, then the sum of exponentials, then the probabilities
    float m = -1.0 / 0.0;
    for (uint e = tid; e < E; e += 256u) m = max(m, logits[base + e]);
    red_v[tid] = m;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red_v[tid] = max(red_v[tid], red_v[tid + s]);
        barrier();
    }
    m = red_v[0];
    barrier();
    float sum = 0.0;
    for (uint e = tid; e < E; e += 256u) {
        float x = exp(logits[base + e] - m);
        prob[e] = x;
        sum += x;
    }
    red_v[tid] = sum;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red_v[tid] += red_v[tid + s];
        barrier();
    }
    float inv_sum = 1.0 / red_v[0];
    barrier();
    for (uint e = tid; e < E; e += 256u) prob[e] *= inv_sum;
    barrier();
    // each expert's rank: the experts with a higher probability, or an equal one and a lower
    // index, before it; the top_k ranks are the choice, in order (one pass over shared memory
    // instead of top_k rounds of a reduction: 15 us a layer on the H200 for 128 experts, 8 chosen)
    if (tid < pc.top_k) chosen[tid] = tid; // (NaN probabilities rank nowhere: some valid expert stays)
    barrier();
    for (uint e = tid; e < E; e += 256u) {
        float pe = prob[e];
        uint rank = 0u;
        for (uint f = 0u; f < E; f++) {
            float pf = prob[f];
            rank += (pf > pe || (pf == pe && f < e)) ? 1u : 0u;
        }
        if (rank < pc.top_k) chosen[rank] = e;
    }
    barrier();
    if (tid == 0u) {
        float total = 0.0;
        for (uint j = 0; j < pc.top_k; j++) total += prob[chosen[j]];
        for (uint j = 0; j < pc.top_k; j++) {
            uint e = chosen[j];
            float w = prob[e];
            if ((pc.flags & 1u) != 0u) w /= total;
            if ((pc.flags & 2u) != 0u) w *= expert_scale[e];
            route[t * pc.top_k + j] = uvec2(e, floatBitsToUint(w));
        }
    }
}
