"""Models by Hugging Face id, against a fake Hub on 127.0.0.1 (huggingface_hub follows HF_ENDPOINT): the config is
fetched into the cache, read offline afterwards, and every failure is one line. No test reaches the internet."""

import hashlib
import http.server
import json
import math
import os
import re
import struct
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
    tokens: dict = {}  # "org/name" -> the token it needs (a gated repo whose terms that token's user accepted)
    seen: list = []  # (method, path, Range header, Authorization header)

    def _reply(self, body: bool) -> None:
        self.seen.append((self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization")))
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            if repo in self.gated:
                return self._error(403, "GatedRepo", "Access to this repo is restricted")
            if repo in self.tokens and self.headers.get("Authorization") != f"Bearer {self.tokens[repo]}":
                return self._error(401, "GatedRepo", "Access to this repo is restricted: log in")
            data = self.files.get(f"{repo}/{name}")
            if data is None:
                known = any(k.startswith(repo + "/") for k in self.files)
                return self._error(404, "EntryNotFound" if known else "RepoNotFound", "not found")
            status, part, extra = 200, data, {}
            wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if wanted:  # huggingface_hub reads a safetensors header with a range request
                first = int(wanted[1])
                last = min(int(wanted[2]) if wanted[2] else len(data) - 1, len(data) - 1)
                status, part = 206, data[first:last + 1]
                extra["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(part)))
            self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", COMMIT)
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()
            if body:
                self.wfile.write(part)
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


def _tiny_llama() -> dict:
    """A one-layer Llama-3.1 config, small enough to write its checkpoint out tensor by tensor."""
    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    cfg.update(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, head_dim=16)
    return cfg


# The tiny Llama's tensors: embed 256 x 64, lm_head 256 x 64, q 64 x 64, k and v 32 x 64, o 64 x 64, gate/up 128 x 64,
# down 64 x 128, two norms per layer and the final one (64 each): 16,384 x 2 + 4,096 x 2 + 2,048 x 2 + 8,192 x 3 + 192
TINY_EMBED = {"model.embed_tokens.weight": (256, 64), "lm_head.weight": (256, 64)}
TINY_LAYER = {"q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64), "gate": (128, 64), "up": (128, 64),
              "down": (64, 128), "n1": (64,), "n2": (64,), "nf": (64,)}
TINY_NORMS = {"n1": "F32", "n2": "F32", "nf": "F32"}
TINY_PARAMS = 16_384 * 2 + 4_096 * 2 + 2_048 * 2 + 8_192 * 3 + 64 * 3
assert TINY_PARAMS == 69_824


@pytest.fixture(scope="module")
def hub():
    tiny = json.dumps(_tiny_llama()).encode()
    # one model.safetensors whose header (a long __metadata__) needs a second range request past the first 100 kB
    single = _safetensors_bytes({**TINY_EMBED, **TINY_LAYER}, TINY_NORMS, {"format": "pt", "pad": "x" * 120_000})
    shards = {"model-00001-of-00002.safetensors": _safetensors_bytes(TINY_EMBED),
              "model-00002-of-00002.safetensors": _safetensors_bytes(TINY_LAYER, TINY_NORMS)}
    index = {"metadata": {"total_size": 0},
             "weight_map": {**{t: "model-00001-of-00002.safetensors" for t in TINY_EMBED},
                            **{t: "model-00002-of-00002.safetensors" for t in TINY_LAYER}}}
    FakeHub.files = {
        "acme/Qwen3-14B-copy/config.json": (CONFIGS / "Qwen--Qwen3-14B.config.json").read_bytes(),
        "acme/tiny-llama/config.json": tiny,
        "acme/tiny-llama/model.safetensors": single,
        "acme/tiny-llama-sharded/config.json": tiny,
        "acme/tiny-llama-sharded/model.safetensors.index.json": json.dumps(index).encode(),
        **{f"acme/tiny-llama-sharded/{name}": data for name, data in shards.items()},
        "acme/tiny-llama-private/config.json": tiny,
        "acme/tiny-llama-private/model.safetensors": single,
    }
    FakeHub.gated = {"acme/gated-model"}
    FakeHub.tokens = {"acme/tiny-llama-private": "hf_test_token"}
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


def _safetensors_bytes(tensors: dict, dtypes: dict = {}, metadata: dict | None = None) -> bytes:  # noqa: B006
    """A safetensors file whose header is real and whose data is zeros (bf16 unless `dtypes` names another)."""
    header, offset = ({"__metadata__": metadata} if metadata else {}), 0
    for name, shape in tensors.items():
        dtype = dtypes.get(name, "BF16")
        n = math.prod(shape) * {"BF16": 2, "F32": 4}[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + bytes(offset)


def _safetensors(path, tensors: dict) -> None:
    path.write_bytes(_safetensors_bytes(tensors))


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
    assert d["checkpoint_dtypes"] == {"BF16": 69_824}
    # one more tensor than the architecture has: said so
    _safetensors(tmp_path / "model-00002-of-00002.safetensors",
                 {"q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64), "gate": (128, 64), "up": (128, 64),
                  "down": (64, 128), "n1": (64,), "n2": (64,), "nf": (64,), "mtp.proj": (64, 64)})
    d = json.loads(cli("models", "show", str(tmp_path), "--json").out)
    assert d["checkpoint_params"] == 69_824 + 4_096 and d["checkpoint_agrees"].startswith("no: the checkpoint holds +4,096")

    # one tensor fewer than the architecture (down, 64 x 128): the shortfall, not a negative surplus
    _safetensors(tmp_path / "model-00002-of-00002.safetensors",
                 {"q": (64, 64), "k": (32, 64), "v": (32, 64), "o": (64, 64), "gate": (128, 64), "up": (128, 64),
                  "n1": (64,), "n2": (64,), "nf": (64,)})
    d = json.loads(cli("models", "show", str(tmp_path), "--json").out)
    assert d["checkpoint_params"] == 69_824 - 8_192
    assert d["checkpoint_agrees"].startswith("no: the checkpoint holds 8,192 fewer elements than the architecture")

    # a partial download: the index names a shard the folder lacks, so no count rather than a short one
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                        "c": "model-00003-of-00003.safetensors"}}))
    d = json.loads(cli("models", "show", str(tmp_path), "--json").out)
    assert d["checkpoint_params"] is None and "checkpoint_agrees" not in d
    assert d["checkpoint_unavailable"] == ("model.safetensors.index.json names model-00003-of-00003.safetensors, "
                                           "which the folder lacks (a partial download?)")
    # a shard cut short (7 bytes: less than its 8-byte header length): named, not passed over
    (tmp_path / "model.safetensors.index.json").unlink()
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"abcdefg")
    r = cli("models", "show", str(tmp_path))
    assert r.code == 0 and "unavailable: model-00001-of-00002.safetensors cannot be read as safetensors" in r.out
    d = json.loads(cli("models", "show", str(tmp_path), "--json").out)
    assert d["checkpoint_params"] is None and d["checkpoint_unavailable"].startswith("model-00001-of-00002.safetensors")


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


