"""Configurations the engine refuses at start are refused by kvplan, in the engine's words (one line, exit 2).
Each rule is listed with the engine source it comes from."""

import pytest

from kvplan.app.cli import main
from kvplan.deployment import DeploymentArgs
from kvplan.errors import KvplanError

# (rule, source, deployment options, words of the refusal)
RULES = [
    ("max_num_batched_tokens >= max_num_seqs", "vllm/config/scheduler.py SchedulerConfig.verify_max_model_len",
     dict(max_num_seqs=256, max_num_batched_tokens=64),
     "vLLM refuses to start: max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (256)"),
    ("max_num_batched_tokens >= max_num_seqs, against serve's default", "vllm/config/scheduler.py "
     "SchedulerConfig.verify_max_model_len; engine/arg_utils.py get_batch_defaults", dict(max_num_seqs=9000),
     "max_num_batched_tokens (8192) must be greater than or equal to max_num_seqs (9000)"),
    ("gpu_memory_utilization in (0, 1]", "vllm/config/cache.py CacheConfig.gpu_memory_utilization Field(gt=0, le=1)",
     dict(gpu_memory_utilization=1.5), "--gpu-memory-utilization must be in (0, 1]"),
    ("max_num_seqs >= 1", "vllm/config/scheduler.py SchedulerConfig.max_num_seqs Field(ge=1)",
     dict(max_num_seqs=0), "--max-num-seqs must be positive"),
    ("max_num_batched_tokens >= 1", "vllm/config/scheduler.py SchedulerConfig.max_num_batched_tokens Field(ge=1)",
     dict(max_num_batched_tokens=0), "--max-num-batched-tokens must be positive"),
]


@pytest.mark.parametrize("rule, source, options, words", RULES, ids=[r[0] for r in RULES])
def test_rule(rule, source, options, words):
    with pytest.raises(KvplanError) as e:
        DeploymentArgs(model="llama3-8b", gpu="h100", **options).resolve()
    assert words in str(e.value)


def test_cli_refuses_in_one_line(capsys):
    assert main(["capacity", "llama3-8b", "--gpu", "h100", "--max-num-seqs", "256",
                 "--max-num-batched-tokens", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "SchedulerConfig" in err and "raise --max-num-batched-tokens to 256 or lower --max-num-seqs to 64" in err


def test_equal_is_accepted_and_the_warning_is_a_note():
    DeploymentArgs(model="llama3-8b", gpu="h100", max_num_seqs=256, max_num_batched_tokens=256).resolve()
    d = DeploymentArgs(model="llama3-8b", gpu="h100", max_num_seqs=2, max_num_batched_tokens=30000).resolve()
    assert any("exceeds max_num_seqs * max_model_len (16384)" in n for n in d.notes)
