"""LoRA adapters on both experts, through peft.

Adapters go on the attention projections of every transformer block of the chosen experts;
all other weights freeze, except the modules ``fully_trained`` names. Saved in peft's directory
format (``adapter_config.json`` + ``adapter_model.safetensors``), one folder per expert.

:class:`LoraSettings` is the one LoRA config: ``add_lora(model, LoraSettings(rank=16))`` in
Python, and the ``lora.*`` group of ``python -m training`` (where ``lora.enabled`` turns it on).
peft loads only when adapters are added, saved or loaded, so the training schema imports none.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from agents.wam.finite_weights import check_finite

EXPERTS = {"video": "transformer", "action": "action_expert"}
SETTINGS_FILE = "wam_lora.json"
ADAPTER_FILE = "adapter_model.safetensors"


@dataclass
class LoraSettings:
    """Where adapters go and how big they are (peft's LoraConfig, restricted to the MoT's blocks)."""

    enabled: bool = True  # python -m training adds adapters only when true (lora.enabled=true: the _lora recipes)
    rank: int = 16  # adapter rank r
    alpha: float = 16.0  # peft's lora_alpha: the update is scaled by alpha / rank
    dropout: float = 0.0  # peft's lora_dropout on the adapter input
    experts: tuple[str, ...] = ("video", "action")  # which experts get adapters: video | action
    target_modules: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")  # projections inside each block
    # Modules trained in full beside the adapters (e.g. a fresh action expert next to Wan weights).
    fully_trained: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Hydra and JSON hand over lists.
        self.experts, self.target_modules = tuple(self.experts), tuple(self.target_modules)
        self.fully_trained = tuple(self.fully_trained)
        unknown = set(self.experts) - set(EXPERTS)
        if unknown:
            raise ValueError(f"unknown LoRA expert(s) {sorted(unknown)}; choose from {sorted(EXPERTS)}")
        if self.rank < 1:
            raise ValueError("LoRA rank must be >= 1")

    def peft_config(self):
        """peft's ``LoraConfig`` for one expert."""
        from peft import LoraConfig

        # Only inside transformer blocks: patch embeddings and heads keep their trained weights.
        names = "|".join(re.escape(m) for m in self.target_modules)
        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=rf"^blocks\.\d+\.(?:.+\.)?(?:{names})$",
        )


def has_lora(module: nn.Module) -> bool:
    return any("lora_" in name for name, _ in module.named_parameters())


def add_lora(model: nn.Module, settings: LoraSettings) -> None:
    """Inject adapters into ``model``'s experts; they and ``settings.fully_trained`` become the only
    trainable weights. (``settings.enabled`` is for configs that may leave LoRA off: not read here.)"""
    from peft import inject_adapter_in_model

    absent = [expert for expert in settings.experts if not hasattr(model, EXPERTS[expert])]
    if absent:
        present = [expert for expert, name in EXPERTS.items() if hasattr(model, name)]
        raise ValueError(f"lora.experts={list(settings.experts)}: a {type(model).__name__} has no {absent[0]} expert; "
                         f"set lora.experts={present}")
    for expert in settings.experts:
        inject_adapter_in_model(settings.peft_config(), getattr(model, EXPERTS[expert]))
    for name, param in model.named_parameters():
        full = any(name.startswith(f"{prefix}.") for prefix in settings.fully_trained)
        param.requires_grad_("lora_" in name or full)
    model.lora_settings = settings


def base_state_dict(module: nn.Module) -> dict:
    """The module's weights without adapters, under the names the plain module uses."""
    return {
        name.replace(".base_layer.", "."): tensor.contiguous()
        for name, tensor in module.state_dict().items()
        if "lora_" not in name
    }


def merged_state_dict(module: nn.Module) -> dict:
    """The module's weights with its adapters merged in (W + scale * B A), under the plain module's names:
    what a checkpoint format without adapters (FastWAM's own) holds. Merges ``module`` in place."""
    from peft.tuners.lora import LoraLayer

    for layer in module.modules():
        if isinstance(layer, LoraLayer):
            layer.merge()
    return base_state_dict(module)


def save_lora(model: nn.Module, directory: Path) -> None:
    from peft import get_peft_model_state_dict

    settings: LoraSettings = model.lora_settings
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SETTINGS_FILE).write_text(json.dumps(dataclasses.asdict(settings), indent=2))
    for expert in settings.experts:
        module = getattr(model, EXPERTS[expert])
        folder = directory / expert
        folder.mkdir(exist_ok=True)
        module.peft_config["default"].save_pretrained(str(folder))
        tensors = {k: v.contiguous() for k, v in get_peft_model_state_dict(module).items()}
        save_file(tensors, str(folder / ADAPTER_FILE))


def load_lora(model: nn.Module, directory: Path) -> None:
    from peft import set_peft_model_state_dict

    settings = LoraSettings(**json.loads((directory / SETTINGS_FILE).read_text()))
    add_lora(model, settings)
    for expert in settings.experts:
        path = directory / expert / ADAPTER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"LoRA checkpoint {directory} lacks {path.relative_to(directory)}; re-save the adapters")
        try:
            weights = load_file(str(path))
        except SafetensorError as exc:
            raise ValueError(f"LoRA weights {path} are truncated or corrupt ({exc}); re-save the adapters") from exc
        check_finite(weights, f"LoRA weights {path}", "load an earlier checkpoint's adapters, or re-save them")
        result = set_peft_model_state_dict(getattr(model, EXPERTS[expert]), weights)
        if result.unexpected_keys:
            raise ValueError(f"LoRA weights in {path} do not fit the model: {result.unexpected_keys[:3]}")
