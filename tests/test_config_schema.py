"""The config schemas: one owner per knob, every field commented, and the knob names users type.

Sampler and compile settings are nested (InferenceConfig.sampler / .compile) and EVALUATION spells
them flat, as users know them; the engine knobs are EngineConfig's and stay top-level in the
training config; LoRA is one class (LoraSettings). Compose-only: no model is trained here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from agents.wam.compile import CompileConfig
from agents.wam.inference_config import KNOBS, InferenceConfig, SamplerConfig
from agents.wam.lora import LoraSettings
from training.config import TrainConfig, register_configs
from training.engine import EngineConfig, deepspeed_config_dict
from wam_gym.eval.config import EvalConfig, EvaluationConfig

ROOT = Path(__file__).resolve().parents[1]
TASKS = sorted(p.stem for p in (ROOT / "training" / "conf" / "task").glob("*.yaml"))


def _config_classes() -> dict[str, list[str]]:
    """Every dataclass named *Config or *Settings in the four packages: module -> class names."""
    found: dict[str, list[str]] = {}
    for package in ("envs", "agents", "training", "wam_gym"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                is_dataclass = isinstance(node, ast.ClassDef) and any(
                    "dataclass" in ast.unparse(d) for d in node.decorator_list)
                if is_dataclass and node.name.endswith(("Config", "Settings")):
                    found.setdefault(str(path.relative_to(ROOT)), []).append(node.name)
    return found


COMMENTED = _config_classes()  # module -> its config dataclasses (what --cfg job prints, or users build)


def train_config(*overrides: str) -> TrainConfig:
    from omegaconf import OmegaConf

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "training" / "conf"), version_base=None):
        return OmegaConf.to_object(compose("train", overrides=list(overrides)))


def eval_config(*overrides: str) -> EvalConfig:
    from wam_gym.eval.config import compose

    return compose(overrides)


@pytest.mark.parametrize("path", sorted(COMMENTED))
def test_every_config_field_has_a_comment(path):
    """A comment on the field's line, or on the line above it (for the few that need more)."""
    lines = (ROOT / path).read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    bare = []
    for name in COMMENTED[path]:
        for item in classes[name].body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                line, above = lines[item.lineno - 1], lines[item.lineno - 2].strip()
                if "#" not in line and not above.startswith("#"):
                    bare.append(f"{name}.{item.target.id}")
    assert bare == [], f"{path}: fields without a comment: {bare}"


# ----------------------------------------------------------------------------- inference: nested, flat knobs
def test_inference_config_nests_one_owner_per_group():
    kinds = {f.name: f.type for f in dataclasses.fields(InferenceConfig)}
    assert kinds["sampler"] == "SamplerConfig" and kinds["compile"] == "CompileConfig"
    assert InferenceConfig().sampler == SamplerConfig() and InferenceConfig().compile == CompileConfig()


def test_from_knobs_is_the_flat_spelling():
    built = InferenceConfig.from_knobs(num_inference_steps=4, sampler="ddim", shift=3.0, torch_compile=True,
                                       torch_compile_mode=None, torch_compile_backend="eager",
                                       torch_compile_fullgraph=True, torch_compile_dynamic=False,
                                       torch_compile_options={"a": 1}, inference_cross_kv_reuse=False,
                                       visualize_future_video=True, seed=7)
    assert built == InferenceConfig(
        sampler=SamplerConfig("ddim", 4, 3.0),
        compile=CompileConfig(enabled=True, mode=None, backend="eager", fullgraph=True, dynamic=False, options={"a": 1}),
        inference_cross_kv_reuse=False, visualize_future_video=True, seed=7,
    )
    assert InferenceConfig.from_knobs() == InferenceConfig()
    with pytest.raises(TypeError, match="num_inference_step"):
        InferenceConfig.from_knobs(num_inference_step=4)


def test_evaluation_spells_every_inference_knob_flat_with_the_owners_defaults():
    names = {f.name for f in dataclasses.fields(EvaluationConfig)}
    assert set(KNOBS) <= names
    assert EvaluationConfig().inference() == InferenceConfig()  # defaults come from the owners


