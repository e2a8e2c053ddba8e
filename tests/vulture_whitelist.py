"""Names in mlabench/ that nothing in this repository calls, kept on purpose (vulture reads this file
as a user of each; tests/core/test_structure.py runs it).  One line each, with why."""

from mlabench.policy.tuned import json_schema

json_schema  # public: docs/tuning.md tells users to call it for the policy file's JSON schema

from mlabench.deploy.vllm_backend import MlabenchMLABackend, MlabenchMLAImpl

# vLLM calls these: it loads the class by the name mlabench.deploy.vllm_plugin registers for
# --attention-backend CUSTOM, then the backend interface's class methods and forward_mqa
MlabenchMLABackend.get_name, MlabenchMLABackend.get_supported_kernel_block_sizes
MlabenchMLABackend.get_kv_cache_stride_order, MlabenchMLABackend.get_builder_cls
MlabenchMLABackend.get_impl_cls, MlabenchMLABackend.supports_compute_capability
MlabenchMLAImpl.forward_mqa
