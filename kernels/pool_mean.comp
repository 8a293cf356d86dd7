#version 450
// pool_mean: an embedding's mean pooling (forge_embed, FORGE__OUT_POOL_MEAN), the twin of
// embed.comp's row gather that the last-token and CLS poolings use. A batch is B texts
// right-padded to T rows each (classify's layout); text b's real rows are b * T .. last[b],
// last[b] from the row table, and out row b is their mean:
//   out[b, d] = sum_{t = b T}^{last[b]} x[t, d] / (last[b] - b T + 1)
// as sentence-transformers' Pooling averages the rows its attention mask keeps.
// Bindings: 0 last u32 [B] | 1 x f32 [B * T, H] (the final norm's rows) | 2 out f32 [B, H]
// One invocation per (value d, text b): workgroups (ceil(H / 64), B).
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer R_ { uint last_row[]; };
layout(binding = 1) readonly buffer X_ { float x[]; };
layout(binding = 2) writeonly buffer O_ { float o[]; };

// push constants: forge__pc_pool (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint rows_per_text, hidden; } pc;

void main() {
    uint d = gl_GlobalInvocationID.x, b = gl_WorkGroupID.y;
    if (d >= pc.hidden) return;
    uint first = b * pc.rows_per_text, last = last_row[b];
    float s = 0.0;
    for (uint t = first; t <= last; t++) s += x[t * pc.hidden + d];
    o[b * pc.hidden + d] = s / float(last - first + 1u);
}
