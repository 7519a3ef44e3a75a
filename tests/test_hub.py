"""Models by Hugging Face id, against a fake Hub on 127.0.0.1 (huggingface_hub follows HF_ENDPOINT): the config is
fetched into the cache, read offline afterwards, and every failure is one line. No test reaches the internet."""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub(http.server.BaseHTTPRequestHandler):
    files: dict = {}  # "org/name/file" -> bytes
    gated: set = set()
    seen: list = []

    def _reply(self, body: bool) -> None:
        self.seen.append((self.command, self.path))
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            if repo in self.gated:
                return self._error(403, "GatedRepo", "Access to this repo is restricted")
            data = self.files.get(f"{repo}/{name}")
            if data is None:
                known = any(k.startswith(repo + "/") for k in self.files)
                return self._error(404, "EntryNotFound" if known else "RepoNotFound", "not found")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.end_headers()
            if body:
                self.wfile.write(data)
            return None
        return self._error(404, "EntryNotFound", "not found")

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self._reply(False)

    def do_GET(self):  # noqa: N802
        self._reply(True)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub():
    FakeHub.files = {
        "acme/Qwen3-14B-copy/config.json": (CONFIGS / "Qwen--Qwen3-14B.config.json").read_bytes(),
    }
    FakeHub.gated = {"acme/gated-model"}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def _kvplan(args, **env):
    full = {**os.environ, **env}
    r = subprocess.run([sys.executable, "-m", "kvplan", *args], env=full, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def test_fetch_then_offline(hub, tmp_path):
    cache = str(tmp_path / "hf")
    code, out, err = _kvplan(["capacity", "acme/Qwen3-14B-copy", "--gpu", "h100", "--json"],
                             HF_ENDPOINT=hub, HF_HUB_CACHE=cache, HF_HUB_OFFLINE="0")
    assert code == 0, err
    r = json.loads(out)
    # named after the repo; Qwen3-14B's 40 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 163,840 B per token
    assert r["model"] == "acme/Qwen3-14B-copy" and r["kv_bytes_per_token"] == 40 * 8 * 128 * 2 * 2
    assert list((tmp_path / "hf").glob("models--acme--Qwen3-14B-copy/snapshots/*/config.json"))
    # offline, from the cache alone
    code2, out2, err2 = _kvplan(["capacity", "acme/Qwen3-14B-copy", "--gpu", "h100", "--json"],
                                HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
    assert code2 == 0, err2
    assert json.loads(out2)["kv_tokens"] == r["kv_tokens"]


@pytest.mark.parametrize("repo, says", [
    ("acme/missing", "no repo 'acme/missing' on the Hub"),
    ("acme/gated-model", "'acme/gated-model' is gated"),
])
def test_hub_failures_are_one_line(hub, tmp_path, repo, says):
    code, out, err = _kvplan(["capacity", repo, "--gpu", "h100"], HF_ENDPOINT=hub,
                             HF_HUB_CACHE=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    assert code == 2 and says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_offline_without_a_copy_and_the_catalog_fallback(tmp_path):
    env = dict(HF_HUB_CACHE=str(tmp_path / "empty"), HF_HUB_OFFLINE="1")
    code, out, err = _kvplan(["capacity", "acme/Qwen3-14B-copy", "--gpu", "h100"], **env)
    assert code == 2 and "HF_HUB_OFFLINE" in err and len(err.strip().splitlines()) == 1
    # an id whose architecture the catalog has: planned as the catalog model, and said so
    code, out, err = _kvplan(["capacity", "Qwen/Qwen3-8B", "--gpu", "h100", "--json"], **env)
    assert code == 0, err
    r = json.loads(out)
    assert r["model"] == "Qwen3-8B" and any("planned as the catalog's Qwen3-8B" in n for n in r["notes"])


def _safetensors(path, tensors: dict) -> None:
    """A safetensors file whose header is real and whose data is zeros (bf16)."""
    import math
    import struct

    header, offset = {}, 0
    for name, shape in tensors.items():
        n = math.prod(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def test_snapshot_checkpoint_count(tmp_path, cli):
    # a snapshot folder: config.json and safetensors; the headers are read, the data never
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    cfg.update(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, head_dim=16)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # embed 256 x 64, lm_head 256 x 64, q 64 x 64, k and v 32 x 64, o 64 x 64, gate/up 128 x 64, down 64 x 128,
    # two norms per layer and the final one (64 each): 16,384 x 2 + 4,096 x 2 + 2,048 x 2 + 8,192 x 3 + 192 = 69,824
    _safetensors(tmp_path / "model-00001-of-00002.safetensors",
                 {"model.embed_tokens.weight": (256, 64), "lm_head.weight": (256, 64)})
    _safetensors(tmp_path / "model-00002-of-00002.safetensors",
                 {"q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64), "gate": (128, 64), "up": (128, 64),
                  "down": (64, 128), "n1": (64,), "n2": (64,), "nf": (64,)})
    r = cli("models", "show", str(tmp_path), "--json")
    d = json.loads(r.out)
    assert d["computed_params"] == d["checkpoint_params"] == 69_824 and d["checkpoint_agrees"] == "yes"
    # one more tensor than the architecture has: said so
    _safetensors(tmp_path / "model-00002-of-00002.safetensors",
                 {"q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64), "gate": (128, 64), "up": (128, 64),
                  "down": (64, 128), "n1": (64,), "n2": (64,), "nf": (64,), "mtp.proj": (64, 64)})
    d = json.loads(cli("models", "show", str(tmp_path), "--json").out)
    assert d["checkpoint_params"] == 69_824 + 4_096 and d["checkpoint_agrees"].startswith("no: the checkpoint holds +4,096")


def test_revision(hub, tmp_path):
    # org/name@revision: fetched at that revision, then found offline through the cache's refs/<revision>
    cache = str(tmp_path / "hf")
    code, out, err = _kvplan(["models", "show", "acme/Qwen3-14B-copy@v1", "--json"], HF_ENDPOINT=hub,
                             HF_HUB_CACHE=cache, HF_HUB_OFFLINE="0")
    assert code == 0, err
    assert (tmp_path / "hf" / "models--acme--Qwen3-14B-copy" / "refs" / "v1").read_text().strip() == COMMIT
    code, out, err = _kvplan(["models", "show", "acme/Qwen3-14B-copy@v1", "--json"], HF_HUB_CACHE=cache,
                             HF_HUB_OFFLINE="1")
    assert code == 0, err
    code, out, err = _kvplan(["models", "show", "acme/Qwen3-14B-copy@v2"], HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
    assert code == 2 and "HF_HUB_OFFLINE" in err and len(err.strip().splitlines()) == 1
