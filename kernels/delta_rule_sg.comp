#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_GOOGLE_include_directive : require
// delta_rule_sg: a linear-attention layer's gated delta rule (Qwen 3.5's Gated DeltaNet), the
// recurrent form with the state in registers, one column of it at a time: delta_rule.comp's
// twin where the device shuffles within subgroups. Column j of a value head's state S [k_dim,
// v_dim] evolves alone (every row of the rule reads S only through S^T k and S^T q, column by
// column), so each column is owned by `lanes` adjacent invocations of a subgroup, each holding
// k_dim / lanes of its rows (at most 32) in registers for the whole group of rows: the state is
// read once and written once per step, and a layer's n_heads * v_dim columns spread over many
// workgroups (delta_rule.comp keeps a head's columns in one). Per row t, with key head
// kh = h / (v_heads / k_heads) (or h % k_heads with v_tiled: llama.cpp's order, delta_rule.comp):
//   q = l2norm(q_kh) / sqrt(k_dim), k = l2norm(k_kh) (l2norm: x / sqrt(sum x^2 + 1e-6))
//   beta = sigmoid(b_h), decay = exp(neg_a_h * softplus(a_h + dt_bias_h))   (neg_a = -exp(A_log))
//   S = decay S;  delta = (v_h - S^T k) beta;  S += k delta^T;  o = S^T q
// The norms and S^T k are one sum over the column's lanes (shuffles), o another. The output is
// o itself: gated_norm.comp applies the gated RMSNorm, which needs a whole head's columns.
// Row i of the state lives in lane i % lanes, register i / lanes (adjacent lanes read adjacent
// k and q values). A sequence whose group starts at position 0 starts from S = 0.
// Bindings as delta_rule.comp's (5, the norm's weight, unread); 7 out f32 [n, v_heads * v_dim]: o.
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer Q_ { float qkv[]; };
layout(binding = 2) readonly buffer M_ { float mix[]; };
layout(binding = 3) readonly buffer A_ { float neg_a[]; };
layout(binding = 4) readonly buffer D_ { float dt_bias[]; };
layout(binding = 5) readonly buffer W_ { float nw[]; };
layout(binding = 6) buffer S_ { float S[]; };
layout(binding = 7) writeonly buffer O_ { float o[]; };

// push constants: forge__pc_delta (src/ops.c), field for field (checked against its size)
#include "pc_delta.glsl"

const uint MAXR = 32u;

// The sum of x over the column's lanes (adjacent, aligned: lanes divides the subgroup's width).
vec3 column_sum(vec3 x) {
    for (uint s = 1u; s < 8u; s <<= 1)
        if (s < pc.lanes) x += subgroupShuffleXor(x, s);
    return x;
}

void main() {
    uint L = pc.lanes, lane = gl_LocalInvocationID.x % L;
    uint col = gl_WorkGroupID.x * (64u / L) + gl_LocalInvocationID.x / L; // over all heads' columns
    uint DK = pc.k_dim, DV = pc.v_dim, KD = pc.k_heads * DK;
    bool live = col < pc.v_heads * DV; // (a dead lane still takes part in the shuffles)
    uint h = live ? col / DV : 0u, j = col % DV;
    uint kh = pc.v_tiled != 0u ? h % pc.k_heads : h / (pc.v_heads / pc.k_heads);
    uint g = gl_WorkGroupID.y, row0 = g * pc.group_rows;
    uint place = pc.table != 0u ? params.tab[TAB + 2u * row0 + 1u] : g;
    uint pos = pc.table != 0u ? params.tab[TAB + 2u * row0] : params.pos0;
    uint conv_dim = 2u * KD + pc.v_heads * DV;
    uint sb = (place * pc.v_heads + h) * DK * DV + j;
    uint R = DK / L;
    float st[MAXR];
    for (uint r = 0u; r < MAXR; r++) st[r] = (live && r < R && pos != 0u) ? S[sb + (r * L + lane) * DV] : 0.0;
    float qs = inversesqrt(float(DK));
    float nh = neg_a[h], dtb = dt_bias[h];
    for (uint t = row0; t < row0 + pc.group_rows; t++) {
        uint qb = t * conv_dim + kh * DK + lane, kb = qb + KD, mb = t * pc.mix_stride;
        float kr[MAXR], qr[MAXR];
        vec3 part = vec3(0.0); // sum k^2, sum q^2, S^T k (k unnormalized)
        for (uint r = 0u; r < MAXR; r++) {
            kr[r] = r < R ? qkv[kb + r * L] : 0.0;
            qr[r] = r < R ? qkv[qb + r * L] : 0.0;
            part += vec3(kr[r] * kr[r], qr[r] * qr[r], st[r] * kr[r]);
        }
        part = column_sum(part);
        float nk = inversesqrt(part.x + 1e-6), nq = inversesqrt(part.y + 1e-6) * qs;
        float beta = 1.0 / (1.0 + exp(-mix[mb + pc.b_off + h]));
        float ax = mix[mb + pc.a_off + h] + dtb;
        float decay = exp(nh * (ax > 20.0 ? ax : log(1.0 + exp(ax)))); // softplus, as torch's (threshold 20)
        float v = live ? qkv[t * conv_dim + 2u * KD + h * DV + j] : 0.0;
        float delta = (v - decay * part.z * nk) * beta;
        float kd = nk * delta, acc = 0.0;
        for (uint r = 0u; r < MAXR; r++) {
            st[r] = decay * st[r] + kr[r] * kd;
            acc += st[r] * qr[r];
        }
        acc = column_sum(vec3(acc, 0.0, 0.0)).x;
        if (live && lane == 0u) o[t * pc.v_heads * DV + h * DV + j] = acc * nq;
    }
    for (uint r = 0u; r < MAXR; r++)
        if (live && r < R) S[sb + (r * L + lane) * DV] = st[r];
}
