#version 450
// topk: stage 1 of the sampler's reduction. Each workgroup takes CHUNK consecutive logits,
// sorts them (value descending, index ascending) in shared memory and writes its best C,
// with the chunk's max and sum of exp((l - max) * inv_temp) for the softmax normalizer.
// NaN counts as -inf. Stage 2 (topk_merge.comp) merges the chunks.
// inv_temp 0 means greedy: the chunk's best alone (the lowest index holding its max) in place of
// the sorted C, no stats (no normalizer is wanted); the sort was 34 us of a 128256-logit row on
// the H100, every decode token.
// Workgroup y is the row (batch generation reduces one row per sequence: logits, candidates
// and stats of row r follow those of row r - 1), whose inv_temp is word temp_word + r of the
// params buffer when temp_word is set (else the step's inv_temp).
// Bindings: 0 params {.., inv_temp} | 1 logits f32 [V] | 2 cand uvec2 {value bits, index} [n_chunks, C]
//           3 stats vec2 {max, sum} [n_chunks]
layout(local_size_x = 256) in;
const uint CHUNK = 1024;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint n_penalty; float penalty; float inv_temp; uint words[]; } params;
layout(binding = 1) readonly buffer L_ { float logits[]; };
layout(binding = 2) writeonly buffer C_ { uvec2 cand[]; };  // (floatBitsToUint(value), index)
layout(binding = 3) writeonly buffer S_ { vec2 stats[]; };

// push constants: the host pushes uint32_t[3] (src/forward.c), its op row's size (checked against the block's)
layout(push_constant) uniform PC { uint n_vocab, C, temp_word; } pc;

shared float sv[CHUNK];
shared uint si[CHUNK];
shared float red[256];
shared uint red_i[256];

// a before b in the output order
bool before(float va, uint ia, float vb, uint ib) { return va > vb || (va == vb && ia < ib); }

void main() {
    uint tid = gl_LocalInvocationID.x, chunk = gl_WorkGroupID.x, base = chunk * CHUNK;
    uint row = gl_WorkGroupID.y, slot = row * gl_NumWorkGroups.x + chunk, row0 = row * pc.n_vocab;
    float inv_temp = pc.temp_word != 0u ? uintBitsToFloat(params.words[pc.temp_word - 5u + row]) : params.inv_temp;
    float m = -1.0 / 0.0;
    for (uint e = tid; e < CHUNK; e += 256u) {
        uint i = base + e;
        float v = i < pc.n_vocab ? logits[row0 + i] : -1.0 / 0.0;
        if (isnan(v)) v = -1.0 / 0.0;
        sv[e] = v;
        si[e] = i;
        m = max(m, v);
    }
    red[tid] = m;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] = max(red[tid], red[tid + s]);
        barrier();
    }
    float cmax = red[0];
    barrier();
    if (inv_temp == 0.0) { // greedy (uniform: the row's)
        uint best = 0xffffffffu; // (all -inf: element 0, as the sort would put first)
        for (uint e = tid; e < CHUNK; e += 256u)
            if (sv[e] == cmax) best = min(best, e);
        red_i[tid] = best;
        barrier();
        for (uint s = 128u; s > 0u; s >>= 1) {
            if (tid < s) red_i[tid] = min(red_i[tid], red_i[tid + s]);
            barrier();
        }
        if (tid == 0u) cand[slot * pc.C] = uvec2(floatBitsToUint(cmax), base + red_i[0]);
        return;
    }
    float sum = 0.0;
    if (cmax > -1.0 / 0.0)
        for (uint e = tid; e < CHUNK; e += 256u) sum += exp((sv[e] - cmax) * inv_temp);
    red[tid] = sum;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    if (tid == 0u) stats[slot] = vec2(cmax, red[0]);
    // bitonic sort of CHUNK pairs, 4 compare-exchanges per thread per pass
    for (uint k = 2u; k <= CHUNK; k <<= 1) {
        for (uint j = k >> 1; j > 0u; j >>= 1) {
            barrier();
            for (uint e = tid; e < CHUNK; e += 256u) {
                uint p = e ^ j;
                if (p > e) {
                    bool desc_block = (e & k) == 0u; // first half of each k-block sorts "before"-first
                    bool swap = desc_block ? before(sv[p], si[p], sv[e], si[e]) : before(sv[e], si[e], sv[p], si[p]);
                    if (swap) {
                        float tv = sv[e]; sv[e] = sv[p]; sv[p] = tv;
                        uint ti = si[e]; si[e] = si[p]; si[p] = ti;
                    }
                }
            }
        }
    }
    barrier();
    for (uint e = tid; e < pc.C; e += 256u) cand[slot * pc.C + e] = uvec2(floatBitsToUint(sv[e]), si[e]);
}
