#version 450
// moe_route_back: the backward twin of moe_route.comp (training), and of the shared expert's
// sigmoid gate. One workgroup of 256 per token t.
// Router (flags 1 or 0): the layer's expert output is out_t = sum_j w_j y_{t K + j}, so each
// chosen weight's gradient is dw_j = dy_t . y_{t K + j} (y: each pair's expert output [pairs,
// dim], dy: out's gradient [n_tokens, dim]). With p = softmax(logits_t) and the chosen experts
// e_j of the route, renormalized (flags 1) w_j = p_{e_j} / S, S = sum_j p_{e_j}, so
// dp_{e_j} = (dw_j - sum_i w_i dw_i) / S; else w_j = p_{e_j} and dp_{e_j} = dw_j; the others'
// dp is 0 (the top-k choice itself has no gradient, as in PyTorch). Then the softmax's
// dlogit_e = p_e (dp_e - sum_f p_f dp_f), written for every expert.
// Shared gate (flags 4): h_t = sigmoid(s_t) m_t (the shared expert's middle times its gate,
// act_mul.comp's act + 8), so ds_t = (1 - sigmoid(s_t)) (dh_t . h_t), with dh [n_tokens, dim],
// h [n_tokens, dim] in bindings 2 and 3, s_t in binding 0 (n_experts 1) and ds_t written to 4.
// Bindings: 0 logits f32 [n_tokens, n_experts] (flags 4: s [n_tokens]) | 1 route uvec2 [n_tokens * top_k]
//           2 dy f32 [n_tokens, dim] (4: dh) | 3 y f32 [n_tokens * top_k, dim] (4: h) | 4 dlogits f32 [n_tokens, n_experts] (4: ds), out
layout(local_size_x = 256) in;

const uint MAXE = 1024;  // forge.c FORGE__MAX_EXPERTS
const uint MAXK = 32;    // forge.c FORGE__MAX_EXPERTS_USED

layout(binding = 0) readonly buffer L_ { float logits[]; };
layout(binding = 1) readonly buffer R_ { uvec2 route[]; };
layout(binding = 2) readonly buffer DY_ { float dy[]; };
layout(binding = 3) readonly buffer Y_ { float y[]; };
layout(binding = 4) writeonly buffer DL_ { float dlogits[]; };

// push constants: forge__pc_moe_route_back (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint n_experts, top_k, flags, n_tokens, dim; } pc;

shared float prob[MAXE];
shared float red_v[256];
shared float dw[MAXK];

// The workgroup's sum of v (every invocation gets it).
float block_sum(float v) {
    uint tid = gl_LocalInvocationID.x;
    red_v[tid] = v;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red_v[tid] += red_v[tid + s];
        barrier();
    }
    float r = red_v[0];
    barrier();
    return r;
}

// dy_t . y_row over dim
float row_dot(uint t, uint row) {
    float acc = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.dim; i += 256u) acc += dy[t * pc.dim + i] * y[row * pc.dim + i];
    return block_sum(acc);
}

void main() {
    uint tid = gl_LocalInvocationID.x, t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= pc.n_tokens) return; // (the grid's last row)
    if ((pc.flags & 4u) != 0u) {
        float d = row_dot(t, t);
        if (tid == 0u) dlogits[t] = (1.0 - 1.0 / (1.0 + exp(-logits[t]))) * d;
        return;
    }
    uint E = pc.n_experts, K = pc.top_k, base = t * E;
    for (uint j = 0; j < K; j++) {
        float d = row_dot(t, t * K + j);
        if (tid == 0u) dw[j] = d;
    }
    // the probabilities, as moe_route.comp computes them
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
    float part = 0.0;
    for (uint e = tid; e < E; e += 256u) {
        float x = exp(logits[base + e] - m);
        prob[e] = x;
        part += x;
    }
    float inv_sum = 1.0 / block_sum(part);
    for (uint e = tid; e < E; e += 256u) prob[e] *= inv_sum;
    barrier();
    // dp of the chosen experts (in dw's place) and sum_f p_f dp_f, by one invocation (K <= 32)
    if (tid == 0u) {
        float total = 0.0, wdw = 0.0;
        for (uint j = 0; j < K; j++) total += prob[route[t * K + j].x];
        for (uint j = 0; j < K; j++) wdw += prob[route[t * K + j].x] / total * dw[j];
        float pdp = 0.0;
        for (uint j = 0; j < K; j++) {
            float dp = (pc.flags & 1u) != 0u ? (dw[j] - wdw) / total : dw[j];
            dw[j] = dp;
            pdp += prob[route[t * K + j].x] * dp;
        }
        red_v[0] = pdp;
    }
    barrier();
    float pdp = red_v[0];
    for (uint e = tid; e < E; e += 256u) {
        float dp = 0.0;
        for (uint j = 0; j < K; j++) dp += route[t * K + j].x == e ? dw[j] : 0.0;
        dlogits[base + e] = prob[e] * (dp - pdp);
    }
}
