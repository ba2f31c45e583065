"""sentence-transformers ``Dense`` layers after pooling, run on the engine's device.

They run in fp32 whatever the model's dtype: the pooled vectors are fp32 already, and a
``[n, D] x [D, D']`` product per batch costs nothing beside the forward, while bf16 here would
add its rounding to every served vector. On CUDA they are captured in each graph, after the
pooling (``gpu.GpuRunner.capture``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from mesh.worker.engine.st_config import DenseLayer
from mesh.worker.engine.weights import WeightSource

_ACTIVATIONS: dict[str, type[torch.nn.Module]] = {
    "Identity": torch.nn.Identity,
    "Tanh": torch.nn.Tanh,
    "ReLU": torch.nn.ReLU,
    "GELU": torch.nn.GELU,
    "Sigmoid": torch.nn.Sigmoid,
    "SiLU": torch.nn.SiLU,
}


class Dense(torch.nn.Module):
    """``activation(linear(x))`` (+ ``x`` or ``residual(x)``), as sentence-transformers'."""

    def __init__(self, layer: DenseLayer) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        self.activation = _ACTIVATIONS[layer.activation]()
        self.use_residual = layer.residual
        if layer.residual and layer.in_features != layer.out_features:
            self.residual = torch.nn.Linear(layer.in_features, layer.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


def load_dense(
    model_dir: str | Path, layers: list[DenseLayer], device: torch.device
) -> torch.nn.Sequential | None:
    """The model's Dense stack in fp32 on ``device``; None when it has none. Weights come
    from each module's ``model.safetensors``; a module saved only as ``pytorch_model.bin``
    (a pickle) is refused with ValueError."""
    if not layers:
        return None
    stack = torch.nn.Sequential()
    for layer in layers:
        folder = Path(model_dir) / layer.path
        weights = folder / "model.safetensors"
        if not weights.is_file():
            found = "only pytorch_model.bin" if (folder / "pytorch_model.bin").is_file() else "none"
            raise ValueError(
                f"Dense module {layer.path!r} needs model.safetensors (found {found}); convert it "
                "with safetensors.torch.save_file(torch.load(path, weights_only=True), ...)"
            )
        module = Dense(layer)
        try:
            module.load_state_dict(load_file(str(weights)))
        except RuntimeError as exc:  # missing, unexpected or misshapen tensors
            raise ValueError(f"Dense module {layer.path!r}: {exc}") from None
        stack.append(module)
    return stack.to(device=device, dtype=torch.float32).eval()


def load_classifier(
    model_dir: str | Path, layers: list[DenseLayer], prefixes: tuple[str, ...],
    device: torch.device,
) -> torch.nn.Sequential:  # fmt: skip
    """A cross-encoder's head (:mod:`.classifier` reads which layers) as Dense modules (fp32
    on ``device``) with the checkpoint's own weights; ValueError naming a missing one."""
    source = WeightSource(model_dir, prefixes)
    stack = torch.nn.Sequential()
    for layer in layers:
        module = Dense(layer)
        try:
            weights = {
                f"linear.{part}": source.get(f"{layer.path}.{part}", torch.float32, "cpu")
                for part in ("weight", "bias")
            }
            module.load_state_dict(weights)
        except (KeyError, RuntimeError) as exc:
            raise ValueError(f"classifier head {layer.path!r}: {exc}") from None
        stack.append(module)
    return stack.to(device=device, dtype=torch.float32).eval()
