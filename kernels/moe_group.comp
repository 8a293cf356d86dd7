#version 450
// moe_group: the (token, choice) pairs of a mixture-of-experts step grouped by expert, for
// matmul.comp's MOE build (the prefill's expert products). From route (moe_route.comp:
// (expert, weight) per pair p = t * top_k + j) it writes into `moe`:
//   word 0: the number of tiles; from word 4: per tile (expert, first, rows, 0), rows <= bm,
//   the tiles of each expert in turn covering its pairs; from word order_off: the pairs
//   sorted by expert (within an expert in no fixed order: each pair's product is computed
//   the same whatever its tile, so results do not depend on it).
// One workgroup of 256.
// Bindings: 0 route uvec2 [n_pairs] | 1 moe u32 (out)
layout(local_size_x = 256) in;

const uint MAXE = 1024;  // forge.c FORGE__MAX_EXPERTS

layout(binding = 0) readonly buffer R_ { uvec2 route[]; };
layout(binding = 1) buffer M_ { uint moe[]; };

// push constants: forge__pc_moe_group (src/ops.c), field for field (checked against its size)
layout(push_constant) uniform PC { uint n_pairs, n_experts, bm, order_off; } pc;

shared uint cnt[MAXE];
shared uint cursor[MAXE];

void main() {
    uint tid = gl_LocalInvocationID.x;
    for (uint e = tid; e < pc.n_experts; e += 256u) cnt[e] = 0u;
    barrier();
    for (uint p = tid; p < pc.n_pairs; p += 256u) atomicAdd(cnt[min(route[p].x, pc.n_experts - 1u)], 1u);
    barrier();
    if (tid == 0u) { // offsets and tiles: a serial pass over the experts
        uint off = 0u, tiles = 0u;
        for (uint e = 0; e < pc.n_experts; e++) {
            cursor[e] = off;
            for (uint s = 0; s < cnt[e]; s += pc.bm) {
                moe[4u + 4u * tiles] = e;
                moe[5u + 4u * tiles] = off + s;
                moe[6u + 4u * tiles] = min(pc.bm, cnt[e] - s);
                moe[7u + 4u * tiles] = 0u;
                tiles++;
            }
            off += cnt[e];
        }
        moe[0] = tiles;
    }
    barrier();
    for (uint p = tid; p < pc.n_pairs; p += 256u) {
        uint slot = atomicAdd(cursor[min(route[p].x, pc.n_experts - 1u)], 1u);
        moe[pc.order_off + slot] = p;
    }
}
