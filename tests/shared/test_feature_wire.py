"""A FeaturePush written by hand (shared/rpc/feature_wire.py) is the message protobuf builds."""

from __future__ import annotations

import random

from shared.engine.features import FeatureBlock
from shared.rpc.convert import feature_block_to_pb
from shared.rpc.feature_wire import encode_feature_push
from shared.rpc.gen.tandem.v1 import draft_pb2


def test_hand_written_pushes_parse_to_the_message_protobuf_builds():
    rng = random.Random(11)
    for case in range(200):
        n = rng.randint(0, 5)
        ids = [f"seq-{rng.randrange(10**9)}-é" * rng.randint(1, 30) for _ in range(n)]  # long ids: 2-byte lengths
        blocks = []
        for _ in range(n):
            dtype = rng.choice(["float16", "bfloat16", "float32"])
            rows, width = rng.randint(0, 40), rng.choice([1, 3, 576 * 3, 4096 * 3])
            size = {"float16": 2, "bfloat16": 2, "float32": 4}[dtype] * rows * width
            blocks.append(FeatureBlock(rng.choice([0, 1, 127, 128, 300000]), rows, width, dtype, rng.randbytes(size)))
        want = draft_pb2.FeaturePush(seq_ids=ids, blocks=[feature_block_to_pb(b) for b in blocks])
        data = encode_feature_push(ids, blocks)
        assert draft_pb2.FeaturePush.FromString(data) == want, case
        assert data == want.SerializeToString(), case  # field order and lengths as protobuf writes them


def test_a_push_through_shared_memory_names_the_ring_and_carries_no_rows():
    blocks = [FeatureBlock(5, 2, 3, "float16", bytes(12)), FeatureBlock(0, 1, 3, "float32", bytes(12))]
    data = encode_feature_push(["a", "b"], blocks, shared=("tandem-rows-1-ab", 64 << 20, [0, 300000]))
    msg = draft_pb2.FeaturePush.FromString(data)
    want = draft_pb2.FeaturePush(seq_ids=["a", "b"], blocks=[feature_block_to_pb(b) for b in blocks],
                                 shared=draft_pb2.SharedRows(name="tandem-rows-1-ab", capacity=64 << 20,
                                                             positions=[0, 300000]))  # fmt: skip
    for b in want.blocks:
        b.data = b""
    assert msg == want and data == want.SerializeToString()
