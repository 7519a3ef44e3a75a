"""`kvplan formats --gpu G [--engine E] [--engine-version V] [--model M]`: the support matrix, against cases worked by
hand from the engines' sources as kvplan.rules.vllm_backends, kvplan.specs.kv_formats and kvplan.rules.sglang cite
them (paths relative to the vllm package):

- the order vLLM's selector tries (platforms/cuda.py _get_backend_priorities): FLASH_ATTN, FLASHINFER, TRITON_ATTN,
  FLEX_ATTENTION for a model with K and V heads, FLASHINFER first on compute capability 10.x; for MLA,
  FLASH_ATTN_MLA, FLASHMLA, FLASHINFER_MLA, TRITON_MLA, and FLASHINFER_MLA first on 10.x;
- FlashAttention's version (v1/attention/backends/fa_utils.py get_flash_attn_version): FA2 on 8.x, FA3 on 9.x; an
  fp8 cache needs FA3 (flash_attn_supports_fp8), and from 0.25 FlashAttentionBackend.supported_kv_cache_dtypes
  lists fp8 and fp8_e4m3 only;
- FlashInferBackend: fp8, fp8_e4m3 and fp8_e5m2, heads 64/128/256, kernel blocks 16/32/64; TritonAttentionBackend:
  every fp8 name, blocks MultipleOf(16); FlexAttentionBackend: 16-bit caches only;
- the block a backend sets without --block-size (AttentionBackend.get_preferred_block_size(16)): 16 where a kernel
  block size divides 16, else the smallest kernel size (FlashMLA 64, FlashInfer MLA 32);
- SGLang's --kv-cache-dtype choices (server_args.py; mem_cache/kv_cache_dtype.py configure_kv_cache_dtype): auto,
  bf16, fp8_e4m3, fp8_e5m2, mxfp8, nvfp4 and fp4_mx_block16 (fp4_e2m1 up to 0.5.15); no float16, no vLLM
  per-token-head or TurboQuant mode.
"""

import json

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.format_support import support_matrix
from kvplan.specs.kv_formats import CATALOG, kv_format

SPARSE = "tests/fixtures/hf-corpus/deepseek-ai--DeepSeek-V3.2_config.json"


def _rows(gpu, engine=None, version=None, model="llama3-8b", formats=None):
    """dtype -> its row of the matrix, on one model."""
    sm = support_matrix(gpu, engine, version, [model], [kv_format(f) for f in formats] if formats else None)
    return {r.dtype: r for r in sm.models[0].rows}


def _stored_by(row):
    return [c.name for c in row.backends]


def test_a100_vllm_019_fp8_is_flashinfer():
    rows = _rows("a100", version="0.19")
    # A100 is 8.0: FLASH_ATTN is FA2, which stores no fp8 (FA3 only); FLASHINFER is next in the list and takes
    # fp8 at head 128 on 7.5 to 12.1; its kernel blocks 16/32/64 take the default 16
    for name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        r = rows[name]
        assert r.status == "served" and r.backend.name == "FLASHINFER" and r.block_size == 16, name
        # Triton stores every fp8 name too; FlashAttention (FA2) and FlexAttention (16-bit only) do not
        assert _stored_by(r) == ["FLASHINFER", "TRITON_ATTN"], name
        assert r.source.startswith("v1/attention/backends/flashinfer.py")  # the backend entry the row is read from
    # a 16-bit cache is FlashAttention's, FA2 on 8.0, and every dense backend stores it
    assert rows["auto"].backend.label == "FLASH_ATTN (FA2)" and rows["auto"].block_size == 16
    assert _stored_by(rows["auto"]) == ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]


