"""Device models: the roofline numbers behind recompute-time estimates (torch-free).

A :class:`DeviceModel` is the ``device_model`` option of ``remat.checkpoint`` and
``remat.explain``: ``device_model=remat.DeviceModel(name=..., matmul_flops=..., vector_flops=...,
bandwidth=...)``, or one of :data:`DEVICE_MODELS` by name (``"h200"``, ``"cpu"``). The estimates
that use it live with the graph analysis (``remat.analysis.cost``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceModel", "H200", "CPU", "DEVICE_MODELS"]


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceModel:
    """Roofline parameters for recompute-time estimates."""

    name: str
    matmul_flops: float
    """Dense matmul/convolution/attention rate (FLOP/s)."""
    vector_flops: float
    """Rate of non-matmul arithmetic (FLOP/s)."""
    bandwidth: float
    """Device memory bandwidth (bytes/s)."""

    def __post_init__(self) -> None:
        for f in ("matmul_flops", "vector_flops", "bandwidth"):
            if not getattr(self, f) > 0:
                raise ValueError(f"remat: DeviceModel.{f} must be positive, got {getattr(self, f)!r}")


H200 = DeviceModel(name="h200", matmul_flops=790e12, vector_flops=60e12, bandwidth=4.3e12)
"""Measured on this project's H200: bf16 8192^3 matmul 788 TFLOP/s, device copy 4.3 TB/s."""
CPU = DeviceModel(name="cpu", matmul_flops=1e11, vector_flops=2e10, bandwidth=2e10)
"""A conservative two-core CPU."""
DEVICE_MODELS = {"h200": H200, "cpu": CPU}
"""The device models ``device_model`` accepts by name."""
