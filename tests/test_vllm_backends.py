"""The attention backend vLLM runs and the block it sets, against cases worked by hand from vLLM's source.

Each expectation below is read from vLLM 0.19.0 / 0.33.0's vllm/platforms/cuda.py _get_backend_priorities (the
order tried) and each backend's supported_kv_cache_dtypes, get_supported_kernel_block_sizes,
supports_compute_capability and supports_combination (vllm/v1/attention/backends/...), with
AttentionBackend.get_preferred_block_size(16): 16 where a kernel block size divides 16, else the smallest.
"""

import re

import pytest

from kvplan.deployment import DeploymentArgs
from kvplan.errors import KvplanError
from kvplan.rules.vllm_backends import (
    BACKENDS,
    PRIORITIES,
    READ,
    AttentionFacts,
    backend,
    backend_for,
    facts_of,
    flash_attn_version,
    refusals,
)
from kvplan.specs.catalog import load_gpu, load_model
from kvplan.specs.kv_formats import CATALOG

# Llama-3-8B: head_dim 128, 32 query heads; DeepSeek-V3: kv_lora_rank 512 + rope 64 = a 576-wide latent,
# qk_nope_head_dim 128, 128 heads
LLAMA = AttentionFacts(head_size=128, num_heads=32)
DSV3 = AttentionFacts(head_size=576, num_heads=16, mla=True, qk_nope_head_dim=128, qk_rope_head_dim=64,
                      kv_lora_rank=512)


def test_every_entry_names_its_source():
    for b in BACKENDS:
        path = b.source.split(" ")[0]
        assert re.fullmatch(r"(v1/attention/backends|models/deepseek_v4)/[a-z0-9_/]+\.py", path), b.source
        assert b.name.upper() == b.name and b.since in READ
    for release, table in PRIORITIES.items():
        assert release in READ
        for names in table.values():  # every name the selector tries has an entry by then
            assert all(backend(n, release) is not None for n in names), (release, names)


def test_flash_attention_versions():
    # fa_utils.get_flash_attn_version: FA3 on SM90, FA4 on SM100 (FA2 above head 128 there), FA2 on SM80
    assert flash_attn_version("0.33", (8, 0), 128) == 2
    assert flash_attn_version("0.33", (9, 0), 128) == 3
    assert flash_attn_version("0.33", (10, 0), 128) == 4
    assert flash_attn_version("0.19", (10, 0), 256) == 2  # head > 128 and != 192 -> FA2
    # 0.30+: head 256 on SM100 runs FA4's hd256 kernel, unless the cache is quantized
    assert flash_attn_version("0.33", (10, 0), 256) == 4
    assert flash_attn_version("0.33", (10, 0), 256, quantized=True) == 2
    assert flash_attn_version("0.33", (7, 5), 128) is None


@pytest.mark.parametrize("gpu, release, name, family", [
    # A100 (8.0): FA2 stores no fp8 (flash_attn_supports_fp8 needs FA3 on 9.x) -> the next in the list, FlashInfer
    # (fp8 listed, 7.5/8.0 to 12.1, head 128 listed)
    ("a100", "0.19", "FLASHINFER", "FlashInfer"), ("a100", "0.33", "FLASHINFER", "FlashInfer"),
    # H100 (9.0): FLASH_ATTN first, FA3 stores fp8
    ("h100", "0.19", "FLASH_ATTN", "FA3"), ("h100", "0.33", "FLASH_ATTN", "FA3"),
    # B200 (10.0): FlashInfer comes first on SM100
    ("b200", "0.19", "FLASHINFER", "FlashInfer"), ("b200", "0.33", "FLASHINFER", "FlashInfer"),
])
def test_llama3_8b_fp8(gpu, release, name, family):
    c = backend_for(LLAMA, load_gpu(gpu).compute_capability, "fp8", release)
    assert (c.name, c.family, c.block_size) == (name, family, 16)  # FA MultipleOf(16), FlashInfer [16, 32, 64]


def test_llama3_8b_bf16_on_a100_is_fa2():
    c = backend_for(LLAMA, "8.0", "auto", "0.33")
    assert c.label == "FLASH_ATTN (FA2)" and c.block_size == 16


