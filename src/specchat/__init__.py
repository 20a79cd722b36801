"""specchat: chat with large language models on consumer hardware, fast, by SpecExec."""

__version__ = "0.1.0"