def test_eval_command_line_knobs_reach_the_nested_config():
    cfg = eval_config(
        "EVALUATION.num_inference_steps=4", "EVALUATION.sampler=dpmpp", "EVALUATION.shift=2.0",
        "EVALUATION.torch_compile=true", "EVALUATION.torch_compile_mode=max-autotune",
        "EVALUATION.torch_compile_backend=aot_eager", "EVALUATION.torch_compile_fullgraph=true",
        "EVALUATION.torch_compile_dynamic=false", "+EVALUATION.torch_compile_options={max_autotune:true,epilogue_fusion:false}",
        "EVALUATION.inference_cross_kv_reuse=false", "EVALUATION.visualize_future_video=true",
        "EVALUATION.action_horizon=8", "EVALUATION.replan_steps=4", "EVALUATION.video_mode=action_only",
        "EVALUATION.eval_save_video=true", "EVALUATION.num_trials=2", "EVALUATION.output_dir=/tmp/x",
        "EVALUATION.dataset_stats_path=/tmp/stats.json", "MULTIRUN.inference_batch_size=2",
    )
    inference = cfg.EVALUATION.inference()
    assert inference.sampler == SamplerConfig("dpmpp", 4, 2.0)
    assert inference.compile == CompileConfig(enabled=True, mode="max-autotune", backend="aot_eager", fullgraph=True,
                                              dynamic=False, options={"max_autotune": True, "epilogue_fusion": False})
    assert not inference.inference_cross_kv_reuse and inference.visualize_future_video
    with pytest.raises(ValueError, match="EVALUATION: unknown sampler 'euler'"):
        eval_config("EVALUATION.sampler=euler")


# ----------------------------------------------------------------------------- training: engine, LoRA, compile
def test_engine_knobs_are_top_level_and_the_config_is_the_engine_config():
    cfg = train_config("task=metaworld_tiny", "lr=0.01", "batch_size=3", "gradient_accumulation_steps=2",
                       "mixed_precision=fp32", "deepspeed=zero1", "warmup_steps=5", "lr_schedule=cosine",
                       "max_steps=7", "grad_clip=0.5", "weight_decay=0.1", "betas=[0.8,0.95]", "vae_micro_batch_size=1",
                       "num_workers=0", "dataloader_prefetch_factor=2", "dataloader_persistent_workers=false",
                       "dataloader_pin_memory=false", "dataloader_worker_threads=2",
                       "model.backbone.attention_backend=sdpa", "model.backbone.use_gradient_checkpointing=true")
    assert isinstance(cfg, EngineConfig)
    assert (cfg.lr, cfg.batch_size, cfg.gradient_accumulation_steps, cfg.max_steps, cfg.betas) == (0.01, 3, 2, 7, (0.8, 0.95))
    ds = deepspeed_config_dict(cfg)  # what the DeepSpeed engine gets: no copy in between
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["gradient_clipping"]) == (3, 2, 0.5)
    with pytest.raises(ValueError, match="lr_schedule"):
        train_config("lr_schedule=linear")


@pytest.mark.parametrize("overrides, expected", [
    (["vae_micro_batch_size=2"], 2),
    (["model.vae_micro_batch_size=3"], 3),  # once silently overwritten by the top-level default
    (["vae_micro_batch_size=2", "model.vae_micro_batch_size=2"], 2),
    ([], None),
])
def test_vae_micro_batch_size_has_one_owner(overrides, expected):
    cfg = train_config("task=metaworld_tiny", *overrides)
    assert cfg.model.vae_micro_batch_size == cfg.vae_micro_batch_size == expected


def test_disagreeing_vae_micro_batch_sizes_are_refused():
    with pytest.raises(ValueError, match="disagree: set one of them"):
        train_config("task=metaworld_tiny", "vae_micro_batch_size=2", "model.vae_micro_batch_size=4")


def test_infra_profiles_set_the_compile_group():
    assert train_config().infra.compile == CompileConfig(enabled=False, mode=None)
    for profile, compiled in (("online", False), ("compile", True), ("cache", True)):
        cfg = train_config(f"+infra={profile}")
        assert cfg.infra.name == profile and cfg.infra.pinned_transfer
        assert cfg.infra.compile == CompileConfig(enabled=compiled, mode=None)
    assert train_config("+infra=compile", "infra.compile.mode=max-autotune").infra.compile.mode == "max-autotune"


@pytest.mark.parametrize("task", TASKS)
def test_every_recipe_composes(task):
    cfg = train_config(f"task={task}")
    assert cfg.task == task and isinstance(cfg.lora, LoraSettings)
    assert cfg.lora.enabled == task.endswith("_lora")


