"""halyard.serve: an inference engine (paged KV cache, continuous batching, an opt-in deterministic mode) and an
OpenAI-compatible server.

engine = Engine(model, EngineConfig(num_pages=256), decode=tokenizer.decode)
outputs = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=16, temperature=0.0))
"""

from halyard.serve.config import EngineConfig
from halyard.serve.engine import Engine
from halyard.serve.outputs import RequestOutput, SampleOutput, Update
from halyard.serve.pages import OutOfPages, PageAllocator
from halyard.serve.params import ParameterError, SamplingParams
from halyard.serve.replicas import Replicas
from halyard.serve.stats import EngineStats

PageTable = PageAllocator
"""The name `PageAllocator` had until 0.1.0 (kept until the next breaking release, 0.2.0)."""

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "OutOfPages",
    "PageAllocator",
    "PageTable",
    "ParameterError",
    "Replicas",
    "RequestOutput",
    "SampleOutput",
    "SamplingParams",
    "Update",
]
