"""torch's CUDA caching allocator, block by block: what a sequence of allocations and frees holds allocated and
reserved (what torch.cuda.memory_allocated counts)."""

from __future__ import annotations

from bisect import bisect_left, insort

# torch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, default settings: no expandable segments, no
# max_split_size): every request is rounded up to 512 bytes (round_size); requests up to 1 MiB (kSmallSize) come from
# 2 MiB segments of the small pool; a larger request under 10 MiB (kMinLargeAlloc) opens a 20 MiB segment
# (kLargeBuffer), a larger one a segment rounded up to 2 MiB (kRoundLarge); a cached free block is reused best-fit
# (get_free_block); and a large-pool block is split only when more than 1 MiB would be left over (should_split), so a
# tensor whose segment is at most 1 MiB bigger holds the whole segment. torch.cuda.memory_allocated counts blocks.
_MIN_BLOCK = 512
_SMALL_SIZE = 1 << 20
_LARGE_BUFFER = 20 << 20
_MIN_LARGE_ALLOC = 10 << 20
_ROUND_LARGE = 2 << 20


class CachingAllocator:
    """torch's CUDA caching allocator, block by block (see the constants above): segments, the blocks split off
    them, best-fit reuse of cached free blocks (the smallest that fits; among equal sizes the first in segment and
    address order), merging of freed neighbours, and empty_cache() returning the segments with nothing allocated in
    them. Free blocks are kept in a sorted index per pool, so a model of thousands of tensors replays quickly."""

    def __init__(self) -> None:
        self._segments: list[dict] = []  # {"id", "size", "small", "blocks": [[offset, size, allocated], ...]}
        self._where: dict[int, tuple[dict, int]] = {}  # block id -> (segment, offset)
        self._next = 0
        self._seg_ids = 0
        self._free: dict[bool, list] = {True: [], False: []}  # pool -> sorted [(size, segment id, offset)]
        self._blocks: dict[tuple[int, int], tuple[dict, list]] = {}  # (segment id, offset) -> (segment, block)

    def _index(self, seg: dict, blk: list) -> None:
        insort(self._free[seg["small"]], (blk[1], seg["id"], blk[0]))
        self._blocks[(seg["id"], blk[0])] = (seg, blk)

    def _unindex(self, seg: dict, blk: list) -> None:
        pool = self._free[seg["small"]]
        key = (blk[1], seg["id"], blk[0])
        del pool[bisect_left(pool, key)]
        del self._blocks[(seg["id"], blk[0])]

    def malloc(self, size: int) -> int:
        r = max(_MIN_BLOCK, -(-size // _MIN_BLOCK) * _MIN_BLOCK)
        small = r <= _SMALL_SIZE
        pool = self._free[small]
        j = bisect_left(pool, (r, -1, -1))
        if j < len(pool):
            seg, blk = self._blocks[pool[j][1:]]
            self._unindex(seg, blk)
        else:
            size_seg = (2 * _SMALL_SIZE if small else _LARGE_BUFFER if r < _MIN_LARGE_ALLOC
                        else -(-r // _ROUND_LARGE) * _ROUND_LARGE)
            self._seg_ids += 1
            seg = {"id": self._seg_ids, "size": size_seg, "small": small, "blocks": [[0, size_seg, False]]}
            self._segments.append(seg)
            blk = seg["blocks"][0]
        rest = blk[1] - r
        if rest >= _MIN_BLOCK if small else rest > _SMALL_SIZE:
            i = next(i for i, b in enumerate(seg["blocks"]) if b[0] == blk[0])
            tail = [blk[0] + r, rest, False]
            seg["blocks"].insert(i + 1, tail)
            blk[1] = r
            self._index(seg, tail)
        blk[2] = True
        self._next += 1
        self._where[self._next] = (seg, blk[0])
        return self._next

    def free(self, block: int) -> None:
        seg, offset = self._where.pop(block)
        blocks = seg["blocks"]
        i = next(i for i, blk in enumerate(blocks) if blk[0] == offset)
        blocks[i][2] = False
        if i + 1 < len(blocks) and not blocks[i + 1][2]:
            self._unindex(seg, blocks[i + 1])
            blocks[i][1] += blocks.pop(i + 1)[1]
        if i > 0 and not blocks[i - 1][2]:
            self._unindex(seg, blocks[i - 1])
            blocks[i - 1][1] += blocks.pop(i)[1]
            i -= 1
        self._index(seg, blocks[i])

    def empty_cache(self) -> None:
        for seg in self._segments:
            if not any(blk[2] for blk in seg["blocks"]):
                for blk in seg["blocks"]:
                    self._unindex(seg, blk)
        self._segments = [seg for seg in self._segments if any(blk[2] for blk in seg["blocks"])]

    @property
    def allocated(self) -> int:
        return sum(blk[1] for seg in self._segments for blk in seg["blocks"] if blk[2])

    @property
    def reserved(self) -> int:
        return sum(seg["size"] for seg in self._segments)

    @property
    def largest_free_block(self) -> int:
        return max((blk[1] for seg in self._segments for blk in seg["blocks"] if not blk[2]), default=0)


def allocated_bytes(sizes) -> int:
    """torch.cuda.memory_allocated after allocating tensors of `sizes` bytes in turn, none freed, from an empty cache
    (the caching allocator's block sizes: see the constants above)."""
    alloc = CachingAllocator()
    for size in sizes:
        alloc.malloc(size)
    return alloc.allocated

