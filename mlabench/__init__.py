"""mlabench: measure, check and tune MLA decode kernels (DeepSeek-V3, Kimi K2/K3)."""

__version__ = "0.1.0"
