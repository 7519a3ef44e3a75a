"""The split plan on a GPU, checked on the CPU: blocks per SM from a compiled kernel's registers, shared memory and
warps, and the split count that fills the SMs in whole waves (the device calls stubbed)."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvplan.kernels import common  # noqa: E402


def test_occupancy():
    # the bf16 decode kernel on an H100: 108 registers x 32 = 3,456 a warp, allocated as 3,584 (14 x 256); 4 warps
    # 14,336: 65,536 / 14,336 = 4 by registers; 71,680 B of shared memory + 1 KB: 233,472 / 72,704 = 3; 2,048 /
    # 128 threads = 16: 3 blocks
    assert common.occupancy(108, 71680, 4) == 3
    # 126 registers: 4,032 a warp, 4,096 allocated; 16,384 a block: 4; 55,296 + 1,024 B: 233,472 / 56,320 = 4
    assert common.occupancy(126, 55296, 4) == 4
    # 255 registers, 8 warps: 8,160 a warp, 8,192 allocated; 65,536 a block: 1 (and never fewer than one)
    assert common.occupancy(255, 4096, 8) == 1
    assert common.occupancy(255, 4096, 16) == 1
    # 16 registers, no shared memory, 4 warps: 65,536 / 2,048 = 32 by registers, 2,048 / 128 = 16 by threads
    assert common.occupancy(16, 0, 4) == 16


def test_wave_splits():
    # 64 sequences x 8 KV heads = 512 programs a split; 132 SMs x 3 blocks = 396 slots a wave; splits of at least
    # 256 tokens of 4,096: 16 at most. 1 split: 512 programs in 2 waves (792 slots), 65% full; 2: 1,024 in 3 waves
    # (1,188), 86%; 3 (1,408-token splits, a multiple of 64): 1,536 in 4 waves (1,584), 97%; the best, 16: 8,192
    # in 21 waves (8,316), 98.5%; 97% is within 5% of it: 3
    assert common.wave_splits(132, 3, 64, 8, 4096, 64) == 3
    # at 4 blocks per SM (528 slots) one split already fills one wave to 512 / 528 = 97%, and no count does better
    # than 97% up to 16 splits: 1
    assert common.wave_splits(132, 4, 64, 8, 4096, 64) == 1
    # 10 sequences x 8 KV heads = 80 programs a split, 528 slots: 6 splits fill one wave to 480 / 528 = 91%; 7 spill
    # 560 programs into a second, nearly empty wave (53%); 13 (320-token splits) fill two waves to 1,040 / 1,056 =
    # 98.5%, the best (12 splits of 64-token multiples come out as 11, 880 / 1,056 = 83%): 13 (4 programs an SM would have given 7)
    assert common.wave_splits(132, 4, 10, 8, 4096, 64) == 13
    # one sequence of 8 KV heads: 16 splits (the 256-token minimum) fill 128 of 396 slots, the most there is: 16
    assert common.wave_splits(132, 3, 1, 8, 4096, 64) == 16
    # 32,768 tokens: split lengths are multiples of 64, 704 tokens (11 x 64) gives 47 splits, 376 programs in one
    # wave of 396 (95%), the best; 768 tokens gives 43 (344, 87%) and 640 gives 52 (416 programs: 2 waves, 53%): 47
    assert common.wave_splits(132, 3, 1, 8, 32768, 64) == 47
    # a context shorter than two minimum splits: 1
    assert common.wave_splits(132, 3, 1, 8, 300, 64) == 1


def test_split_plan_on_a_gpu(monkeypatch):
    monkeypatch.setattr(common, "sm_count", lambda device: 132)
    gpu = torch.device("cuda")
    # with the kernel's 3 blocks per SM: 3 splits of 1,408 tokens (4,096 / 3 = 1,366, rounded up to 22 x 64)
    assert common.split_plan(64, 8, 4096, 64, gpu, blocks_per_sm=3) == (3, 1408)
    # not known yet: 4 blocks per SM, 1 split of the whole context
    assert common.split_plan(64, 8, 4096, 64, gpu) == (1, 4096)
    # an explicit count wins
    assert common.split_plan(64, 8, 4096, 64, gpu, splits=2, blocks_per_sm=3) == (2, 2048)
    # off the GPU: one split whatever the occupancy
    assert common.split_plan(64, 8, 4096, 64, torch.device("cpu"), blocks_per_sm=3) == (1, 4096)


def test_occupancy_is_learned_from_the_first_launch(monkeypatch):
    monkeypatch.setattr(common, "sm_limits", lambda device: dict(common._SM_DEFAULTS))
    monkeypatch.setattr(common, "_OCCUPANCY", {})
    compiled = SimpleNamespace(n_regs=108, metadata=SimpleNamespace(shared=71680, num_warps=4))
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert common.known_occupancy("k") is None
    common.remember_occupancy("k", compiled, cpu)  # off the GPU nothing is recorded
    assert common.known_occupancy("k") is None
    common.remember_occupancy("k", compiled, gpu)
    assert common.known_occupancy("k") == 3  # as in test_occupancy
    common.remember_occupancy("k", SimpleNamespace(n_regs=16, metadata=compiled.metadata), gpu)
    assert common.known_occupancy("k") == 3  # a lighter launch of the same key does not raise it
    # a heavier one lowers it: 168 registers x 32 lanes = 5,376 a warp, 21,504 a block of 4 warps; 65,536 // 21,504
    # = 3 by registers, but 2 x (98,304 + 1,024) of shared memory fit 228 KB and 3 do not: 2
    common.remember_occupancy("k", SimpleNamespace(n_regs=168, metadata=SimpleNamespace(shared=98304, num_warps=4)),
                              gpu)
    assert common.known_occupancy("k") == 2