@pytest.mark.parametrize("gpu, dtype, name, block", [
    # SM90: FLASH_ATTN_MLA first (FA3 MLA, 16-bit cache only, MultipleOf(16) -> 16); fp8 falls to FlashMLA ([64])
    ("h100", "auto", "FLASH_ATTN_MLA", 16), ("h100", "fp8", "FLASHMLA", 64),
    # SM100: FlashInfer MLA first (qk_nope 128 is in [64, 128, 192]; kernel blocks [32, 64] -> 32)
    ("b200", "auto", "FLASHINFER_MLA", 32), ("b200", "fp8", "FLASHINFER_MLA", 32),
    # SM80: only Triton MLA (MultipleOf(16))
    ("a100", "auto", "TRITON_MLA", 16),
])
def test_deepseek_v3(gpu, dtype, name, block):
    for release in ("0.19", "0.33"):
        c = backend_for(DSV3, load_gpu(gpu).compute_capability, dtype, release)
        assert (c.name, c.block_size) == (name, block)


def test_deepseek_v3_cutlass_when_asked():
    # --attention-backend CUTLASS_MLA on B200: [128] kernel blocks -> 128
    c = backend_for(DSV3, "10.0", "auto", "0.33", requested="cutlass_mla")
    assert (c.name, c.block_size, c.requested) == ("CUTLASS_MLA", 128, True)
    # and the model facts kvplan reads agree with the hand-written ones
    f = facts_of(load_model("deepseek-v3"), tp=8)
    assert (f.head_size, f.num_heads, f.mla, f.qk_nope_head_dim) == (576, 16, True, 128)


def test_flash_attn_refuses_e5m2_by_name():
    # 0.25+ FlashAttention lists fp8 and fp8_e4m3 only; FlashInfer takes fp8_e5m2
    with pytest.raises(KvplanError) as e:
        backend_for(LLAMA, "9.0", "fp8_e5m2", "0.33", requested="FLASH_ATTN", gpu_name="H100")
    msg = str(e.value)
    assert "\n" not in msg and "FLASH_ATTN" in msg and "fp8_e5m2 not supported" in msg and "FLASHINFER serves" in msg
    # 0.19 took every fp8 name on FA3 (supports_kv_cache_dtype: startswith("fp8")), but FlashAttentionImpl.forward
    # views the cache through get_fp8_dtype_for_flashattn, which knows fp8 and fp8_e4m3 only: asked for, it is
    # refused as failing at start, naming the backend that runs it
    assert not refusals(backend("FLASH_ATTN", "0.19"), "0.19", (9, 0), LLAMA, "fp8_e5m2")  # the selector takes it
    with pytest.raises(KvplanError) as e:
        backend_for(LLAMA, "9.0", "fp8_e5m2", "0.19", requested="FLASH_ATTN", gpu_name="H100")
    msg = str(e.value)
    assert "\n" not in msg and "then fails at start" in msg and "Unrecognized FP8 dtype: fp8_e5m2" in msg
    assert msg.endswith("FLASHINFER serves it (choose it)")


