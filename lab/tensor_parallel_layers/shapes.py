"""The tensor-parallel block this study measures: a Llama-style MLP and attention projections,
hidden 2048, FFN 5632, 16 query heads and 4 key/value heads of 128, bf16; its shards' GEMM
shapes at 1, 2, 4 and 8 ranks, written as a suite file `tirx-gemm export --suite` takes."""
import json
import sys

HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 2048, 5632, 16, 4, 128
TOKENS = (1, 16, 128, 512, 4096)
WORLDS = (1, 2, 4, 8)


def shard_shapes(world: int) -> list[tuple[int, int, str]]:
    """(N, K, layer) of every GEMM one rank runs at ``world`` ranks."""
    f, q, kv = FFN // world, HEADS * HEAD_DIM // world, KV_HEADS * HEAD_DIM // world
    return [(f, HIDDEN, "gate_proj, up_proj"), (HIDDEN, f, "down_proj"),
            (q, HIDDEN, "q_proj"), (kv, HIDDEN, "k_proj, v_proj"), (HIDDEN, q, "o_proj")]


def suite(worlds=WORLDS, tokens=TOKENS) -> dict:
    seen, shapes = set(), []
    for w in worlds:
        for n, k, layer in shard_shapes(w):
            for m in tokens:
                if (m, n, k) not in seen:
                    seen.add((m, n, k))
                    shapes.append({"M": m, "N": n, "K": k, "model": "Llama-style block (hidden 2048)", "layer": layer, "all_m": False,
                                   "why": f"a shard at {w} rank(s), {m} tokens"})
    return {"name": "tensor_parallel_block", "dtypes": ["bfloat16"],
            "description": "the shards of lab/tensor_parallel_layers' block", "shapes": shapes}


if __name__ == "__main__":
    worlds = tuple(int(w) for w in sys.argv[1].split(",")) if len(sys.argv) > 1 else WORLDS
    json.dump(suite(worlds), sys.stdout, indent=1)