def test_h100_vllm_033():
    rows = _rows("h100", version="0.33")
    # 9.0: FLASH_ATTN first, FA3, MultipleOf(16) -> 16
    assert rows["auto"].status == "served" and rows["auto"].backend.label == "FLASH_ATTN (FA3)"
    assert rows["auto"].block_size == 16
    # FA3 stores fp8 (e4m3) on 9.x
    assert rows["fp8"].backend.label == "FLASH_ATTN (FA3)"
    # fp8_e5m2: FlashAttention lists only fp8 and fp8_e4m3 from 0.25, so the next in the list, FlashInfer
    e5m2 = rows["fp8_e5m2"]
    assert e5m2.status == "served" and e5m2.backend.name == "FLASHINFER" and e5m2.block_size == 16
    assert "FLASH_ATTN" not in _stored_by(e5m2) and "TRITON_ATTN" in _stored_by(e5m2)
    # the per-token-head modes are the Triton backend's own (0.25 on: int4 too)
    for name in ("fp8_per_token_head", "int8_per_token_head", "int4_per_token_head"):
        assert rows[name].backend.name == "TRITON_ATTN" and _stored_by(rows[name]) == ["TRITON_ATTN"], name
    # TurboQuant's presets run on its own backend (blocks 16/32/64/128 -> 16)
    assert rows["turboquant_k3v4_nc"].backend.name == "TURBOQUANT" and rows["turboquant_k3v4_nc"].block_size == 16


def test_fp8_e5m2_on_flash_attention_until_025():
    # vLLM 0.20's FlashAttention takes every quantized cache on FA3 (is_quantized_kv_cache), but its forward reads
    # fp8/fp8_e4m3 only (get_fp8_dtype_for_flashattn raises for fp8_e5m2): the selector picks it and vLLM fails at
    # start, a what-if with no backend whose reason names the one --attention-backend can run (FlashInfer, Triton)
    r = _rows("h100", version="0.20", formats=["fp8_e5m2"])["fp8_e5m2"]
    assert r.status == "what-if" and r.backend.name == "none" and _stored_by(r) == ["FLASHINFER", "TRITON_ATTN"]
    assert "picks FLASH_ATTN (FA3)" in r.reason and r.reason.endswith("--attention-backend FLASHINFER serves it")
    # 0.25 narrows it to fp8 and fp8_e4m3, so the same H100 moves fp8_e5m2 to FlashInfer
    for version in ("0.25", "0.30", "0.33"):
        r = _rows("h100", version=version, formats=["fp8_e5m2"])["fp8_e5m2"]
        assert r.backend.name == "FLASHINFER" and "FLASH_ATTN" not in _stored_by(r), version


def test_b200_puts_flashinfer_first():
    rows = _rows("b200", version="0.33", formats=["auto", "nvfp4"])
    # 10.x: the list starts with FLASHINFER
    assert rows["auto"].backend.name == "FLASHINFER" and rows["auto"].block_size == 16
    # NVFP4 is written with the GPU's FP4 support (10.0 on): served there, through FlashInfer's TRTLLM kernels
    assert rows["nvfp4"].status == "served" and rows["nvfp4"].backend.name == "FLASHINFER"


def test_mla_on_h100_and_b200():
    h100 = _rows("h100", version="0.33", model="deepseek-v3", formats=["auto", "fp8", "fp8_e5m2"])
    # 9.x MLA list: FLASH_ATTN_MLA (FA3, 16-bit caches only; MultipleOf(16) -> 16) ...
    assert h100["auto"].backend.name == "FLASH_ATTN_MLA" and h100["auto"].block_size == 16
    # ... so fp8 goes to FlashMLA (fp8/fp8_e4m3 on 9.x and 10.x), whose only kernel block is 64
    assert h100["fp8"].backend.name == "FLASHMLA" and h100["fp8"].block_size == 64
    # no MLA backend lists fp8_e5m2: vLLM refuses to start, kvplan plans it as a what-if and says which it tried
    assert h100["fp8_e5m2"].status == "what-if" and h100["fp8_e5m2"].backend.name == "none"
    assert "no attention backend for fp8_e5m2" in h100["fp8_e5m2"].reason and not h100["fp8_e5m2"].backends
    b200 = _rows("b200", version="0.33", model="deepseek-v3", formats=["auto"])
    # 10.x: FLASHINFER_MLA (TRTLLM) first; qk_nope_head_dim 128 is one its kernel takes; blocks 32/64 -> 32
    assert b200["auto"].backend.name == "FLASHINFER_MLA" and b200["auto"].block_size == 32


