"""What `kvplan measure` times: the timed region of every family launches kernels and nothing else (no tensor
built from host data, no copy between devices, no synchronisation), the GPU samples are queued between events
with one wait at the end, and every point records the bytes it moves. On the CPU under Triton's interpreter, the
device calls counted."""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from kvplan.kernels import bench  # noqa: E402

from kvplan.specs.calibration import DECODE_FORMATS, MB  # noqa: E402


class _HostWork:
    """Counts, outside kernel launches, every call that on a GPU copies between host and device or waits for
    the device: tensors built from host data, .to(device) / .cuda() / .cpu(), reading a value back (.item(),
    .tolist(), bool/int/float of a tensor), and torch.cuda.synchronize."""

    def __init__(self, monkeypatch):
        from triton.runtime.interpreter import InterpretedFunction

        self.calls: list[str] = []
        self.depth = 0
        mp = monkeypatch
        run = InterpretedFunction.run

        def launch(fn_self, *a, **k):  # a kernel launch: what the interpreter does inside is the GPU's work
            self.depth += 1
            try:
                return run(fn_self, *a, **k)
            finally:
                self.depth -= 1

        mp.setattr(InterpretedFunction, "run", launch)
        for name in ("tensor", "as_tensor", "from_numpy"):
            mp.setattr(torch, name, self._wrap(f"torch.{name}", getattr(torch, name)))
        mp.setattr(torch.cuda, "synchronize", self._wrap("torch.cuda.synchronize", torch.cuda.synchronize))
        for name in ("cuda", "cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__float__"):
            mp.setattr(torch.Tensor, name, self._wrap(f"Tensor.{name}", getattr(torch.Tensor, name)))
        to = torch.Tensor.to

        def counted_to(t, *a, **k):
            moves = "device" in k or any(isinstance(x, (str, torch.device, torch.Tensor)) for x in a)
            if moves and not self.depth:
                self.calls.append(f"Tensor.to{a}{k}")
            return to(t, *a, **k)

        mp.setattr(torch.Tensor, "to", counted_to)

    def _wrap(self, name, fn):
        def counted(*a, **k):
            if not self.depth:
                self.calls.append(name)
            return fn(*a, **k)
        return counted


@pytest.mark.parametrize("family", ["stream_read", "stream_copy", "gemv_bf16", "gemv_fp8"]
                         + [f"decode_{f}" for f in DECODE_FORMATS])
def test_timed_region_launches_kernels_only(family, monkeypatch):
    cpu = torch.device("cpu")
    size = 64 * 1024 if family.startswith("stream") else 256 * 1024
    fn, moved = bench.workload(family, size, cpu)
    flush = bench.flush_reader(64 * 1024, cpu)
    fn()  # the warm-up: kernels compiled, workspace filled
    host = _HostWork(monkeypatch)
    bench.time_samples(fn, flush, 2, cpu)
    assert host.calls == [] and moved >= size


def test_the_counter_sees_a_host_to_device_copy(monkeypatch):
    # the guard above is not blind: the launcher as it was (a scale tensor built on every call) is caught
    host = _HostWork(monkeypatch)
    torch.tensor([0.05], dtype=torch.float32, device="cpu")
    torch.zeros(3).to("cpu")
    assert host.calls == ["torch.tensor", "Tensor.to('cpu',){}"]


def test_gpu_samples_wait_once(monkeypatch):
    # on a GPU, every sample is flush, start event, call, end event, queued back to back; the host waits once,
    # after the last end event (events and the device mocked: the order of the calls is what is checked)
    log = []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            log.append("record")
            self.t = len(log)

        def elapsed_time(self, other):
            return float(other.t - self.t)  # ms

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(f"sleep {cycles}"), raising=False)
    times = bench.time_samples(lambda: log.append("call"), lambda: log.append("flush"), 3, torch.device("cuda"))
    assert log == ["sleep 600000"] + ["flush", "record", "call", "record"] * 3 + ["sync"]
    # each sample's events are 2 log entries apart (record, call, record): 2 "ms" = 0.002 s
    assert times == [0.002, 0.002, 0.002]


