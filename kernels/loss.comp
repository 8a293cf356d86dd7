#version 450
// loss: the training losses over a chunk of rows of predictions, each row's loss to `loss`
// and, with flags 1, the gradient of the weighted loss written over the predictions in place
// (so [rows, vocab] logits are never kept for more than one chunk).
//   mode 0, cross-entropy: pred is a row of logits z (soft-capped by the head when softcap > 0:
//     z = c tanh(raw / c)), label y = labels[row0 + r] (-1: not counted);
//     loss = logsumexp(z) - z[y];  d raw_j = w * (softmax(z)_j - [j == y]) * (1 - (z_j / c)^2)
//   mode 1, squared error: loss = sum_j (pred_j - target_j)^2 over the row (0 for a row of weight 0);
//     d pred_j = w * 2 (pred_j - target_j) (times the soft-cap factor when pred are capped logits)
// w = weights[row0 + r]: 1 / (counted targets * accumulation steps) for cross-entropy, the same
// over the row length for squared error, 0 for rows that do not count (their gradient is 0).
// One workgroup of 256 per row (rows of the chunk: the grid may be larger).
// Bindings: 0 pred f32 [rows, n] (in/out) | 1 labels i32 [*] (mode 0) or targets f32 [*, n] (mode 1)
//           2 weights f32 [*] | 3 loss f32 [*] (out, at row0 + r)
layout(local_size_x = 256) in;

layout(binding = 0) buffer P_ { float pred[]; };
layout(binding = 1) readonly buffer L_ { int labels[]; };
layout(binding = 1) readonly buffer T_ { float targets[]; };
layout(binding = 2) readonly buffer W_ { float weights[]; };
layout(binding = 3) writeonly buffer O_ { float loss[]; };

// push constants: forge__pc_loss (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint n, row0, rows, mode, flags; float softcap; } pc;

shared float red[256];

float reduce_max(float v) {
    uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] = max(red[tid], red[tid + s]);
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

float reduce_sum(float v) {
    uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint r = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, row = pc.row0 + r;
    if (r >= pc.rows) return;
    uint base = r * pc.n;
    float w = weights[row];
    bool grad = (pc.flags & 1u) != 0u;
    if (pc.mode == 0u) {
        int y = labels[row];
        float m = -1.0 / 0.0;
        for (uint j = tid; j < pc.n; j += 256u) m = max(m, pred[base + j]);
        m = reduce_max(m);
        float s = 0.0;
        for (uint j = tid; j < pc.n; j += 256u) s += exp(pred[base + j] - m);
        s = reduce_sum(s);
        float lse = m + log(s);
        if (tid == 0u) loss[row] = y >= 0 ? lse - pred[base + uint(y)] : 0.0;
        barrier(); // pred[y] is read before it is overwritten
        if (!grad) return;
        float ws = y >= 0 ? w : 0.0;
        for (uint j = tid; j < pc.n; j += 256u) {
            float z = pred[base + j];
            float g = ws * (exp(z - lse) - (int(j) == y ? 1.0 : 0.0));
            if (pc.softcap > 0.0) g *= 1.0 - (z / pc.softcap) * (z / pc.softcap);
            pred[base + j] = g;
        }
        return;
    }
    float s = 0.0;
    for (uint j = tid; j < pc.n; j += 256u) {
        float d = pred[base + j] - targets[row * pc.n + j];
        s += d * d;
    }
    s = reduce_sum(s);
    if (tid == 0u) loss[row] = w != 0.0 ? s : 0.0; /* rows that do not count (masked, padding) add nothing */
    if (!grad) return;
    for (uint j = tid; j < pc.n; j += 256u) {
        float z = pred[base + j];
        float g = w * 2.0 * (z - targets[row * pc.n + j]);
        if (pc.softcap > 0.0) g *= 1.0 - (z / pc.softcap) * (z / pc.softcap);
        pred[base + j] = g;
    }
}