@pytest.mark.parametrize("name", ["acme/tiny-llama", "acme/tiny-llama-sharded", "acme/tiny-llama@v1"])
def test_hub_checkpoint_count_from_headers(hub, tmp_path, name):
    # the checkpoint's count from its safetensors headers on the Hub: range requests only, no weights downloaded
    repo = name.split("@")[0]
    cache = str(tmp_path / "hf")
    FakeHub.seen.clear()
    code, out, err = _kvplan(["models", "show", name, "--json"], HF_ENDPOINT=hub, HF_HUB_CACHE=cache,
                             HF_HUB_OFFLINE="0")
    assert code == 0, err
    d = json.loads(out)
    assert d["computed_params"] == d["checkpoint_params"] == TINY_PARAMS and d["checkpoint_agrees"] == "yes"
    assert d["checkpoint_dtypes"] == {"BF16": TINY_PARAMS - 192, "F32": 192}
    weights = [s for s in FakeHub.seen if s[1].endswith(".safetensors")]
    # every header is read at the commit the config came from, and every GET of a weights file is a range request
    assert weights and all(f"/{repo}/resolve/{COMMIT}/" in s[1] for s in weights)
    assert all(s[2] and s[2].startswith("bytes=") for s in weights if s[0] == "GET")
    if repo == "acme/tiny-llama":  # its 120 kB header: the first 100 kB, then the rest
        (n,) = struct.unpack("<Q", FakeHub.files["acme/tiny-llama/model.safetensors"][:8])
        assert n > 100_000
        assert [s[2] for s in weights if s[0] == "GET"] == ["bytes=0-100000", f"bytes=8-{n + 7}"]
    else:
        assert {s[1].rsplit("/", 1)[1] for s in weights if s[0] == "GET"} == {
            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert not list((tmp_path / "hf").rglob("*.safetensors"))
    # offline and with the Hub out of reach, a second run still shows the count, from kvplan's cache
    code, out, err = _kvplan(["models", "show", name], HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=cache,
                             HF_HUB_OFFLINE="1", COLUMNS="200")
    assert code == 0, err
    assert "69,824" in out and "unavailable" not in out
    rows = dict(line.strip().split(None, 1) for line in out.splitlines() if len(line.split(None, 1)) == 2)
    assert rows["checkpoint_params"] == rows["computed_params"] == "69,824" and rows["checkpoint_agrees"] == "yes"


def test_hub_checkpoint_offline_without_headers(hub, tmp_path):
    # the config fetched by `capacity` (which reads no headers), then `models show` offline: the count is
    # unavailable, said so, and the command still succeeds
    cache = str(tmp_path / "hf")
    FakeHub.seen.clear()
    code, out, err = _kvplan(["capacity", "acme/tiny-llama", "--gpu", "h100"], HF_ENDPOINT=hub, HF_HUB_CACHE=cache,
                             HF_HUB_OFFLINE="0")
    assert code == 0, err
    assert not [s for s in FakeHub.seen if s[1].endswith(".safetensors")]
    code, out, err = _kvplan(["models", "show", "acme/tiny-llama", "--json"], HF_ENDPOINT="http://127.0.0.1:9",
                             HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1")
    assert code == 0, err
    d = json.loads(out)
    assert d["checkpoint_params"] is None and "checkpoint_agrees" not in d
    assert d["checkpoint_unavailable"].startswith("HF_HUB_OFFLINE is set and its safetensors headers were not read")
    code, out, err = _kvplan(["models", "show", "acme/tiny-llama"], HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1",
                             COLUMNS="200")
    assert code == 0 and "Traceback" not in err
    assert [line for line in out.splitlines() if "checkpoint_params" in line and "unavailable: HF_HUB_OFFLINE" in line]


def test_hub_checkpoint_without_safetensors(hub, tmp_path):
    # a repo with no model.safetensors nor index: said in one line, the model still shown
    code, out, err = _kvplan(["models", "show", "acme/Qwen3-14B-copy", "--json"], HF_ENDPOINT=hub,
                             HF_HUB_CACHE=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    assert code == 0 and "Traceback" not in err, err
    d = json.loads(out)
    assert d["checkpoint_params"] is None and d["computed_params"] > 14e9
    assert d["checkpoint_unavailable"] == ("'acme/Qwen3-14B-copy' has no safetensors weights (model.safetensors or "
                                           "model.safetensors.index.json)")


def test_hub_checkpoint_with_token(hub, tmp_path):
    # a gated repo: refused in one line without HF_TOKEN; with it, every request carries it, the headers' too
    env = dict(HF_ENDPOINT=hub, HF_HUB_CACHE=str(tmp_path / "hf"), HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="0")
    code, out, err = _kvplan(["models", "show", "acme/tiny-llama-private"], HF_TOKEN="", **env)
    assert code == 2 and "is gated" in err and len(err.strip().splitlines()) == 1
    FakeHub.seen.clear()
    code, out, err = _kvplan(["models", "show", "acme/tiny-llama-private", "--json"], HF_TOKEN="hf_test_token", **env)
    assert code == 0, err
    assert json.loads(out)["checkpoint_params"] == TINY_PARAMS
    mine = [s for s in FakeHub.seen if "/acme/tiny-llama-private/" in s[1]]
    assert any(s[1].endswith(".safetensors") for s in mine)
    assert all(s[3] == "Bearer hf_test_token" for s in mine)


def test_unreachable_hub_fails_fast_and_catalog_ids_still_plan(tmp_path):
    """Nothing listens on 127.0.0.1:9: the Hub is out of reach at once. A catalog architecture is planned from the
    catalog, as without the hub extra, with a note; any other id fails in one whole line, without the retries
    huggingface_hub would spend on it."""
    import time

    env = dict(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "empty"), HF_HUB_OFFLINE="0")
    start = time.monotonic()
    code, out, err = _kvplan(["capacity", "Qwen/Qwen3-8B", "--gpu", "h100", "--json"], **env)
    assert code == 0, err
    r = json.loads(out)
    # the catalog's Qwen3-8B: 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 147,456 B per token
    assert r["kv_bytes_per_token"] == 36 * 8 * 128 * 2 * 2
    assert any(n.startswith("'Qwen/Qwen3-8B' planned as the catalog's Qwen3-8B (the same architecture); the Hub "
                            "cannot be reached (127.0.0.1:9: ") for n in r["notes"])
    code, out, err = _kvplan(["capacity", "acme/Qwen3-14B-copy", "--gpu", "h100"], **env)
    assert code == 2 and err.startswith("kvplan: error: cannot reach the Hub for 'acme/Qwen3-14B-copy' (127.0.0.1:9: ")
    assert err.endswith("); check the network or HF_ENDPOINT, or pass a local config.json\n")
    assert time.monotonic() - start < 20  # two runs, each well under huggingface_hub's own retries (24 s)


def test_long_reasons_are_shortened_at_a_word():
    from kvplan.specs.hub import _reason

    said = _reason(ValueError("Please check your connection and try again " * 10), limit=60)
    assert said == "Please check your connection and try again Please check your..."


def test_uncached_revision_names_the_cached_ones(cli, tmp_path, monkeypatch):
    # main is cached (refs/main names its snapshot); v2 is not: the revision is what is missing, not the repo
    repo = tmp_path / "models--acme--Llama-copy"
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").write_text(
        (CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.config.json").read_text())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli("models", "show", "acme/Llama-copy@main").code == 0
    r = cli("models", "show", "acme/Llama-copy@v2")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "revision v2 of 'acme/Llama-copy' is not in the local Hugging Face cache (main is)" in r.err
    r = cli("models", "show", "acme/Other@v2")  # nothing of the repo cached: the repo is named as missing
    assert r.code == 2 and "'acme/Other' is not in the local Hugging Face cache" in r.err
