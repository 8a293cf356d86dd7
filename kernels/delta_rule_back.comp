#version 450
// delta_rule_back: the backward twin of delta_rule.comp for training (its gated norm, gated
// delta rule and gates; the L2 norms of q and k: l2norm_back.comp after it), a reverse-time
// pass over the recurrent form. One workgroup per value head h and sequence g (each from a zero
// state, group_rows rows), as the forward pass, whose notation this follows: per row t
//   q = l2norm(q_kh) / sqrt(k_dim), k = l2norm(k_kh), beta = sigmoid(b), decay = exp(neg_a softplus(a + dt_bias))
//   S' = decay S_{t-1};  delta = beta (v - S'^T k);  S_t = S' + k delta^T;  o = S_t^T q
//   out = rmsnorm(o) * w * silu(z)
// With the output gradient dout, backwards in t, dS the gradient of S_t (zero after the last row):
//   the gated norm:  dy = dout w silu(z);  do = r dy - o r^3 / v_dim sum(dy o);  dz = dout o r w silu'(z)
//   dS += q do^T;  dq = S_t do;  ddelta = dS^T k;  dv = beta ddelta;  dbeta = sum ddelta (v - S'^T k)
//   dkv = -beta ddelta;  dk = dS delta + S' dkv;  dS' = dS + k dkv^T;  dg = sum dS' * S' (g = log decay)
//   dS_{t-1} = decay dS';  db = dbeta beta (1 - beta);  da = dg neg_a softplus'(a + dt_bias)
// (A_log and dt_bias are frozen: no gradient for them.) q and k belong to the key head kh (as
// delta_rule.comp picks it: h / (v_heads / k_heads), or h % k_heads with v_tiled), which serves
// several value heads: each workgroup leaves its own dq, dk, and l2norm_back sums them.
// The states: a column j of S evolves alone (S'_{:,j} and delta_j need only that column, q and
// k), so an invocation owns columns j = tid, tid + 128 (v_dim <= 256) through every pass, and
// dq, dk (sums over the columns) are taken by rows i, which read what the others wrote (the
// work buffer is coherent, with a buffer barrier before each such read). Reversing the
// recurrence by dividing by decay is unstable (decay may be tiny), so the states are recomputed
// from checkpoints: a forward pass over the sequence saves S before every `chunk` rows (n_ck
// states), then chunk by chunk from the last one, the chunk's states are recomputed from its
// checkpoint (chunk + 1 states, and each row's do, which needs o = S_t^T q) and walked back.
// Memory per (sequence, value head), in the work buffer: (n_ck + chunk + 2) k_dim v_dim + chunk
// v_dim floats, n_ck = ceil(group_rows / chunk); the host picks chunk ~ sqrt(max_seq) (for 512
// rows, 23 + 24 states of k_dim v_dim instead of 512), and nothing is kept from the forward
// pass: the recomputation costs two more passes of the recurrence (one with the chunks' states,
// one to the checkpoints) against keeping the checkpoints of every linear layer.
// Bindings: 0 qkv f32 [n, conv_dim]: conv1d's output, q [k_heads, k_dim] | k [k_heads, k_dim] | v [v_heads, v_dim]
//           1 mix f32 [n, mix_stride]: the in-projection's row: z at z_off [v_heads, v_dim], b at b_off [v_heads], a at a_off
//           2 neg_a f32 [v_heads] | 3 dt_bias f32 [v_heads] | 4 w f32 [v_dim] | 5 dout f32 [n, v_heads * v_dim]
//           6 dqkv f32 [n, conv_dim]: dv written | 7 dmix f32 [n, mix_stride]: dz, db, da written
//           8 dqk f32 [n, v_heads, 2, k_dim]: each value head's dq, dk | 9 work f32 [groups, v_heads, the floats above]
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer Q_ { float qkv[]; };
layout(binding = 1) readonly buffer M_ { float mix[]; };
layout(binding = 2) readonly buffer A_ { float neg_a[]; };
layout(binding = 3) readonly buffer D_ { float dt_bias[]; };
layout(binding = 4) readonly buffer W_ { float nw[]; };
layout(binding = 5) readonly buffer DO_ { float dout[]; };
layout(binding = 6) writeonly buffer DQ_ { float dqkv[]; };
layout(binding = 7) writeonly buffer DM_ { float dmix[]; };
layout(binding = 8) writeonly buffer DK_ { float dqk[]; };
layout(binding = 9) coherent buffer S_ { float ws[]; };

#include "pc_delta.glsl"

const uint WG = 128u;
const uint MAXD = 256u; // FORGE__MAX_LINEAR_HEAD_DIM
shared float sq[MAXD], sk[MAXD];       // the row's q (normed, scaled) and k (normed)
shared float sdo[MAXD], sdl[MAXD], sdkv[MAXD]; // do, delta and dkv of the row's columns
shared float red[WG], red2[WG];