def test_one_lora_class_from_the_recipe_to_the_model(tmp_path):
    from agents.wam import build_model, preset
    from agents.wam.lora import add_lora, load_lora, save_lora

    assert dataclasses.fields(TrainConfig)[[f.name for f in dataclasses.fields(TrainConfig)].index("lora")].type == "LoraSettings"
    settings = train_config("task=libero_wan22_lora", "lora.rank=2").lora
    assert settings == LoraSettings(enabled=True, rank=2, alpha=32.0, experts=("video",), fully_trained=("action_expert",))
    torch.manual_seed(0)
    model = build_model(preset("tiny"))
    add_lora(model, settings)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("lora_" in n for n in trainable)
    assert all("lora_" in n or n.startswith("action_expert.") for n in trainable)
    assert any(n.startswith("action_expert.") for n in trainable)  # fully_trained: the whole action expert
    save_lora(model, tmp_path)
    fresh = build_model(preset("tiny"))
    load_lora(fresh, tmp_path)
    assert fresh.lora_settings == settings


def test_training_schema_imports_no_peft(fresh_python):
    proc = fresh_python(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                        "import training.config, wam_gym.eval.config\n"
                        "heavy = [m for m in ('diffusers', 'transformers', 'peft', 'deepspeed') if m in sys.modules]\n"
                        "assert not heavy, heavy\n")
    assert proc.returncode == 0, proc.stderr


def test_no_field_copies_between_engine_and_training_config():
    """TrainConfig declares none of EngineConfig's fields again: it inherits them."""
    source = inspect.getsource(TrainConfig)
    own = {node.target.id for node in ast.parse(source).body[0].body if isinstance(node, ast.AnnAssign)}
    assert own.isdisjoint(f.name for f in dataclasses.fields(EngineConfig))


# ----------------------------------------------------------------------------- knob ranges (issue 39, class 6)
def _range_tables():
    from wam_gym.broker import BrokerConfig
    from wam_gym.eval.config import EVALUATION_RANGES, MULTIRUN_RANGES, MultirunConfig
    from wam_gym.remote.config import REMOTE_RANGES, RemoteConfig
    from wam_gym.serve.config import SERVE_RANGES, ServeSettings

    return {"EVALUATION": (EvaluationConfig, EVALUATION_RANGES), "MULTIRUN": (MultirunConfig, MULTIRUN_RANGES),
            "REMOTE": (RemoteConfig, REMOTE_RANGES), "SERVE": (ServeSettings, SERVE_RANGES),
            "MULTIRUN (broker)": (BrokerConfig, MULTIRUN_RANGES)}


@pytest.mark.parametrize("group", ["EVALUATION", "MULTIRUN", "REMOTE", "SERVE", "MULTIRUN (broker)"])
def test_every_numeric_knob_has_a_range(group):
    cls, ranges = _range_tables()[group]
    numeric = {f.name for f in dataclasses.fields(cls)
               if any(t in str(f.type).replace(" ", "").split("|") for t in ("int", "float"))}
    assert numeric <= set(ranges), f"{group} knobs without a range: {sorted(numeric - set(ranges))}"
    for name, allowed in ranges.items():  # the default is in range
        if name in numeric:
            assert allowed.holds(cls.__dataclass_fields__[name].default), name


@pytest.mark.parametrize("group, knob, value, message", [
    ("EVALUATION", "actor_stall_s", 0, r"EVALUATION\.actor_stall_s must be in \(0, 86400\] \(seconds\) or null \(off\), got 0"),
    ("MULTIRUN", "max_worker_restarts", -1, r"MULTIRUN\.max_worker_restarts must be in \[0, 10000\] .*, got -1"),
    ("MULTIRUN", "startup_timeout_s", 0.0, r"MULTIRUN\.startup_timeout_s must be > 0 \(seconds\), got 0\.0"),
    ("MULTIRUN", "inference_batch_wait_ms", float("nan"), r"inference_batch_wait_ms must be >= 0 .*, got nan"),
    ("SERVE", "max_sessions", 0, r"SERVE\.max_sessions must be in \[1, 65536\] \(concurrent connections\), got 0"),
    ("MULTIRUN", "env_num_per_worker", 10**6, r"MULTIRUN\.env_num_per_worker must be in \[1, 1024\] .*, got 1000000"),
    ("REMOTE", "timeout_s", 0.0, r"REMOTE\.timeout_s must be in \(0, 86400\] \(seconds\), got 0\.0"),
])
def test_a_knob_out_of_range_is_refused_naming_its_range(group, knob, value, message):
    cls = _range_tables()[group][0]
    with pytest.raises(ValueError, match=message):
        cls(**{knob: value})
