"""The ``vllm.general_plugins`` entry point: ``gluon-splitkv`` as vLLM's ``CUSTOM`` attention backend.

vLLM (0.26 and later) calls :func:`register` in every process it starts (API server, engine core,
workers) when mlabench is installed in vLLM's Python (``pip install mlabench``; the entry point is
declared in mlabench's ``pyproject.toml``).  Then::

    MLABENCH_SPLIT_POLICY=policy.json vllm serve MODEL --attention-backend CUSTOM --block-size 64

runs mlabench's decode kernel with that policy (:mod:`mlabench.deploy.plugin_settings` says how
the policy and its lookup mode are chosen).  Without ``--attention-backend CUSTOM`` nothing
changes: registering a backend selects nothing.  ``VLLM_PLUGINS`` (a comma-separated allow-list
of plugin names) can leave this one (``mlabench``) out.
"""

from __future__ import annotations

import logging

#: The backend class vLLM loads for ``--attention-backend CUSTOM``.
BACKEND_CLASS = "mlabench.deploy.vllm_backend.MlabenchMLABackend"

_log = logging.getLogger("vllm.mlabench")


def register() -> None:
    """Register :data:`BACKEND_CLASS` as vLLM's ``CUSTOM`` attention backend (idempotent: vLLM may
    call it more than once per process).  The class itself, and the kernel, are imported only when
    vLLM selects the backend."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if AttentionBackendEnum.CUSTOM.is_overridden():
        current = AttentionBackendEnum.CUSTOM.get_path()
        if current != BACKEND_CLASS:
            _log.warning("mlabench: CUSTOM attention backend already registered as %s; left as it is",
                         current)
        return
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_CLASS)
    _log.debug("mlabench: registered %s as the CUSTOM attention backend", BACKEND_CLASS)