uint tid, h, DK, DV, KD, conv_dim;

vec2 wg_sum2(float a, float b) {
    red[tid] = a;
    red2[tid] = b;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) {
            red[tid] += red[tid + s];
            red2[tid] += red2[tid + s];
        }
        barrier();
    }
    vec2 r = vec2(red[0], red2[0]);
    barrier();
    return r;
}

// Row t's q and k, normed, into sq and sk (after a barrier: the previous row's may still be read).
void load_qk(uint t) {
    memoryBarrierBuffer();
    barrier();
    uint kh = pc.v_tiled != 0u ? h % pc.k_heads : h / (pc.v_heads / pc.k_heads);
    uint qb = t * conv_dim + kh * DK, kb = t * conv_dim + KD + kh * DK;
    float ssq = 0.0, ssk = 0.0;
    for (uint i = tid; i < DK; i += WG) {
        float qv = qkv[qb + i], kv = qkv[kb + i];
        sq[i] = qv;
        sk[i] = kv;
        ssq += qv * qv;
        ssk += kv * kv;
    }
    vec2 s = wg_sum2(ssq, ssk);
    float nq = inversesqrt(s.x + 1e-6) * inversesqrt(float(DK)), nk = inversesqrt(s.y + 1e-6);
    for (uint i = tid; i < DK; i += WG) {
        sq[i] *= nq;
        sk[i] *= nk;
    }
    barrier();
}

// Row t's gates: beta, decay, and softplus's input.
void gates(uint t, out float beta, out float decay, out float ax) {
    uint mb = t * pc.mix_stride;
    beta = 1.0 / (1.0 + exp(-mix[mb + pc.b_off + h]));
    ax = mix[mb + pc.a_off + h] + dt_bias[h];
    float sp = ax > 20.0 ? ax : log(1.0 + exp(ax)); // softplus, as torch's (threshold 20)
    decay = exp(neg_a[h] * sp);
}

// One row of the recurrence on column j: from S_{t-1} at src to S_t at dst (may be src);
// returns o_j = S_t[:, j] . q.
float step_col(uint src, uint dst, uint j, float vj, float beta, float decay) {
    float kv = 0.0;
    for (uint i = 0u; i < DK; i++) kv += ws[src + i * DV + j] * sk[i];
    float delta = (vj - decay * kv) * beta, o = 0.0;
    for (uint i = 0u; i < DK; i++) {
        float s = decay * ws[src + i * DV + j] + sk[i] * delta;
        ws[dst + i * DV + j] = s;
        o += s * sq[i];
    }
    return o;
}

