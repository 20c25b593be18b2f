"""wam_gym/eval/fingerprint.py: every byte counts (one ulp of one norm weight, one line of a policy's
package), and the cache answers for unchanged files only (counted reads, never timings)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from wam_gym.eval import fingerprint
from wam_gym.eval.fingerprint import cache_dir, checkpoint_fingerprint, file_sha256, python_fingerprint

SAMPLES, SAMPLE_BYTES = 64, 4096  # the sampled hash this replaced: 64 windows of 4 KiB spread over a file


def tensor_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Each tensor of a safetensors file -> its bytes' (start, end) in the file."""
    with open(path, "rb") as f:
        header_len = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_len))
    base = 8 + header_len
    return {name: (base + t["data_offsets"][0], base + t["data_offsets"][1])
            for name, t in header.items() if name != "__metadata__"}


def unsampled(path: Path) -> list[str]:
    """The tensors no window of the old sampled hash touched: a change there left it as it was."""
    size = path.stat().st_size
    windows = [(size * i // SAMPLES, size * i // SAMPLES + SAMPLE_BYTES) for i in range(SAMPLES)]
    return [name for name, (start, end) in tensor_spans(path).items()
            if all(end <= low or start >= high for low, high in windows)]


def nudge(path: Path, tensor: str) -> None:
    """Change ``tensor``'s first element by one ulp (its lowest mantissa bit), in place."""
    start, _ = tensor_spans(path)[tensor]
    with open(path, "r+b") as f:
        f.seek(start)
        low = f.read(1)[0]
        f.seek(start)
        f.write(bytes([low ^ 1]))


def nudge_a_norm(ckpt: Path) -> str:
    """Move one norm weight of the transformer one ulp where the old sampler never read; the tensor's name."""
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    name = next(n for n in unsampled(weights) if "norm" in n)
    nudge(weights, name)
    return name


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test starts with an empty cache of its own."""
    monkeypatch.setenv("WAM_GYM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The files read in full (hashed), in order."""
    seen: list[str] = []
    digest = fingerprint._digest

    def counted(f):
        seen.append(f.name)
        return digest(f)

    monkeypatch.setattr(fingerprint, "_digest", counted)
    return seen


@pytest.fixture
def ckpt(tmp_path) -> Path:
    """A checkpoint of several tensors: big ones, and norm weights the old sampler's windows skip."""
    rng = np.random.default_rng(0)
    root = tmp_path / "ckpt"
    (root / "transformer").mkdir(parents=True)
    tensors = {}
    for i in range(12):
        tensors[f"blocks.{i}.weight"] = rng.standard_normal((200 + 17 * i, 256), dtype=np.float32)
        tensors[f"blocks.{i}.norm.weight"] = np.ones(256, np.float32)
    save_file(tensors, root / "transformer" / "diffusion_pytorch_model.safetensors")
    (root / "transformer" / "config.json").write_text('{"num_layers": 12}')
    (root / "wam_config.json").write_text('{"preset": "tiny"}')
    return root


# ----------------------------------------------------------------- every byte of the model
def test_one_ulp_of_one_norm_weight_is_another_model(ckpt):
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    skipped = [name for name in unsampled(weights) if "norm" in name]
    assert skipped, "the fixture must hold a tensor the old sampler skipped"
    before = checkpoint_fingerprint(ckpt)
    nudge(weights, skipped[0])
    assert checkpoint_fingerprint(ckpt) != before


@pytest.mark.parametrize("path", ["wam_config.json", "transformer/config.json", "lora/adapter_model.safetensors",
                                  "tokenizer/spiece.model", "tokenizer/merges.txt"])
def test_configs_adapters_and_tokenizers_are_part_of_the_model(ckpt, path):
    before = checkpoint_fingerprint(ckpt)
    target = ckpt / path
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(target.read_bytes() + b" " if target.exists() else b"x")
    assert checkpoint_fingerprint(ckpt) != before


def test_a_copy_is_the_same_model_and_leftovers_are_not_part_of_it(ckpt, tmp_path):
    import shutil

    before = checkpoint_fingerprint(ckpt)
    assert checkpoint_fingerprint(shutil.copytree(ckpt, tmp_path / "copy")) == before  # new path, inodes, mtimes
    (ckpt / ".wam_config.json.x.tmp").write_text("a killed write's temp file")
    (ckpt / "README.md").write_text("notes")
    assert checkpoint_fingerprint(ckpt) == before


def test_a_file_hash_is_its_sha256(ckpt):
    """The statistics file's fingerprint: a plain SHA-256, as earlier runs recorded it."""
    path = ckpt / "wam_config.json"
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------- the cache
def test_an_unchanged_file_is_read_once(ckpt, reads):
    first = checkpoint_fingerprint(ckpt)
    assert len(reads) == 3  # the weights and two configs
    reads.clear()
    assert checkpoint_fingerprint(ckpt) == first and reads == []
    assert len(list(cache_dir().glob("*.json"))) >= 3


def test_a_touched_file_is_read_again(ckpt, reads):
    path = ckpt / "wam_config.json"
    digest = file_sha256(path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    reads.clear()
    assert file_sha256(path) == digest and reads == [str(path)]


def test_a_replaced_file_of_the_same_size_and_mtime_is_read_again(ckpt, reads, tmp_path):
    path = ckpt / "wam_config.json"
    file_sha256(path)
    old = path.stat()
    other = tmp_path / "other.json"
    other.write_text('{"preset": "tin!"}')  # the same size
    os.utime(other, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.replace(other, path)
    new = path.stat()
    assert (new.st_size, new.st_mtime_ns) == (old.st_size, old.st_mtime_ns) and new.st_ino != old.st_ino
    reads.clear()
    assert file_sha256(path) == hashlib.sha256(b'{"preset": "tin!"}').hexdigest() and reads == [str(path)]


def test_a_rewrite_that_restores_the_mtime_is_read_again(ckpt, reads):
    """Same path, inode, size and mtime (``cp -p`` over the file): its ctime still tells."""
    path = ckpt / "wam_config.json"
    file_sha256(path)
    old = path.stat()
    path.write_text('{"preset": "tin!"}')
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    reads.clear()
    assert file_sha256(path) == hashlib.sha256(b'{"preset": "tin!"}').hexdigest() and reads == [str(path)]


@pytest.mark.parametrize("damage", [
    lambda entry: entry.write_text('{"sha256": "trunc'),  # torn
    lambda entry: entry.write_bytes(b"\xff\xfe"),  # not text
    lambda entry: entry.write_text("[]"),  # not an entry
    lambda entry: entry.write_text(json.dumps({**json.loads(entry.read_text()), "sha256": "0" * 63})),  # not a hash
    lambda entry: entry.write_text(json.dumps({**json.loads(entry.read_text()), "inode": 1})),  # another file's
], ids=["torn", "binary", "not-an-object", "bad-hash", "other-file"])
def test_a_damaged_entry_is_ignored_and_rewritten(ckpt, reads, damage):
    path = ckpt / "wam_config.json"
    digest = file_sha256(path)
    entry, = cache_dir().glob("*.json")
    damage(entry)
    reads.clear()
    assert file_sha256(path) == digest and reads == [str(path)]  # never trusted
    assert json.loads(entry.read_text())["sha256"] == digest  # and rewritten: the next time is a hit
    reads.clear()
    assert file_sha256(path) == digest and reads == []


def test_concurrent_writers_leave_whole_entries(ckpt, tmp_path):
    files = [tmp_path / f"f{i}.json" for i in range(8)]
    for i, path in enumerate(files):
        path.write_text(json.dumps({"i": i}))
    results: list[list[str]] = []
    threads = [threading.Thread(target=lambda: results.append([file_sha256(p) for p in files])) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = [hashlib.sha256(p.read_bytes()).hexdigest() for p in files]
    assert results == [expected] * 4
    entries = sorted(cache_dir().glob("*.json"))
    assert len(entries) == len(files) and all(json.loads(e.read_text())["sha256"] in expected for e in entries)
    assert not [p for p in cache_dir().iterdir() if p.name.startswith(".")]  # no temp file left


def test_the_cache_lives_under_wam_gym_cache_or_home(tmp_path, monkeypatch):
    monkeypatch.setenv("WAM_GYM_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine" / "fingerprints"
    monkeypatch.delenv("WAM_GYM_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "wam_gym" / "fingerprints"


def test_an_unwritable_cache_costs_time_not_the_answer(ckpt, tmp_path, monkeypatch, caplog, reads):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("WAM_GYM_CACHE", str(blocked))
    path = ckpt / "wam_config.json"
    with caplog.at_level(logging.WARNING, logger="wam_gym.eval.fingerprint"):
        assert file_sha256(path) == file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(reads) == 2 and f"fingerprint cache {blocked}/fingerprints is not writable" in caplog.text


# ----------------------------------------------------------------- a Python policy's code
POLICY = "import numpy as np\n\nfrom mypolicy.helpers import SCALE\n\n\ndef make_policy(device):\n    return SCALE\n"


def make_package(root: Path) -> Path:
    package = root / "mypolicy"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "policy.py").write_text(POLICY)
    (package / "helpers.py").write_text("SCALE = 1.0\n")
    (package / "data" / "gains.yaml").write_text("gain: 2\n")
    return package


def forget(package: str, monkeypatch) -> None:
    """Drop ``package`` and its modules from sys.modules (until the test ends): found afresh on sys.path."""
    import sys

    for name in [n for n in sys.modules if n == package or n.startswith(f"{package}.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def package(tmp_path, monkeypatch) -> Path:
    forget("mypolicy", monkeypatch)
    monkeypatch.syspath_prepend(str(tmp_path))
    return make_package(tmp_path)


@pytest.mark.parametrize("edit", ["policy.py", "helpers.py", "data/gains.yaml", "new.py"])
def test_one_line_anywhere_in_the_package_is_another_policy(package, edit):
    before = python_fingerprint("mypolicy.policy:make_policy")
    path = package / edit
    path.write_text((path.read_text() if path.exists() else "") + "# one more line\n")
    assert python_fingerprint("mypolicy.policy:make_policy") != before


def test_a_policy_is_its_import_string_and_its_code_not_its_folder(package, tmp_path, monkeypatch):
    before = python_fingerprint("mypolicy.policy:make_policy")
    assert python_fingerprint("mypolicy.policy:make_other") != before  # another factory of the same code
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "policy.cpython-311.pyc").write_bytes(b"compiled")
    (tmp_path / "unrelated.py").write_text("x = 1\n")  # beside the package, not in it
    assert python_fingerprint("mypolicy.policy:make_policy") == before
    elsewhere = tmp_path / "elsewhere"
    make_package(elsewhere)
    forget("mypolicy", monkeypatch)
    monkeypatch.syspath_prepend(str(elsewhere))
    assert python_fingerprint("mypolicy.policy:make_policy") == before  # the same code in another folder


def test_a_top_level_module_is_its_file_alone(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "lonely_policy.py").write_text("def make(device):\n    return None\n")
    before = python_fingerprint("lonely_policy:make")
    (tmp_path / "neighbour.py").write_text("x = 1\n")
    assert python_fingerprint("lonely_policy:make") == before
    (tmp_path / "lonely_policy.py").write_text("def make(device):\n    return 1\n")
    assert python_fingerprint("lonely_policy:make") != before


def test_a_policy_that_cannot_be_found_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^EVALUATION\.policy='no_such_pkg\.mod:f': cannot find no_such_pkg\.mod "
                                         r"\(.*\); install it or put its folder on PYTHONPATH$"):
        python_fingerprint("no_such_pkg.mod:f")
    with pytest.raises(ValueError, match=r"^EVALUATION\.policy='no_such_module:f': cannot find no_such_module; "):
        python_fingerprint("no_such_module:f")
    with pytest.raises(ValueError, match=r"^EVALUATION\.policy='sys:f': sys has no source file to fingerprint"):
        python_fingerprint("sys:f")  # built in


# ----------------------------------------------------------------- what the policy server's greeting says
def greeted_fingerprint(config, ckpt: Path | None = None, stats: Path | None = None) -> str:
    """The model fingerprint ``python -m wam_gym.serve`` greets its clients with, for ``config``."""
    from wam_gym.serve.__main__ import served_identity
    from wam_gym.serve.frames import ClientFrames
    from wam_gym.serve.hello import ServedModel, greeting_metadata

    identity = served_identity(config, ckpt, stats)
    return greeting_metadata(ServedModel(("corner",)), identity, ClientFrames("auto", None))["model"]["fingerprint"]


def test_the_greeting_shows_a_one_ulp_checkpoint_and_a_one_line_policy_as_other_models(ckpt, package):
    from wam_gym.model_call import ModelCallConfig
    from wam_gym.serve.config import ServeConfig

    stats = ckpt / "dataset_stats.json"
    stats.write_text('{"action": {"min": [0.0]}}')
    served = ServeConfig(ckpt=str(ckpt))
    before = greeted_fingerprint(served, ckpt, stats)
    nudge_a_norm(ckpt)
    assert greeted_fingerprint(served, ckpt, stats) != before
    served = ServeConfig(EVALUATION=ModelCallConfig(agent="python", policy="mypolicy.policy:make_policy"))
    before = greeted_fingerprint(served)
    (package / "helpers.py").write_text("SCALE = 1.0\n# one more line\n")
    assert greeted_fingerprint(served) != before
