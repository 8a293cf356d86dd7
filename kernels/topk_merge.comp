#version 450
// topk_merge: stage 2 of the sampler's reduction. Merges n_chunks sorted lists of C
// candidates (topk.comp) into the global best C, in order (value descending, index
// ascending), and combines the chunks' (max, sum) into the softmax normalizer of the row:
// out[0] = (M, S) (as float bits) with S = sum_i exp((l_i - M) * inv_temp) over the whole vocabulary,
// out[1 + r] = (value, index) of the r-th best logit.
// Method: binary search on the orderable bits of the value for the C-th largest value t
// (each chunk list is sorted, so counting is a binary search per chunk), then the values
// above t, then ties at t in index order, then a bitonic sort of the C winners.
// inv_temp 0 means greedy (topk.comp wrote each chunk's best alone, no stats): out[1] is the best
// of the chunks' bests (value descending, index ascending), out[0] = (M, 0) with M its value, the
// rest left as it was.
// Workgroup y is the row (batch generation: one per sequence, each with its n_chunks lists,
// stats and output after the previous row's; inv_temp per row as in topk.comp).
// Bindings: 0 params {.., inv_temp} | 1 cand [n_chunks, C] | 2 stats [n_chunks] | 3 out [1 + C]
layout(local_size_x = 256) in;
const uint MAXC = 256;

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint n_penalty; float penalty; float inv_temp; uint words[]; } params;
layout(binding = 1) readonly buffer C_ { uvec2 cand[]; };  // (value bits, index)
layout(binding = 2) readonly buffer S_ { vec2 stats[]; };
layout(binding = 3) writeonly buffer O_ { uvec2 outv[]; }; // [0] = (M bits, S bits), then (value bits, index)

// push constants: the host pushes uint32_t[3] (src/forward.c), its op row's size (checked against the block's)
layout(push_constant) uniform PC { uint n_chunks, C, temp_word; } pc;

shared uint cnt[256];
shared uint eqc[256];
shared float red[256];
shared float wv[MAXC];
shared uint wi[MAXC];
shared uint base_gt;
uint cb; // the row's first chunk

// float -> uint preserving order (-inf smallest)
uint key(float v) {
    uint b = floatBitsToUint(v);
    return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}

// entries of chunk c whose key is >= t (its list is sorted, best first)
uint count_ge(uint c, uint t) {
    uint lo = 0u, hi = pc.C; // first index whose key < t
    while (lo < hi) {
        uint mid = (lo + hi) >> 1;
        if (key(uintBitsToFloat(cand[(cb + c) * pc.C + mid].x)) >= t) lo = mid + 1u; else hi = mid;
    }
    return lo;
}

