"""bench/precision.py: its combinations, exact fp32 restores, and a --quick run end to end."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from agents.wam import build_model, preset
from agents.wam.precision import MODES, PrecisionConfig

BENCH = Path(__file__).resolve().parents[1] / "bench" / "precision.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_precision", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_combinations_cover_the_ladders_and_singles_once(bench):
    combos = bench.combinations()
    configs = [tuple(c.items()) for c in combos.values()]
    assert len(configs) == len(set(configs)) == 15  # 1 fp32 + 2 x (4 ladder steps + 3 singles not on a ladder)
    assert list(combos.values())[0] == PrecisionConfig()
    for mode in ("bf16_full", "autocast"):
        assert PrecisionConfig.uniform(mode) in combos.values()
        assert PrecisionConfig(backbone=mode, projectors=mode, text_encoder=mode) in combos.values()
        for part in bench.PARTS:
            assert PrecisionConfig(**{part: mode}) in combos.values()
    # Duplicates keep every name they answer to.
    (name,) = [n for n, c in combos.items() if c == PrecisionConfig.uniform("bf16_full")]
    assert "bf16_full ladder 4" in name and "all bf16_full" in name
    quick = bench.quick_combinations()
    assert len(quick) == 4 and list(quick)[0] == list(combos)[0]


def test_fp32_is_restored_exactly_after_a_bf16_cast(bench):
    torch.manual_seed(0)
    model = build_model(preset("tiny"))
    fp32 = {k: v.clone() for k, v in model.state_dict().items()}
    low = bench.with_precision(model, fp32, PrecisionConfig.uniform("bf16_full"))
    assert low.config.encoder_mode == PrecisionConfig.uniform("bf16_full") and model.config.encoder_mode == PrecisionConfig()
    assert low.vae.decoder.conv_in.weight.dtype is torch.bfloat16
    back = bench.with_precision(model, fp32, PrecisionConfig())
    for key, value in back.state_dict().items():
        assert value.dtype == fp32[key].dtype and torch.equal(value, fp32[key]), key


@pytest.mark.parametrize("weights", ["random", "checkpoint"])
def test_quick_run_reports_every_combination(bench, weights, tiny_ckpt, tmp_path, capsys):
    out = tmp_path / "precision.json"
    rows = bench.main(["--quick", "--json", str(out), *(["--checkpoint", str(tiny_ckpt)] if weights == "checkpoint" else [])])
    printed = capsys.readouterr().out
    assert "torch " + torch.__version__ in printed and "| backbone | projectors | text_encoder | vae |" in printed
    saved = json.loads(out.read_text())
    assert saved["results"] == json.loads(json.dumps(rows))
    assert saved["machine"]["image_size"] == [16, 16] and saved["machine"]["repeats"] == 1
    assert saved["machine"]["checkpoint"] == (str(tiny_ckpt) if weights == "checkpoint" else None)
    ref, *others = rows
    assert ref["encoder_mode"] == dict.fromkeys(bench.PARTS, "fp32")
    assert ref["psnr_future_db"] is None and ref["max_abs_action_diff"] == 0.0 and ref["ratio_to_fp32"] == 1.0
    for row in others:
        assert row["error"] is None and set(row["encoder_mode"].values()) <= set(MODES)
        # bf16 changes the answer a little: visibly (< 100 dB, the cap), nowhere near unrelated frames.
        assert 30 < row["psnr_future_db"] < 100 and 0 < row["max_abs_action_diff"] < 0.2
        assert row["median_s"] > 0 and len(row["times_s"]) == 1
    backbone_only = next(r for r in others if r["encoder_mode"]["vae"] == "fp32")
    assert backbone_only["psnr_frame0_db"] == 100.0  # fp32 VAE: the current frame's reconstruction is untouched


def test_cuda_without_a_gpu_fails_early(bench, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    with pytest.raises(SystemExit) as err:
        bench.parse_args(["--device", "cuda"])
    assert err.value.code == 2 and "sees no CUDA device" in capsys.readouterr().err
