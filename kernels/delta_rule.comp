#version 450
// delta_rule: a linear-attention layer's gated delta rule and gated norm (Qwen 3.5's Gated
// DeltaNet), the recurrent form: one workgroup per value head h and group of rows (one
// sequence's rows in order, as conv1d.comp groups them), the head's state S [k_dim, v_dim] in
// the state buffer (the sequence's place), read and written column by column. Per row t, with
// key head kh = h / (v_heads / k_heads) (each key head serves consecutive value heads, as
// transformers' repeat_interleave does), or kh = h % k_heads with v_tiled (llama.cpp's GGUF
// files order the value heads so, for ggml's broadcast):
//   q = l2norm(q_kh) / sqrt(k_dim), k = l2norm(k_kh) (l2norm: x / sqrt(sum x^2 + 1e-6))
//   beta = sigmoid(b_h), decay = exp(neg_a_h * softplus(a_h + dt_bias_h))   (neg_a = -exp(A_log))
//   S = decay S;  delta = (v_h - S^T k) beta;  S += k delta^T;  o = S^T q
//   out_h = rmsnorm(o) * w * silu(z_h)   (RMSNormGated: eps, one weight [v_dim] for every head)
// A sequence whose group starts at position 0 starts from S = 0 (its old state is not read).
// The columns are spread over the workgroup's invocations (v_dim <= 2 * 128).
// Bindings: 0 params (as conv1d.comp: pos0, the row table at byte 64)
//           1 qkv f32 [n, conv_dim]: conv1d's output, q [k_heads, k_dim] | k [k_heads, k_dim] | v [v_heads, v_dim]
//           2 mix f32 [n, mix_stride]: the in-projection's row: z at z_off [v_heads, v_dim], b at b_off [v_heads], a at a_off
//           3 neg_a f32 [v_heads] | 4 dt_bias f32 [v_heads] | 5 w f32 [v_dim]
//           6 state f32 [places, v_heads, k_dim, v_dim] | 7 out f32 [n, v_heads * v_dim]
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint tab[]; } params;
const uint TAB = 14; // the row table at byte 64
layout(binding = 1) readonly buffer Q_ { float qkv[]; };
layout(binding = 2) readonly buffer M_ { float mix[]; };
layout(binding = 3) readonly buffer A_ { float neg_a[]; };
layout(binding = 4) readonly buffer D_ { float dt_bias[]; };
layout(binding = 5) readonly buffer W_ { float nw[]; };
layout(binding = 6) buffer S_ { float S[]; };
layout(binding = 7) writeonly buffer O_ { float o[]; };

#include "pc_delta.glsl"

const uint WG = 128u;
const uint MAXD = 256u; // FORGE__MAX_LINEAR_HEAD_DIM
shared float sq[MAXD], sk[MAXD];
shared float red[WG], red2[WG];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x, g = gl_WorkGroupID.y;
    uint DK = pc.k_dim, DV = pc.v_dim, KD = pc.k_heads * DK;
    uint kh = pc.v_tiled != 0u ? h % pc.k_heads : h / (pc.v_heads / pc.k_heads);
    uint row0 = g * pc.group_rows;
    uint place = pc.table != 0u ? params.tab[TAB + 2u * row0 + 1u] : g;
    uint pos = pc.table != 0u ? params.tab[TAB + 2u * row0] : params.pos0;
    uint conv_dim = 2u * KD + pc.v_heads * DV;
    uint sb = (place * pc.v_heads + h) * DK * DV;
    bool fresh = pos == 0u;
    float qs = inversesqrt(float(DK));
    for (uint t = row0; t < row0 + pc.group_rows; t++) {
        // q and k of the key head, L2-normed
        uint qb = t * conv_dim + kh * DK, kb = t * conv_dim + KD + kh * DK;
        float ssq = 0.0, ssk = 0.0;
        for (uint i = tid; i < DK; i += WG) {
            float qv = qkv[qb + i], kv = qkv[kb + i];
            sq[i] = qv;
            sk[i] = kv;
            ssq += qv * qv;
            ssk += kv * kv;
        }
        red[tid] = ssq;
        red2[tid] = ssk;
        barrier();
        for (uint s = WG / 2u; s > 0u; s >>= 1) {
            if (tid < s) {
                red[tid] += red[tid + s];
                red2[tid] += red2[tid + s];
            }
            barrier();
        }
        float nq = inversesqrt(red[0] + 1e-6) * qs, nk = inversesqrt(red2[0] + 1e-6);
        barrier(); // (red is read above before the norm's reduction reuses it)
        uint mb = t * pc.mix_stride;
        float beta = 1.0 / (1.0 + exp(-mix[mb + pc.b_off + h]));
        float ax = mix[mb + pc.a_off + h] + dt_bias[h];
        float sp = ax > 20.0 ? ax : log(1.0 + exp(ax)); // softplus, as torch's (threshold 20)
        float decay = exp(neg_a[h] * sp);
        // the columns of S this invocation owns: j = tid, tid + 128
        float out_j[2];
        float ss = 0.0;
        for (uint c = 0u; c < 2u; c++) {
            uint j = tid + c * WG;
            out_j[c] = 0.0;
            if (j >= DV) continue;
            float kvm = 0.0;
            if (!fresh)
                for (uint i = 0u; i < DK; i++) kvm += S[sb + i * DV + j] * sk[i];
            float vj = qkv[t * conv_dim + 2u * KD + h * DV + j];
            float delta = (vj - decay * kvm * nk) * beta;
            float acc = 0.0;
            for (uint i = 0u; i < DK; i++) {
                float k_i = sk[i] * nk;
                float s_ij = (fresh ? 0.0 : decay * S[sb + i * DV + j]) + k_i * delta;
                S[sb + i * DV + j] = s_ij;
                acc += s_ij * sq[i];
            }
            out_j[c] = acc * nq;
            ss += out_j[c] * out_j[c];
        }
        fresh = false;
        // the gated norm over the head's v_dim outputs
        red[tid] = ss;
        barrier();
        for (uint s = WG / 2u; s > 0u; s >>= 1) {
            if (tid < s) red[tid] += red[tid + s];
            barrier();
        }
        float inv = inversesqrt(red[0] / float(DV) + pc.eps);
        for (uint c = 0u; c < 2u; c++) {
            uint j = tid + c * WG;
            if (j >= DV) continue;
            float z = mix[mb + pc.z_off + h * DV + j];
            o[t * pc.v_heads * DV + h * DV + j] = out_j[c] * inv * nw[j] * (z / (1.0 + exp(-z)));
        }
        barrier(); // sq, sk and red are rewritten by the next row
    }
}
