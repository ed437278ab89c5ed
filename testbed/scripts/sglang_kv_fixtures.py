"""Writes KV-event payloads encoded by SGLang's own event classes and encoder
(sglang 0.5.23: sglang.srt.disaggregation.kv_events, as ZmqEventPublisher
encodes a batch) into core/internal/kvevents/testdata/sglang-0.5.23/.

A real SGLang does not serve on this CPU-only machine (its wheel needs CUDA
kernels), so the payloads come from its classes, not from a running server.
Run with the sglang wheel importable (pip install --no-deps sglang==0.5.23
plus its kv_events imports: msgspec, pyzmq, pydantic, psutil, orjson, ...):

    python testbed/scripts/sglang_kv_fixtures.py OUT_DIR

Batches (page_size 4, hashes as SGLang publishes them: signed int64):
- ``tiers``: GPU pages of a run, the same pages on host memory
  (StorageMedium.CPU = "CPU_PINNED") and on the shared pool
  (StorageMedium.EXTERNAL = "EXTERNAL"), then the GPU copies removed;
- ``eagle``: a speculative-decoding (EAGLE/MTP) radix tree's pages, whose
  token_ids are bigram keys (t_j, t_j+1), as KVCacheEventRecorder writes
  them for ``node.key.is_bigram``, and an AllBlocksCleared.
"""

from __future__ import annotations

import os
import sys

import msgspec
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    StorageMedium,
)

PAGE = 4
TS = 1796172000.5


def pages(tokens, bigram=False):
    out = []
    for s in range(0, len(tokens) - (1 if bigram else 0), PAGE):
        if bigram:
            out.append([(tokens[j], tokens[j + 1]) for j in range(s, min(s + PAGE, len(tokens) - 1))])
        else:
            out.append(list(tokens[s : s + PAGE]))
    return out


def stored(hashes, parent, toks, medium):
    return BlockStored(
        block_hashes=hashes, parent_block_hash=parent, token_ids=toks, block_size=PAGE, lora_id=None, medium=medium
    )


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    enc = msgspec.msgpack.Encoder()  # what ZmqEventPublisher._publisher_thread uses
    run = list(range(1000, 1012))  # 3 pages
    hashes = [-(2**62) - 7, 4242424242424242, -1]  # signed int64, as hash_str_to_int64 returns
    flat = [t for p in pages(run) for t in p]
    tiers = KVEventBatch(
        ts=TS,
        events=[
            stored(hashes, None, flat, StorageMedium.GPU),
            BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=[], block_size=PAGE, lora_id=None,
                        medium=StorageMedium.CPU),
            BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=[], block_size=PAGE, lora_id=None,
                        medium=StorageMedium.EXTERNAL),
            BlockRemoved(block_hashes=hashes, medium=StorageMedium.GPU),
        ],
        attn_dp_rank=0,
    )  # fmt: skip
    bigram_run = list(range(2000, 2009))  # 9 tokens: 8 bigram keys, 2 pages
    bp = pages(bigram_run, bigram=True)
    eagle = KVEventBatch(
        ts=TS + 1,
        events=[stored([11, 12], None, [pair for p in bp for pair in p], StorageMedium.GPU), AllBlocksCleared()],
        attn_dp_rank=1,
    )
    for name, batch in (("tiers", tiers), ("eagle", eagle)):
        with open(os.path.join(out, f"{name}.msgpack"), "wb") as f:
            f.write(enc.encode(batch))
        print(name, len(enc.encode(batch)), "bytes")


if __name__ == "__main__":
    main(sys.argv[1])