void main() {
    tid = gl_LocalInvocationID.x;
    h = gl_WorkGroupID.x;
    uint g = gl_WorkGroupID.y;
    DK = pc.k_dim;
    DV = pc.v_dim;
    KD = pc.k_heads * DK;
    conv_dim = 2u * KD + pc.v_heads * DV;
    uint VD = pc.v_heads * DV, C = pc.chunk, T = pc.group_rows, DKDV = DK * DV;
    uint row0 = g * T, n_ck = (T + C - 1u) / C;
    uint base = (g * pc.v_heads + h) * ((n_ck + C + 2u) * DKDV + C * DV);
    uint sc0 = base + n_ck * DKDV, dS = base + (n_ck + C + 1u) * DKDV, dOc = dS + DKDV;
    float beta, decay, ax;

    // 1. forward to the checkpoints, in dS's place
    for (uint j = tid; j < DV; j += WG)
        for (uint i = 0u; i < DK; i++) ws[dS + i * DV + j] = 0.0;
    for (uint s = 0u; s < (n_ck - 1u) * C; s++) {
        uint t = row0 + s;
        load_qk(t);
        gates(t, beta, decay, ax);
        for (uint j = tid; j < DV; j += WG) {
            if (s % C == 0u)
                for (uint i = 0u; i < DK; i++) ws[base + (s / C) * DKDV + i * DV + j] = ws[dS + i * DV + j];
            step_col(dS, dS, j, qkv[t * conv_dim + 2u * KD + h * DV + j], beta, decay);
        }
    }
    for (uint j = tid; j < DV; j += WG)
        for (uint i = 0u; i < DK; i++) {
            ws[base + (n_ck - 1u) * DKDV + i * DV + j] = ws[dS + i * DV + j]; // (zero when n_ck is 1)
            ws[dS + i * DV + j] = 0.0;
        }

    // 2. the chunks, last first
    for (uint c = n_ck; c-- > 0u;) {
        uint c0 = row0 + c * C, len = min(C, row0 + T - c0);
        // 2a. the chunk's states S_{t-1} (from its checkpoint) at sc0 + s, and each row's do, dz
        for (uint j = tid; j < DV; j += WG)
            for (uint i = 0u; i < DK; i++) ws[sc0 + i * DV + j] = ws[base + c * DKDV + i * DV + j];
        for (uint s = 0u; s < len; s++) {
            uint t = c0 + s;
            load_qk(t);
            gates(t, beta, decay, ax);
            float o[2] = {0.0, 0.0}, ss = 0.0;
            for (uint k = 0u; k < 2u; k++) {
                uint j = tid + k * WG;
                if (j >= DV) continue;
                o[k] = step_col(sc0 + s * DKDV, sc0 + (s + 1u) * DKDV, j, qkv[t * conv_dim + 2u * KD + h * DV + j], beta, decay);
                ss += o[k] * o[k];
            }
            float r = inversesqrt(wg_sum2(ss, 0.0).x / float(DV) + pc.eps);
            uint mb = t * pc.mix_stride, ob = t * VD + h * DV;
            float dy[2] = {0.0, 0.0}, sd = 0.0;
            for (uint k = 0u; k < 2u; k++) {
                uint j = tid + k * WG;
                if (j >= DV) continue;
                float z = mix[mb + pc.z_off + h * DV + j], sz = 1.0 / (1.0 + exp(-z));
                dy[k] = dout[ob + j] * nw[j] * z * sz;
                sd += dy[k] * o[k];
                dmix[mb + pc.z_off + h * DV + j] = dout[ob + j] * o[k] * r * nw[j] * sz * (1.0 + z * (1.0 - sz));
            }
            sd = wg_sum2(sd, 0.0).x;
            for (uint k = 0u; k < 2u; k++) {
                uint j = tid + k * WG;
                if (j < DV) ws[dOc + s * DV + j] = r * dy[k] - o[k] * r * r * r / float(DV) * sd;
            }
        }
        // 2b. the rows backwards
        for (uint s = len; s-- > 0u;) {
            uint t = c0 + s, sp = sc0 + s * DKDV;
            load_qk(t);
            gates(t, beta, decay, ax);
            float pb = 0.0, pdo = 0.0;
            for (uint j = tid; j < DV; j += WG) { // the columns: dS += q do^T, ddelta, dv
                float dOj = ws[dOc + s * DV + j], kv = 0.0, dd = 0.0;
                for (uint i = 0u; i < DK; i++) kv += ws[sp + i * DV + j] * sk[i];
                float vmk = qkv[t * conv_dim + 2u * KD + h * DV + j] - decay * kv, delta = beta * vmk;
                for (uint i = 0u; i < DK; i++) {
                    float d = ws[dS + i * DV + j] + sq[i] * dOj;
                    ws[dS + i * DV + j] = d;
                    dd += d * sk[i];
                }
                dqkv[t * conv_dim + 2u * KD + h * DV + j] = beta * dd;
                pb += dd * vmk;
                pdo += delta * dOj;
                sdo[j] = dOj;
                sdl[j] = delta;
                sdkv[j] = -beta * dd;
            }
            memoryBarrierBuffer();
            vec2 sums = wg_sum2(pb, pdo); // dbeta, delta . do
            for (uint i = tid; i < DK; i += WG) { // the rows: dq = S_t do, dk = dS delta + S' dkv
                float a1 = 0.0, a2 = 0.0, a3 = 0.0;
                for (uint j = 0u; j < DV; j++) {
                    float v = ws[sp + i * DV + j];
                    a1 += v * sdo[j];
                    a2 += v * sdkv[j];
                    a3 += ws[dS + i * DV + j] * sdl[j];
                }
                uint qb = ((t * pc.v_heads + h) * 2u) * DK;
                dqk[qb + i] = decay * a1 + sk[i] * sums.y;
                dqk[qb + DK + i] = a3 + decay * a2;
            }
            memoryBarrierBuffer();
            barrier();
            float pg = 0.0;
            for (uint j = tid; j < DV; j += WG) // the columns again: dS' = dS + k dkv^T, dg, dS_{t-1}
                for (uint i = 0u; i < DK; i++) {
                    float d = ws[dS + i * DV + j] + sk[i] * sdkv[j];
                    pg += d * decay * ws[sp + i * DV + j];
                    ws[dS + i * DV + j] = decay * d;
                }
            float dg = wg_sum2(pg, 0.0).x;
            if (tid == 0u) {
                uint mb = t * pc.mix_stride;
                dmix[mb + pc.b_off + h] = sums.x * beta * (1.0 - beta);
                dmix[mb + pc.a_off + h] = dg * neg_a[h] * (ax > 20.0 ? 1.0 : 1.0 / (1.0 + exp(-ax)));
            }
        }
    }
}