def test_sparse_mla_stores_fp8_as_fp8_ds_mla():
    # DeepSeek-V3.2's sparse attention reaches only the sparse backends; vLLM stores an fp8 latent as fp8_ds_mla
    # (mla_attention.py), which FlashMLA's sparse backend keeps in blocks of 64 on 9.x
    r = _rows("h100", version="0.33", model=SPARSE, formats=["fp8"])["fp8"]
    assert r.status == "served" and r.stored_as == "fp8_ds_mla"
    assert r.backend.name == "FLASHMLA_SPARSE" and r.block_size == 64


def test_what_ifs_and_refusals_on_vllm():
    rows = _rows("h100", version="0.19")
    # KIVI is a paper's format: no engine serves it, planned as a what-if
    for name in ("kivi2", "kivi4"):
        assert rows[name].status == "what-if" and rows[name].reason == f"no engine serves {name} (a paper format)"
    # fp8_inc is Intel Gaudi's (vllm/config/cache.py)
    assert rows["fp8_inc"].status == "what-if" and "Intel Gaudi" in rows["fp8_inc"].reason
    # int4_per_token_head arrived in 0.25: vLLM 0.19 has no such --kv-cache-dtype, and kvplan refuses to plan it
    assert rows["int4_per_token_head"].status == "refused" and "does not exist in vLLM 0.19" in \
        rows["int4_per_token_head"].reason and "vLLM adds it in 0.25" in rows["int4_per_token_head"].reason
    # so are the ones 0.20 added (0.19.0's CacheDType has none of them): refused, not what-ifs
    for name in ("turboquant_k8v4", "int8_per_token_head", "fp8_per_token_head", "nvfp4"):
        assert rows[name].status == "refused" and "vLLM adds it in 0.20" in rows[name].reason, name
    assert rows["int4_per_token_head"].backend is None and not rows["int4_per_token_head"].backends
    # SGLang's own formats are what-ifs on vLLM
    assert rows["mxfp8"].status == "what-if" and rows["mxfp8"].reason.startswith("vLLM does not serve mxfp8")


def test_rocm():
    rows = _rows("mi300x", formats=["auto", "fp8_e5m2", "int8_per_token_head", "turboquant_k8v4", "nvfp4"])
    # platforms/rocm.py (AITER off): ROCM_ATTN then TRITON_ATTN; the per-token-head modes are Triton's
    assert rows["auto"].backend.name == "ROCM_ATTN" and rows["fp8_e5m2"].backend.name == "ROCM_ATTN"
    assert rows["int8_per_token_head"].backend.name == "TRITON_ATTN"
    # TURBOQUANT ends the ROCm list from 0.20 (_get_backend_priorities), with no capability check of its own
    assert rows["turboquant_k8v4"].status == "served" and rows["turboquant_k8v4"].backend.name == "TURBOQUANT"
    # no ROCm backend lists NVFP4: a what-if, said by the catalog (vLLM's NVFP4 cache is FlashInfer's, on CUDA)
    assert rows["nvfp4"].status == "what-if" and rows["nvfp4"].backend.name == "none" and not rows["nvfp4"].backends
    assert rows["nvfp4"].reason == "vLLM serves nvfp4 only on CUDA GPUs"
    # no CUDA-only backend is offered on an AMD GPU
    assert all(c.name in ("ROCM_ATTN", "TRITON_ATTN", "TURBOQUANT") for r in rows.values() for c in r.backends)
    # 0.19 has no turboquant_* --kv-cache-dtype (vllm/config/cache.py CacheDType): refused, naming 0.20
    old = _rows("mi300x", version="0.19", formats=["turboquant_k8v4"])["turboquant_k8v4"]
    assert old.status == "refused" and "vLLM adds it in 0.20" in old.reason


GPU_FAMILIES = ("a100", "l40s", "h100", "b200", "rtx-5090", "mi300x")  # 8.0, 8.9, 9.0, 10.0, 12.0, ROCm