void main() {
    uint tid = gl_LocalInvocationID.x, row = gl_WorkGroupID.y, ob = row * (1u + pc.C);
    cb = row * pc.n_chunks;
    float inv_temp = pc.temp_word != 0u ? uintBitsToFloat(params.words[pc.temp_word - 5u + row]) : params.inv_temp;
    if (inv_temp == 0.0) { // greedy: the best of the chunks' bests
        float bv = -1.0 / 0.0;
        uint bi = 0xffffffffu;
        for (uint c = tid; c < pc.n_chunks; c += 256u) {
            uvec2 x = cand[(cb + c) * pc.C];
            float v = uintBitsToFloat(x.x);
            if (v > bv || (v == bv && x.y < bi)) { bv = v; bi = x.y; }
        }
        wv[tid] = bv; // (MAXC = the workgroup's 256)
        wi[tid] = bi;
        barrier();
        for (uint s = 128u; s > 0u; s >>= 1) {
            if (tid < s && (wv[tid + s] > wv[tid] || (wv[tid + s] == wv[tid] && wi[tid + s] < wi[tid]))) {
                wv[tid] = wv[tid + s];
                wi[tid] = wi[tid + s];
            }
            barrier();
        }
        if (tid == 0u) { // M is the best's value
            outv[ob] = uvec2(floatBitsToUint(wv[0]), 0u);
            outv[ob + 1u] = uvec2(floatBitsToUint(wv[0]), wi[0]);
        }
        return;
    }
    // normalizer
    float m = -1.0 / 0.0;
    for (uint c = tid; c < pc.n_chunks; c += 256u) m = max(m, stats[cb + c].x);
    red[tid] = m;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] = max(red[tid], red[tid + s]);
        barrier();
    }
    float M = red[0];
    barrier();
    float sum = 0.0;
    for (uint c = tid; c < pc.n_chunks; c += 256u)
        if (stats[cb + c].x > -1.0 / 0.0) sum += stats[cb + c].y * exp((stats[cb + c].x - M) * inv_temp);
    red[tid] = sum;
    barrier();
    for (uint s = 128u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    if (tid == 0u) outv[ob] = uvec2(floatBitsToUint(M), floatBitsToUint(red[0]));
    // largest t with count(key >= t) >= C
    uint lo = 0u, hi = 0xffffffffu;
    while (lo < hi) {
        uint d = hi - lo, mid = lo + (d >> 1) + (d & 1u); // upper middle, no overflow
        uint n = 0u;
        for (uint c = tid; c < pc.n_chunks; c += 256u) n += count_ge(c, mid);
        barrier();
        cnt[tid] = n;
        barrier();
        for (uint s = 128u; s > 0u; s >>= 1) {
            if (tid < s) cnt[tid] += cnt[tid + s];
            barrier();
        }
        if (cnt[0] >= pc.C) lo = mid; else hi = mid - 1u;
    }
    uint t = lo;
    // winners: every key > t, then keys == t in chunk (= index) order until C. Each thread
    // owns a contiguous range of chunks; offsets come from a scan of the per-thread counts.
    uint per = (pc.n_chunks + 255u) / 256u, c0 = min(pc.n_chunks, tid * per), c1 = min(pc.n_chunks, c0 + per);
    uint my_gt = 0u, my_eq = 0u;
    for (uint c = c0; c < c1; c++) {
        uint gt = t == 0xffffffffu ? 0u : count_ge(c, t + 1u);
        my_gt += gt;
        my_eq += count_ge(c, t) - gt;
    }
    barrier();
    cnt[tid] = my_gt;
    eqc[tid] = my_eq;
    barrier();
    if (tid == 0u) { // exclusive scans; the total of the first is the number above t
        uint a0 = 0u, a1 = 0u;
        for (uint i = 0u; i < 256u; i++) {
            uint x = cnt[i], y = eqc[i];
            cnt[i] = a0;
            eqc[i] = a1;
            a0 += x;
            a1 += y;
        }
        base_gt = a0;
    }
    for (uint e = tid; e < MAXC; e += 256u) { wv[e] = -1.0 / 0.0; wi[e] = 0xffffffffu; }
    barrier();
    uint og = cnt[tid], oe = base_gt + eqc[tid];
    for (uint c = c0; c < c1; c++) {
        uint gt = t == 0xffffffffu ? 0u : count_ge(c, t + 1u), ge = count_ge(c, t);
        for (uint e = 0u; e < ge; e++) {
            uint at = e < gt ? og++ : oe++;
            if (at < pc.C) {
                uvec2 x = cand[(cb + c) * pc.C + e];
                wv[at] = uintBitsToFloat(x.x);
                wi[at] = x.y;
            }
        }
    }
    // bitonic sort of the MAXC winners
    for (uint k = 2u; k <= MAXC; k <<= 1) {
        for (uint j = k >> 1; j > 0u; j >>= 1) {
            barrier();
            uint e = tid, p = e ^ j;
            if (p > e && e < MAXC) {
                bool first = (e & k) == 0u;
                bool pb = wv[p] > wv[e] || (wv[p] == wv[e] && wi[p] < wi[e]);
                bool eb = wv[e] > wv[p] || (wv[e] == wv[p] && wi[e] < wi[p]);
                if (first ? pb : eb) {
                    float tv = wv[e]; wv[e] = wv[p]; wv[p] = tv;
                    uint ti = wi[e]; wi[e] = wi[p]; wi[p] = ti;
                }
            }
        }
    }
    barrier();
    for (uint e = tid; e < pc.C; e += 256u) outv[ob + 1u + e] = uvec2(floatBitsToUint(wv[e]), wi[e]);
}