@pytest.mark.parametrize("release, dtype, hint", [
    # 0.19: supports_kv_cache_dtype takes every fp8 name on FA3; FLASHINFER (next in the 9.x list) reads e5m2
    ("0.19", "fp8_e5m2", "; --attention-backend FLASHINFER serves it"),
    # 0.20: every quantized cache (utils/torch_utils.py is_quantized_kv_cache: fp8*, *_per_token_head, nvfp4);
    # Triton lists int8/fp8_per_token_head
    ("0.20", "fp8_e5m2", "; --attention-backend FLASHINFER serves it"),
    ("0.20", "int8_per_token_head", "; --attention-backend TRITON_ATTN serves it"),
    ("0.20", "fp8_per_token_head", "; --attention-backend TRITON_ATTN serves it"),
    # nvfp4: no 0.20 backend stores it (FlashInfer does not list it until 0.25, and then on 10.x only)
    ("0.20", "nvfp4", "; from vLLM 0.25, FLASHINFER serves it on 10.x"),
])
def test_flash_attention_takes_what_it_cannot_read_on_fa3(release, dtype, hint):
    """FlashAttention's selector check in 0.19 and 0.20 takes caches its forward then fails on
    (get_fp8_dtype_for_flashattn raises 'Unrecognized FP8 dtype'): on H100 (FA3, first in the 9.x list) vLLM picks
    it and fails at start, so kvplan plans no backend and says why, in one line."""
    with pytest.raises(KvplanError) as e:
        backend_for(LLAMA, "9.0", dtype, release, gpu_name="H100")
    msg = str(e.value)
    assert msg.startswith(f"vLLM {release}'s selector picks FLASH_ATTN (FA3) for {dtype} on H100, which then fails "
                          f"at start (flash_attn.py get_fp8_dtype_for_flashattn raises 'Unrecognized FP8 dtype: "
                          f"{dtype}')") and msg.endswith(hint) and "\n" not in msg, msg
    # fp8 and fp8_e4m3 are what it reads; on A100 FA2 refuses every quantized cache at selection (no failure)
    assert backend_for(LLAMA, "9.0", "fp8_e4m3", release).label == "FLASH_ATTN (FA3)"
    if dtype != "nvfp4":
        assert backend_for(LLAMA, "8.0", dtype, release).name != "FLASH_ATTN"


def test_attention_backend_option(cli):
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "-d", "fp8_e5m2", "--attention-backend", "FLASH_ATTN")
    assert r.code == 2 and r.err.count("\n") <= 1 and "FLASHINFER serves it" in r.err and "Traceback" not in r.err
    r = cli("capacity", "llama3-8b", "--gpu", "h100", "--engine", "sglang", "--attention-backend", "FLASH_ATTN")
    # SGLang takes --attention-backend too, in its own names (kvplan.rules.sglang_backends)
    assert r.code == 2 and "--attention-backend FLASH_ATTN: kvplan plans SGLang 0.5.23's fa3, " in r.err
    r = cli("capacity", "deepseek-v3", "--gpu", "b200", "--tp", "8", "--attention-backend", "cutlass_mla", "--json")
    assert r.code == 0, r.err
    import json

    d = json.loads(r.out)
    assert d["block_size"] == 128 and "attention backend for auto: CUTLASS_MLA (CUTLASS MLA), block 128 " \
        "(--attention-backend)" in d["notes"]
    r = cli("capacity", "llama3-8b", "--gpu", "a100", "--attention-backend", "FLASHMLA")
    assert r.code == 2 and "non-MLA not supported" in r.err


def test_sinks():
    # gpt-oss (attention sinks): A100 -> FA needs 9.0 for sinks, FlashInfer's need TRTLLM (10.x) -> Triton
    f = facts_of(load_model("gpt-oss-20b"))
    assert f.sinks and backend_for(f, "8.0", "auto", "0.33").name == "TRITON_ATTN"
    assert backend_for(f, "9.0", "auto", "0.33").label == "FLASH_ATTN (FA3)"


@pytest.mark.parametrize("model", ["llama-3-8b", "deepseek-v3"])
@pytest.mark.parametrize("gpu", ["a100", "h100", "b200"])
def test_no_format_plans_silently_on_a_backend_that_cannot_serve_it(model, gpu):
    """Every catalog format vLLM serves: either the planned backend lists it (validate_configuration finds no
    reason), or the plan says it is a what-if, or kvplan refuses it."""
    m, g = load_model(model), load_gpu(gpu)
    for name, fmt in CATALOG.items():
        if fmt.applies_to not in ("both", "mla" if m.is_mla else "mha"):
            continue
        try:
            d = DeploymentArgs(model=m, gpu=g, kv_cache_dtype=name).resolve()
        except KvplanError:
            continue
        b = d.attention_backend
        if b.name == "none":
            assert any(n.startswith("what-if:") for n in d.notes), (name, d.notes)
            continue
        entry = backend(b.name, d.engine_version)
        why = refusals(entry, d.engine_version, (int(g.compute_capability[0:-2]), 0), facts_of(m), d.kv.name)
        assert not why, (name, b.name, why)