@pytest.mark.parametrize("version", ["0.19", "0.20", "0.25", "0.28", "0.30", "0.33"])
@pytest.mark.parametrize("gpu", GPU_FAMILIES)
def test_no_what_if_names_a_backend_and_refusals_name_the_release(gpu, version):
    """On every GPU family and release: a what-if has no selector's backend (the catalog's word and the attention
    backends' agree), and where --attention-backend could still name one the reason says so (the selector's pick
    fails at start); a served row has one; a dtype the release lacks is refused in one line naming the release
    that adds it."""
    from kvplan.rules.vllm import release_adding

    for model in ("llama3-8b", "deepseek-v3", SPARSE):
        for r in support_matrix(gpu, "vllm", version, [model]).models[0].rows:
            if r.status == "what-if":
                assert r.backend.name == "none", (model, r.dtype, r.backend)
                assert not r.backends or r.reason.endswith(f"--attention-backend {r.backends[0].name} serves it"), \
                    (model, r.dtype, r.reason)
            elif r.status == "served":
                assert r.backend.name != "none" and r.backend.name in _stored_by(r), (model, r.dtype)
            elif "does not exist in vLLM" in r.reason:
                first = release_adding(r.stored_as or r.dtype)
                assert first and r.reason.endswith(f"vLLM adds it in {first} (choose --engine-version {first} or "
                                                   f"later)") and "\n" not in r.reason, (model, r.dtype, r.reason)


def test_sglang():
    rows = _rows("h100", engine="sglang")
    # SGLang names fp8 fp8_e4m3 and bfloat16 bf16, and serves them on every GPU (no architecture check)
    assert rows["fp8"].status == "served" and rows["fp8"].engine_dtype == "fp8_e4m3"
    assert rows["bfloat16"].engine_dtype == "bf16"
    # mxfp8 needs SM100 (sglang 0.5.23 arg_groups/kv_cache_hook.py handle_mxfp8_kv_cache_compatibility raises
    # "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU")
    assert rows["mxfp8"].status == "what-if"
    assert rows["fp8"].source.startswith("sglang/srt/mem_cache/kv_cache_dtype.py")
    # dtypes SGLang does not take are refused: kvplan will not plan them on SGLang
    for name in ("float16", "fp8_per_token_head", "turboquant_k8v4", "nvfp4_4over6", "kivi2"):
        assert rows[name].status == "refused" and f"SGLang has no KV cache dtype '{name}'" in rows[name].reason, name
        assert rows[name].source == "kvplan/rules/sglang.py SGLANG_DTYPES (the dtypes SGLang takes)"
    # nvfp4 and fp4_mx_block16 are written with FP4 (10.0 on): on an H100 a what-if
    assert rows["nvfp4"].status == "what-if" and rows["fp4_mx_block16"].status == "what-if"
    # SGLang's own backend (not vLLM's list of alternatives): fa3 on Hopper for an MHA model, page 1 (0.5.23
    # arg_groups/model_override_base.py get_default_attn_backend: is_hopper_with_cuda_12_3 -> "fa3")
    assert all(not r.backends for r in rows.values())
    assert (rows["fp8"].backend.name, rows["fp8"].block_size) == ("fa3", 1)
    # fp8_e5m2 on fa3: SGLang hands it to triton ("FlashAttention3 only supports fp8_e4m3 if using FP8")
    assert rows["fp8_e5m2"].status == "served" and rows["fp8_e5m2"].backend.name == "triton"


def test_sglang_fp4_e2m1_ends_with_0_5_15():
    # 0.5.15 stores fp4_e2m1 (MHATokenToKVPoolFP4) on a B200; 0.5.16 refuses it at start (deprecated)
    assert _rows("b200", "sglang", "0.5.15", formats=["fp4_e2m1"])["fp4_e2m1"].status == "served"
    later = _rows("b200", "sglang", "0.5.16", formats=["fp4_e2m1"])["fp4_e2m1"]
    assert later.status == "refused" and "fp4_mx_block16" in later.reason
    assert later.source.startswith("sglang 0.5.15 srt/mem_cache/memory_pool.py")


