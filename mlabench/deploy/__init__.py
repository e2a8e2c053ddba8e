"""mlabench's kernel and split policy inside a server.

- :mod:`mlabench.deploy.plugin_settings`: what the vLLM plugin runs (split policy file, host or
  device lookup), read from the environment or vLLM's ``--additional-config``, checked against
  the served shape at start-up (pure Python, no vLLM).
- :mod:`mlabench.deploy.vllm_plugin`: the ``vllm.general_plugins`` entry point that registers
  ``gluon-splitkv`` as vLLM's ``CUSTOM`` MLA attention backend, and
  :mod:`mlabench.deploy.vllm_backend`, that backend (imported only inside a vLLM process).
- :mod:`mlabench.deploy.proxy_model`: model folders a GPU can serve with dummy weights (a Kimi K3
  TP8 proxy with one rank's weight bytes, and a tiny one).
- :mod:`mlabench.deploy.prediction`: TPOT predicted from microbenchmarks, beside the measured one.

Why a package of its own: :mod:`mlabench.serving` (the server lifecycle, ``vllm bench serve``,
TPOT tables) sits low in the layers because the tuner and the report use it, while the plugin
needs the split policies and the kernels, and the prediction needs recorded sweeps.
"""