def _selector_lines():
    """(log, head_size, kv_cache_dtype, use_mla, has_sink, chosen, potential) from vLLM 0.19.0's own startup logs
    on H100 (tests/fixtures/logs/vllm-0.19-h100: the DEBUG line platforms/cuda.py prints with the
    AttentionSelectorConfig, and its 'Using X attention backend out of potential backends: [...]')."""
    from pathlib import Path

    cfg = re.compile(r"AttentionSelectorConfig\(head_size=(\d+), dtype=[\w.]+, kv_cache_dtype=(\w+), block_size=None, "
                     r"use_mla=(\w+), has_sink=(\w+)")
    using = re.compile(r"Using (\w+) attention backend out of potential backends: \[([^\]]*)\]")
    out = []
    for log in sorted((Path(__file__).parent / "fixtures/logs/vllm-0.19-h100").glob("*.log")):
        text = log.read_text()
        c, u = cfg.search(text), using.search(text)
        if c and u:
            out.append((log.name, int(c[1]), c[2], c[3] == "True", c[4] == "True", u[1],
                        tuple(re.findall(r"'(\w+)'", u[2]))))
    return out


def test_selector_matches_vllm_019_logs():
    # vLLM 0.19.0 printed which backends were valid and which it used; the matrix must give the same list, in the
    # same order, for the same selector input on H100 (9.0)
    from kvplan.rules.vllm_backends import priorities

    cases = _selector_lines()
    assert len(cases) >= 20 and any(c[4] for c in cases)  # gpt-oss's sinks are among them
    for log, head, dtype, mla, sink, chosen, potential in cases:
        f = AttentionFacts(head_size=head, num_heads=8, mla=mla, sinks=sink)
        valid = tuple(n for n in priorities("0.19", (9, 0), f, dtype)
                      if not refusals(backend(n, "0.19"), "0.19", (9, 0), f, dtype))
        assert valid == potential, log
        assert backend_for(f, "9.0", dtype, "0.19").name == chosen, log


def test_log_import_says_when_vllm_ran_another_backend():
    # vLLM 0.19.0 on H100 ran Llama-3.1-8B on FLASH_ATTN, as the matrix plans; a log naming another backend is said
    from pathlib import Path

    from kvplan.app.log_import import import_log

    fixtures = Path(__file__).parent / "fixtures"
    log = fixtures / "logs/vllm-0.19-h100/meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--4096.log"
    text = log.read_text()
    same = import_log(text, log.name, configs=[fixtures / "configs"])
    assert not any("attention backend;" in n for n in same.notes)
    other = import_log(text.replace("Using FLASH_ATTN attention backend", "Using TRITON_ATTN attention backend"),
                       log.name, configs=[fixtures / "configs"])
    assert any(n.startswith("the log's vLLM ran the TRITON_ATTN attention backend; kvplan planned FLASH_ATTN (FA3)")
               for n in other.notes)


@pytest.mark.parametrize("gpu, dtype, tp, name, block", [
    # SM90 sparse list (0.30+): FLASH_ATTN_MLA_SPARSE (16-bit, index_topk, MultipleOf(64)) then FLASHMLA_SPARSE
    ("h100", "auto", 8, "FLASH_ATTN_MLA_SPARSE", 64), ("h100", "fp8", 8, "FLASHMLA_SPARSE", 64),
    # SM100, 16-bit: at most 16 heads per rank (128 / TP 8) puts FA4's sparse MLA first; 128 heads FlashMLA's
    ("b200", "auto", 8, "FLASH_ATTN_MLA_SPARSE_FA4", 64), ("b200", "auto", 1, "FLASHMLA_SPARSE", 64),
    # SM100, quantized: FlashInfer's sparse MLA first, but it refuses fp8_ds_mla (what vLLM stores for fp8)
    ("b200", "fp8", 8, "FLASHMLA_SPARSE", 64),
])
def test_deepseek_v32_sparse(gpu, dtype, tp, name, block):
    from pathlib import Path

    cfg = Path(__file__).parent / "fixtures/hf-corpus/deepseek-ai--DeepSeek-V3.2_config.json"
    d = DeploymentArgs(model=str(cfg), gpu=gpu, kv_cache_dtype=dtype, tp=tp).resolve()
    assert (d.attention_backend.name, d.block_size) == (name, block)