def test_default_models_and_layouts():
    sm = support_matrix("h100")
    dense, mla = sm.models
    assert (dense.model, mla.model) == ("Llama-3-8B", "DeepSeek-V3")
    # every catalog format appears once per model, in the table or among those for the other layout
    for ms in sm.models:
        assert sorted([r.dtype for r in ms.rows] + list(ms.not_applicable)) == sorted(CATALOG)
    assert {"fp8_ds_mla", "nvfp4_ds_mla"} == set(dense.not_applicable)
    assert "kivi2" in mla.not_applicable and "auto" in {r.dtype for r in mla.rows}


def test_json_rows_carry_their_sources(cli):
    r = cli("formats", "--gpu", "a100", "--engine-version", "0.19", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert (data["engine"], data["engine_version"], data["gpu"]) == ("vllm", "0.19", "A100-SXM4-80GB")
    assert data["selector_source"] == "vLLM 0.19.0 platforms/cuda.py _get_backend_priorities"
    for model in data["models"]:
        for row in model["rows"]:
            assert row["status"] in ("served", "what-if", "refused")
            assert (row["reason"] is None) == (row["status"] == "served"), row
            if row["status"] == "served":  # the backend entry it is read from, a file of vLLM's
                assert row["source"] == row["backend"]["source"] and ".py" in row["source"], row
            for b in row["backends"]:
                assert b["source"].startswith("v1/attention/backends/"), b
    fp8 = next(r for r in data["models"][0]["rows"] if r["dtype"] == "fp8")
    assert fp8["backend"]["name"] == "FLASHINFER" and fp8["block_size"] == 16
    assert [c["source"] for c in fp8["catalog"]][0].startswith("vllm/v1/attention/backends/triton_attn.py")


def test_one_format_and_the_table(cli):
    r = cli("formats", "fp8_e5m2", "--gpu", "h100")
    assert r.code == 0 and r.err == ""
    assert "Llama-3-8B (GQA, head 128)" in r.out and "DeepSeek-V3 (MLA, latent 512 + 64)" in r.out
    line = next(ln for ln in r.out.splitlines() if ln.startswith(" fp8_e5m2") and "FLASHINFER" in ln)
    assert "served" in line and "TRITON_ATTN" in line


@pytest.mark.parametrize("argv, words", [
    (["--gpu", "h100", "--engine", "tgi"], "--engine tgi: choose vllm or sglang"),
    (["--gpu", "h100", "--engine-version", "1.2"], "--engine-version '1.2'"),
    (["--gpu", "h100", "--engine-version", "abc"], "--engine-version 'abc'"),
    (["--gpu", "h100", "--engine", "sglang", "--engine-version", "0.4"], "SGLang 0.5"),
    (["--gpu", "h99"], "unknown GPU 'h99'"),
    (["--gpu", "h100", "--model", "llama3-9b"], "unknown model 'llama3-9b'"),
    (["--engine", "sglang"], "add --gpu"),
    (["--model", "llama3-8b"], "add --gpu"),
    (["--gpu", "h100", "--head-dim", "64"], "--head-dim sets the byte figures"),
    (["fp8_ds_mla", "--gpu", "h100", "--model", "llama3-8b"], "applies only to MLA models"),
    (["fp7", "--gpu", "h100"], "unknown KV cache dtype 'fp7'"),
])
def test_bad_input_is_one_line_and_exit_2(cli, argv, words):
    r = cli("formats", *argv)
    assert r.code == 2 and r.out == ""
    assert r.err.startswith("kvplan: error: ") and r.err.count("\n") == 1 and words in r.err, r.err
    assert "Traceback" not in r.err


def test_no_gpu_raises_in_the_library():
    with pytest.raises(KvplanError, match="per GPU"):
        support_matrix(None)


def test_each_option_changes_the_matrix(cli):
    base = ["formats", "--gpu", "h100", "--json"]
    seen = {cli(*base).out}
    for extra in (["--model", "qwen3-8b"], ["--engine", "sglang"], ["--engine-version", "0.20"], ["--gpu", "b200"]):
        r = cli(*base, *extra)
        assert r.code == 0, (extra, r.err)
        assert r.out not in seen, extra
        seen.add(r.out)
