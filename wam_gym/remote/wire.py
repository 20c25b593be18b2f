"""The wire formats of the two policy-server protocols the field speaks; both are msgpack.

- **openpi** (``openpi-client``'s ``msgpack_numpy``): a connection opens with the server's metadata
  dict; then each binary frame is one observation dict in and one answer dict out. Arrays are
  ``{b"__ndarray__": True, b"data", b"dtype", b"shape"}``, numpy scalars ``{b"__npgeneric__": ...}``.
  An error is a text frame, then the server closes.
- **vla-eval** (``vla_eval.protocol``): every frame is a message ``{"type", "payload", "seq",
  "timestamp"}`` of type hello / episode_start / observation / action / episode_end / error. Arrays
  are ``{"__ndarray__": True, "data", "dtype", "shape"}``; HWC uint8 images may come as
  ``{"__image__": True, "format": raw|png|jpeg, ...}``.

Decoding never unpickles and never trusts a header: only bool/int/uint/float arrays are built,
their byte count must match their shape, and images are decoded by Pillow under a pixel cap.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

OPENPI, VLA_EVAL = "openpi", "vla-eval"
PROTOCOLS = (OPENPI, VLA_EVAL)
VLA_EVAL_TYPES = ("hello", "observation", "action", "episode_start", "episode_end", "error")
VLA_EVAL_PROTOCOL_VERSION = 1  # vla_eval.protocol.messages.PROTOCOL_VERSION in vla-eval 0.8
ALLOWED_DTYPE_KINDS = "biuf"  # bool, int, uint, float: nothing that could carry objects
MAX_IMAGE_PIXELS = 64 * 2**20  # a PNG/JPEG that claims more is refused before it is decoded


class WireError(ValueError):
    """A frame that is not a well-formed message of either protocol."""


# ----------------------------------------------------------------- decoding
def unpack(data: bytes) -> Any:
    """One frame -> Python objects and numpy arrays, in either protocol's array encoding."""
    if not isinstance(data, bytes):
        raise WireError("expected a binary msgpack frame, got a text frame")
    try:
        return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:  # msgpack's own errors: truncated, extra data, bad types
        raise WireError(f"not a msgpack frame ({len(data)} bytes): {exc}") from None


def _decode(obj: dict) -> Any:
    if obj.get(b"__ndarray__") or obj.get("__ndarray__"):
        return _array(_field(obj, "data"), _field(obj, "dtype"), _field(obj, "shape"))
    if obj.get(b"__npgeneric__"):
        dtype = _dtype(_field(obj, "dtype"))
        return dtype.type(_field(obj, "data"))
    if obj.get("__image__"):
        return _image(obj)
    return obj


def _field(obj: dict, name: str) -> Any:
    """openpi packs array headers with bytes keys, vla-eval with str keys."""
    if name in obj:
        return obj[name]
    if name.encode() in obj:
        return obj[name.encode()]
    raise WireError(f"an encoded array lacks its {name!r} field")


def _dtype(spec: Any) -> np.dtype:
    try:
        dtype = np.dtype(spec.decode() if isinstance(spec, bytes) else str(spec))
    except TypeError:
        raise WireError(f"unknown dtype {spec!r}") from None
    if dtype.kind not in ALLOWED_DTYPE_KINDS or dtype.fields is not None:
        raise WireError(f"dtype {dtype} is not allowed: send bool, int, uint or float arrays")
    return dtype


def _array(data: Any, dtype: Any, shape: Any) -> np.ndarray:
    dtype = _dtype(dtype)
    if not isinstance(data, bytes) or not isinstance(shape, (list, tuple)) or not all(
        isinstance(n, int) and n >= 0 for n in shape
    ):
        raise WireError("an encoded array needs bytes data and a shape of non-negative ints")
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(data):
        raise WireError(f"an encoded array of shape {list(shape)} {dtype} has {len(data)} bytes of data")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _image(obj: dict) -> np.ndarray:
    fmt = obj.get("format")
    if fmt == "raw":
        return _array(obj.get("data"), obj.get("dtype"), obj.get("shape"))
    if fmt not in ("png", "jpeg") or not isinstance(obj.get("data"), bytes):
        raise WireError(f"image format {fmt!r} is not raw, png or jpeg")
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(obj["data"]))
        if image.width * image.height > MAX_IMAGE_PIXELS:
            raise WireError(f"a {image.width}x{image.height} image is over the {MAX_IMAGE_PIXELS} pixel cap")
        return np.array(image)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"cannot decode a {fmt} image: {exc}") from None


# ----------------------------------------------------------------- encoding
def _encode_openpi(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send {type(obj).__name__}")


def _encode_vla_eval(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": True, "data": np.ascontiguousarray(obj).tobytes(), "dtype": obj.dtype.str,
                "shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__}")


def pack_openpi(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_encode_openpi, use_bin_type=True)


@dataclass
class Message:
    """One vla-eval message."""

    type: str
    payload: dict[str, Any]
    seq: int = 0

    def pack(self) -> bytes:
        return msgpack.packb({"type": self.type, "payload": self.payload, "seq": self.seq, "timestamp": time.time()},
                             default=_encode_vla_eval, use_bin_type=True)


def as_message(obj: Any) -> Message | None:
    """A decoded frame as a vla-eval message, or None when it is not one (an openpi observation)."""
    if not (isinstance(obj, dict) and {"type", "payload", "seq"} <= obj.keys() and obj["type"] in VLA_EVAL_TYPES):
        return None
    if not isinstance(obj["payload"], dict) or not isinstance(obj["seq"], int):
        raise WireError("a vla-eval message needs a dict payload and an int seq")
    return Message(obj["type"], obj["payload"], obj["seq"])


def greeting(metadata: dict[str, Any], hello_fields: dict[str, Any] | None = None) -> bytes:
    """What the server sends as a connection opens: at once openpi's metadata dict and vla-eval's
    HELLO reply (the same frame parses as both), so one port serves both protocols with no
    guessing. vla-eval clients send HELLO first and read this frame as its answer; the server
    then does not answer their HELLO again. ``hello_fields`` go in the HELLO reply only
    (what vla-eval's runner reads: wam_gym/serve/hello.py)."""
    hello = {"harness_version": metadata.get("server_version", ""), "protocol_version": VLA_EVAL_PROTOCOL_VERSION,
             "model_server": "wam_gym", "capabilities": {}, **metadata, **(hello_fields or {})}
    return msgpack.packb({**metadata, "type": "hello", "payload": hello, "seq": 0, "timestamp": time.time()},
                         default=_encode_openpi, use_bin_type=True)
