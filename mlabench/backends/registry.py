"""One registry, one decorator: ``@register`` adds a backend class under its ``name``.

A duplicate name is an error at import time; an unknown name raises :class:`UnknownBackendError`
listing the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from mlabench.backends.base import Backend, Family
from mlabench.device import current_device
from mlabench.errors import BackendUnavailableError, UnknownBackendError

_REGISTRY: dict[str, type[Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator; raises ValueError if ``cls.name`` is already registered or ``cls.family``
    is not a :data:`~mlabench.backends.base.Family`."""
    name = cls.name
    if name in _REGISTRY:
        raise ValueError(f"backend {name!r} registered twice ({_REGISTRY[name].__module__}, {cls.__module__})")
    if getattr(cls, "family", None) not in get_args(Family):
        raise ValueError(f"backend {name!r}: family must be one of {get_args(Family)}")
    _REGISTRY[name] = cls
    return cls


def backend_names() -> list[str]:
    """Registered names in registration order."""
    return list(_REGISTRY)


def get_backend(name: str) -> Backend:
    """The (cached) instance of backend ``name``; :class:`UnknownBackendError` if none."""
    if name not in _REGISTRY:
        raise UnknownBackendError(f"unknown backend {name!r}; known: {', '.join(_REGISTRY)}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]


def backend_families() -> dict[str, str]:
    """``{backend name: family}`` of every registered backend (``persistent``, ``split-kv``, ...):
    what compare tables and report figures pair padded persistent kernels with split-KV ones by."""
    return {name: get_backend(name).family for name in backend_names()}


def available_backends() -> list[Backend]:
    """Instances of every backend that can run here."""
    return [b for b in (get_backend(n) for n in backend_names()) if b.available()[0]]


def backend_params() -> dict[str, tuple[str, ...]]:
    """``{backend name: its parameter names}`` of every registered backend: what a serve config's
    ``[prediction]`` may name (:meth:`mlabench.deploy.prediction.PredictionSpec.of`)."""
    return {name: get_backend(name).param_names() for name in backend_names()}


def backend_packages() -> dict[str, tuple[str, ...]]:
    """Every registered backend's :attr:`~mlabench.backends.base.Backend.packages`, merged:
    manifest key -> distribution names (the first installed one counts)."""
    return {key: names for cls in _REGISTRY.values() for key, names in cls.packages.items()}


def select_backends(names: list[str] | None, include_reference: bool = False, strict: bool = True,
                    warn: Callable[[str], None] | None = None) -> list[Backend]:
    """Backends named, or by default every available non-reference one native to the device found
    (GPU kernels on a GPU; on a CPU the portable PyTorch ones, not GPU kernels in an interpreter).

    Unknown names raise :class:`UnknownBackendError`.  A named backend that is unavailable raises
    :class:`BackendUnavailableError` when ``strict`` (names from flags), else is left out with a
    ``warn`` line (names from a shipped config that must run on any hardware).
    """
    device = current_device()
    if names:
        chosen = [get_backend(n) for n in names]  # unknown names raise here, before anything runs
        keep = []
        for b in chosen:
            ok, why = b.available()
            if ok:
                keep.append(b)
            elif strict:
                raise BackendUnavailableError(f"backend {b.name} is not available here: {why}")
            elif warn:
                warn(f"skipping {b.name}: not available here ({why})")
        return keep
    return [b for b in map(get_backend, backend_names())
            if b.available()[0] and (include_reference or not b.is_reference)
            and b.gpu_kernel == device.is_gpu]