def test_flush_reads_and_leaves_its_buffer_unchanged():
    # the flush is a read: the buffer is left as it was (a write-back-free eviction), and it reads what it is sized
    cpu = torch.device("cpu")
    flush = bench.flush_reader(3 * 4096 * 4 + 8, cpu, kernel=True)  # 3 blocks of 4,096 words and 2: 4 programs
    flush()
    cell = flush.__closure__
    bufs = [c.cell_contents for c in cell if isinstance(c.cell_contents, torch.Tensor)]
    buf = max(bufs, key=lambda t: t.numel())
    assert buf.numel() == 3 * 4096 * 4 + 8 and bool((buf == 1).all())
    partial = min(bufs, key=lambda t: t.numel())
    # every program summed its words of bytes 0x01010101 = 16,843,009 (int32 wrap-around): 4,096 of them
    assert int(partial[0]) == (4096 * 16843009 + 2**31) % 2**32 - 2**31 and int(partial[3]) == 2 * 16843009


def test_decode_bytes_by_hand():
    from kvplan.kernels.layouts import slot_layout

    # bf16, head_dim 128: a slot is K and V, 2 x 128 x 2 = 512 bytes; 3 sequences of 4,096 tokens, 8 KV heads:
    # 3 x 4,096 x 8 x 512 = 50,331,648 bytes
    assert bench.decode_bytes(slot_layout("bfloat16", 128), 3, 4096, 8) == 50_331_648
    # int4 per token and head: each side 64 bytes of codes and a 4-byte scale, 136 bytes a slot:
    # 2 x 4,096 x 8 x 136 = 8,912,896
    assert slot_layout("int4_per_token_head", 128).slot_bytes == 136
    assert bench.decode_bytes(slot_layout("int4_per_token_head", 128), 2, 4096, 8) == 8_912_896
    # KIVI-2 (groups of 32 tokens, a residual window of 128): of 4,096 tokens, (4,096 - 128) // 32 x 32 = 3,968 sit
    # quantized, in slots of K codes 128 x 2 / 8 = 32 bytes, K's per-channel scale and zero (one token of the group
    # holds 128 / 32 = 4 channels' of each, fp16: 8 + 8 bytes), V codes 32 and V's scale and zero per group of 32
    # channels (4 x 2 = 8 bytes each): 32 + 16 + 32 + 16 = 96 bytes ...
    kivi = slot_layout("kivi2", 128)
    assert kivi.slot_bytes == 96
    slot = 96
    # ... and the 128 newest in the bf16 residual: K and V, 128 x 2 x 128 x 2 = 65,536 bytes per sequence and head
    assert bench.decode_bytes(kivi, 1, 4096, 8) == 8 * (3968 * slot + 65_536)
    assert bench.decode_bytes(kivi, 1, 100, 8) == 8 * 100 * 2 * 128 * 2  # shorter than the window: all residual


def test_every_decode_point_moves_at_least_its_size():
    # the points sit at or just above the plan's sizes, so the fraction of the stream read counts them
    cpu = torch.device("cpu")
    for fmt in ("int4_per_token_head", "kivi2", "bfloat16"):
        _, moved = bench.workload(f"decode_{fmt}", 1 * MB, cpu)
        assert 1 * MB <= moved < 2 * MB


def test_calls_replayed_from_a_cuda_graph(monkeypatch):
    # on a GPU a call is captured once (after a run on a side stream, as capture requires) and timed as the graph's
    # replay; a call that cannot be captured is timed as it is (the CUDA calls mocked)
    log = []

    class Graph:
        def replay(self):
            log.append("replay")

    class Capture:
        def __init__(self, graph):
            log.append("capture")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

    class Using(Capture):
        def __init__(self, stream):
            log.append("side stream")

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", Using)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("sync"))
    gpu = torch.device("cuda")
    replay = bench.as_graph(lambda: log.append("call"), gpu)
    assert log == ["side stream", "call", "capture", "call", "replay", "sync"]
    log.clear()
    replay()
    assert log == ["replay"]

    def uncapturable():
        if "capture" in log:
            raise RuntimeError("operation not permitted when stream is capturing")
        log.append("call")

    log.clear()
    fn = bench.as_graph(uncapturable, gpu)
    assert fn is uncapturable
