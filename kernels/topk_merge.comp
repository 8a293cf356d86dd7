#version 450
// topk_merge: stage 2 of the sampler's reduction. Merges n_chunks sorted lists of C
// candidates (topk.comp) into the global best C, in order (value descending, index
// ascending), and combines the chunks' (max, sum) into the softmax normalizer of the row:
// out[0] = (M, S) (as float bits) with S = sum_i exp((l_i - M) * inv_temp) over the whole vocabulary,
// out[1 + r] = (value, index) of the r-th best logit.
// Method: radix select on the orderable bits of the values, 8 bits a pass from the top, for
// the C-th largest value t over all chunks' lists, each thread counting a contiguous run of
// the lists; then the values above t and the ties at t in list (= index) order, each thread
// compacting its run; then a bitonic sort of the C winners. (A binary search over the 32
// bits, counting by a binary search in every list, was 256 dependent loads: 78 us a token on
// the H100; bench/RESULTS.md.)
// Workgroup y is the row (batch generation: one per sequence, each with its n_chunks lists,
// stats and output after the previous row's; inv_temp per row as in topk.comp).
// Bindings: 0 params {.., inv_temp} | 1 cand [n_chunks, C] | 2 stats [n_chunks] | 3 out [1 + C]
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
const uint MAXC = 256;
const uint BATCH = 16;   // loads of candidates a thread has in flight

layout(binding = 0) readonly buffer P_ { uint pos0; uint n_tok; uint n_penalty; float penalty; float inv_temp; uint words[]; } params;
layout(binding = 1) readonly buffer C_ { uvec2 cand[]; };  // (value bits, index)
layout(binding = 2) readonly buffer S_ { vec2 stats[]; };
layout(binding = 3) writeonly buffer O_ { uvec2 outv[]; }; // [0] = (M bits, S bits), then (value bits, index)

layout(push_constant) uniform PC { uint n_chunks, C, temp_word; } pc;

shared uint cnt[256];
shared uint eqc[256];
shared float red[256];
shared float wv[MAXC];
shared uint wi[MAXC];
shared uint hist[256];
shared uint sel_prefix, sel_need;
uint cb; // the row's first chunk

// float -> uint preserving order (-inf smallest)
uint key(float v) {
    uint b = floatBitsToUint(v);
    return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}

void main() {
    uint tid = gl_LocalInvocationID.x, row = gl_WorkGroupID.y, ob = row * (1u + pc.C);
    cb = row * pc.n_chunks;
    float inv_temp = pc.temp_word != 0u ? uintBitsToFloat(params.words[pc.temp_word - 5u + row]) : params.inv_temp;
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
    // t = the C-th largest key of the row's n_chunks * C candidates: keys agreeing with
    // `prefix` on the digits chosen so far, of which the best `need` are still to be found.
    // Each thread reads a contiguous run of the lists, BATCH loads in flight at a time (a load
    // per iteration left each thread waiting on one load after another: 140 us a token); a list
    // is sorted, so the digits of its keys that agree with the prefix come in runs, each one
    // atomic add (an add per key piles every thread onto the bins of the top digits).
    uint total = pc.n_chunks * pc.C, first = cb * pc.C;
    uint per = (total + 255u) / 256u, e0 = min(total, tid * per), e1 = min(total, e0 + per);
    uint prefix = 0u, need = pc.C;
    for (int shift = 24; shift >= 0; shift -= 8) {
        uint above = shift == 24 ? 0u : ~0u << uint(shift + 8); // the digits chosen so far
        hist[tid] = 0u;
        barrier();
        uint run_d = 0u, run_n = 0u;
        for (uint b = e0; b < e1; b += BATCH) {
            uint kk[BATCH];
            [[unroll]] for (uint i = 0; i < BATCH; i++) kk[i] = cand[first + min(b + i, e1 - 1u)].x;
            [[unroll]] for (uint i = 0; i < BATCH; i++) {
                uint k = key(uintBitsToFloat(kk[i]));
                if (b + i < e1 && (k & above) == prefix) {
                    uint d = (k >> uint(shift)) & 255u;
                    if (d != run_d && run_n != 0u) {
                        atomicAdd(hist[run_d], run_n);
                        run_n = 0u;
                    }
                    run_d = d;
                    run_n++;
                }
            }
        }
        if (run_n != 0u) atomicAdd(hist[run_d], run_n);
        barrier();
        for (uint s = 1u; s < 256u; s <<= 1) { // suffix sums: hist[d] = the keys whose digit is >= d
            uint v = hist[tid] + (tid + s < 256u ? hist[tid + s] : 0u);
            barrier();
            hist[tid] = v;
            barrier();
        }
        // the digit where the count from the top reaches need (exactly one: the sums fall from
        // the prefix's keys, at least need, to 0)
        uint from_above = tid < 255u ? hist[tid + 1u] : 0u;
        if (hist[tid] >= need && from_above < need) {
            sel_prefix = prefix | (tid << uint(shift));
            sel_need = need - from_above;
        }
        barrier();
        prefix = sel_prefix;
        need = sel_need;
        barrier();
    }
    uint t = prefix;
    // winners: every key > t, then keys == t in list order until C, each thread from its run
    // at offsets from scans of the per-thread counts
    uint my_gt = 0u, my_eq = 0u;
    for (uint b = e0; b < e1; b += BATCH) {
        uint kk[BATCH];
        [[unroll]] for (uint i = 0; i < BATCH; i++) kk[i] = cand[first + min(b + i, e1 - 1u)].x;
        [[unroll]] for (uint i = 0; i < BATCH; i++) {
            uint k = key(uintBitsToFloat(kk[i]));
            if (b + i < e1) {
                my_gt += k > t ? 1u : 0u;
                my_eq += k == t ? 1u : 0u;
            }
        }
    }
    cnt[tid] = my_gt;
    eqc[tid] = my_eq;
    barrier();
    for (uint s = 1u; s < 256u; s <<= 1) { // inclusive prefix sums
        uint g = cnt[tid] + (tid >= s ? cnt[tid - s] : 0u), q = eqc[tid] + (tid >= s ? eqc[tid - s] : 0u);
        barrier();
        cnt[tid] = g;
        eqc[tid] = q;
        barrier();
    }
    uint og = cnt[tid] - my_gt, oe = cnt[255] + eqc[tid] - my_eq; // cnt[255]: all the keys above t
    for (uint e = tid; e < MAXC; e += 256u) { wv[e] = -1.0 / 0.0; wi[e] = 0xffffffffu; }
    barrier();
    for (uint b = e0; b < e1; b += BATCH) {
        uvec2 xx[BATCH];
        [[unroll]] for (uint i = 0; i < BATCH; i++) xx[i] = cand[first + min(b + i, e1 - 1u)];
        [[unroll]] for (uint i = 0; i < BATCH; i++) {
            uint k = key(uintBitsToFloat(xx[i].x));
            if (b + i < e1 && k >= t) {
                uint at = k > t ? og++ : oe++;
                if (at < pc.C) {
                    wv[at] = uintBitsToFloat(xx[i].x);
                    wi[at] = xx[i].y;
                }
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
