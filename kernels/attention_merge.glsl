// attention_merge.glsl: stage 2 of the split decode attention (flash-decoding), shared by
// attention_combine.comp (its own dispatch) and attention_decode.comp (flags 128: the last
// workgroup of a head to finish merges, a dispatch and its barrier fewer a layer).
// For query t, head h, merges the partial states {m, l, acc[D]} of n runs (part + base, D + 2
// floats each; empty runs, m = -inf, trail the others: short contexts leave them):
//   out[o_base + d] = sum_s exp(m_s - M) acc_s[d] / sum_s exp(m_s - M) l_s,  M = max_s m_s
// and, with `quantize`, the head's D / 32 blocks of the o projection's int8 input (act_q8.comp's
// layout, the row of K = H * D; matvec_q8a then needs no act_q8 dispatch).
// The including kernel declares, before this file: common.glsl, readable float part[] and its vec2
// view part2[], writeonly float o[], writeonly uvec4 q8[] and vec4 q8s[] (the same int8
// binding), and MERGE_DMAX (the largest D), MERGE_SPLITS (the most runs), and MERGE_OUT,
// MERGE_OUT_LEN where a shared float array of at least MERGE_DMAX that is free by then may hold
// the merged head and the groups' sums (else one of its own).
#ifndef MERGE_OUT
shared float sm_merge_out[MERGE_DMAX];
#define MERGE_OUT sm_merge_out
#define MERGE_OUT_LEN MERGE_DMAX
#endif
shared float sm_merge_m[MERGE_SPLITS], sm_merge_w[MERGE_SPLITS];

void merge_runs(uint base, uint n, uint D, uint o_base, bool quantize, uint h, uint K) {
    uint tid = gl_LocalInvocationID.x, nt = gl_WorkGroupSize.x;
    // every run's (m, l) in one parallel load (a serial loop over up to 64 runs, each a
    // dependent L2 round trip, took 19 us a layer on the H100)
    for (uint s = tid; s < n; s += nt) {
        sm_merge_m[s] = part[base + s * (D + 2u)];
        sm_merge_w[s] = part[base + s * (D + 2u) + 1u];
    }
    barrier();
    float M = -1.0 / 0.0;
    uint runs = n;
    n = 0u; // the runs up to the last with keys
    for (uint s = 0; s < runs; s++) {
        M = max(M, sm_merge_m[s]);
        if (sm_merge_m[s] > -1.0 / 0.0) n = s + 1u;
    }
    float L = 0.0;
    for (uint s = 0; s < n; s++)
        if (sm_merge_m[s] > -1.0 / 0.0) L += exp(sm_merge_m[s] - M) * sm_merge_w[s];
    barrier(); // every thread has read the l's
    for (uint s = tid; s < n; s += nt) sm_merge_w[s] = sm_merge_m[s] > -1.0 / 0.0 ? exp(sm_merge_m[s] - M) / L : 0.0;
    barrier();
    // the weighted sum of the runs' acc, latency-bound (a few loads a thread, each an L2 round
    // trip): pairs of elements in vec2 loads, 16 of them in flight, and where a head has fewer
    // pairs than the workgroup threads, G groups of threads each take every G-th run, their sums
    // added through shared memory
    uint P = D / 2u, G = P <= nt ? min(nt / P, MERGE_OUT_LEN / D) : 1u, g = tid / P, stride = (D + 2u) / 2u;
    for (uint dp = tid % P; dp < P && g < G; dp += nt) {
        vec2 acc = vec2(0.0);
        uint at = base / 2u + 1u + dp, s = g; // (base and D + 2 are even: the acc pairs are 8-byte aligned)
        for (; s + 15u * G < n; s += 16u * G) {
            vec2 a[16];
            [[unroll]] for (uint i = 0u; i < 16u; i++) a[i] = part2[at + (s + i * G) * stride];
            [[unroll]] for (uint i = 0u; i < 16u; i++) acc += sm_merge_w[s + i * G] * a[i];
        }
        for (; s < n; s += G) acc += sm_merge_w[s] * part2[at + s * stride];
        MERGE_OUT[g * D + 2u * dp] = acc.x;
        MERGE_OUT[g * D + 2u * dp + 1u] = acc.y;
    }
    barrier();
    for (uint d = tid; d < D; d += nt) {
        float acc = MERGE_OUT[d];
        for (uint j = 1u; j < G; j++) acc += MERGE_OUT[j * D + d];
        o[o_base + d] = acc;
        MERGE_OUT[d] = acc; // (only this thread reads element d of group 0)
    }
    if (!quantize) return;
    barrier();
    uint b = tid; // this head's blocks of 32: b < D / 32
    if (b >= D / 32u) return;
    vec4 v[8];
    for (uint i = 0u; i < 8u; i++)
        v[i] = vec4(MERGE_OUT[32u * b + 4u * i], MERGE_OUT[32u * b + 4u * i + 1u], MERGE_OUT[32u * b + 4u * i + 2u],
                    MERGE_OUT[32u * b + 4u * i + 3u]);
    uint w[8];
    vec2 ds;
    quantize_q8_block(v, w, ds);
    uint gb = h * (D / 32u) + b; // the block's index in the row
    q8[2u * gb] = uvec4(w[0], w[1], w[2], w[3]);
    q8[2u * gb + 1u] = uvec4(w[4], w[5], w[6], w[7]);
    q8s[(K >> 4) + gb] = vec4(ds, 0.0, 0.0);
}
