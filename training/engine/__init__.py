"""One training-engine interface over two back ends, so the training loop never branches.

``make_engine(model, config, device)`` returns an :class:`Engine` (``config``: an
:class:`EngineConfig`, such as the whole training config, which is one):

* **torch** (``deepspeed`` null, one process): :mod:`training.engine.torch_engine`.
* **deepspeed** (``deepspeed=zero1|zero2|zero2_offload`` or a ZeRO JSON): :mod:`training.engine.deepspeed_engine`.

Where the rest lives: the knobs and the LR schedule in :mod:`training.engine.config`, the interface
in :mod:`training.engine.base`, checkpoint layout, resume and the weights-only reads in
:mod:`training.engine.checkpoint`.

The loop::

    engine = make_engine(model, cfg, device)
    if (ckpt := latest_checkpoint(root)) is not None:
        state = engine.load(ckpt)                    # client_state: data position, RNG, ...
    for batch in loader:
        with engine.autocast():
            loss = engine(batch)                     # forward through the back end
        engine.backward(loss)
        if engine.step():                            # True only at accumulation boundaries
            if engine.global_step % save_every == 0:
                engine.save(checkpoint_dir(root, engine.global_step), {"rng": rng_state(), ...})
"""

from __future__ import annotations

from torch import nn

from training.engine.base import Engine, trainable_parameters
from training.engine.checkpoint import (
    UnsafeCheckpointError,
    checkpoint_dir,
    latest_checkpoint,
    rng_state,
    set_rng_state,
)
from training.engine.config import EngineConfig, lr_lambda, resolve_mixed_precision
from training.engine.deepspeed_engine import (
    CONFIG_DIR,
    DEEPSPEED_CONFIGS,
    ENGINE_OWNED_KEYS,
    DeepSpeedEngine,
    deepspeed_config_dict,
    resolve_deepspeed_config,
)
from training.engine.torch_engine import TorchEngine

__all__ = [
    "CONFIG_DIR",
    "DEEPSPEED_CONFIGS",
    "ENGINE_OWNED_KEYS",
    "DeepSpeedEngine",
    "Engine",
    "EngineConfig",
    "TorchEngine",
    "UnsafeCheckpointError",
    "checkpoint_dir",
    "deepspeed_config_dict",
    "latest_checkpoint",
    "lr_lambda",
    "make_engine",
    "resolve_deepspeed_config",
    "resolve_mixed_precision",
    "rng_state",
    "set_rng_state",
    "trainable_parameters",
]


def make_engine(model: nn.Module, config: EngineConfig, device) -> Engine:
    """The DeepSpeed back end when ``config.deepspeed`` is set, else the plain torch one."""
    if config.deepspeed:
        return DeepSpeedEngine(model, config, device)
    return TorchEngine(model, config, device)
