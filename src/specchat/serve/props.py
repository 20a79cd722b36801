"""llama.cpp's `GET /props`: what its web UI and the front ends written for it read of a server
before they send anything: the context size, the defaults a request leaves out, the slots and the
chat template. Read-only, as llama.cpp's is unless started with --props."""

from importlib.metadata import version

from specchat.serve.endpoint import ServeConfig


def props(config: ServeConfig, slots: int, engine: str) -> dict:
    """The server's properties in llama.cpp's shape, `slots` engines of kind `engine` serving."""
    sampling = config.sampling
    return {
        "default_generation_settings": {
            "n_ctx": config.context, "speculative": engine != "autoregressive",
            "params": {"n_predict": -1, "seed": -1 if sampling.seed is None else sampling.seed,  # -1: drawn
                       "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                       "min_p": sampling.min_p, "typical_p": sampling.typical_p,
                       "top_n_sigma": sampling.top_n_sigma, "xtc_probability": sampling.xtc_probability,
                       "xtc_threshold": sampling.xtc_threshold, "dynatemp_range": sampling.dynatemp_range,
                       "dynatemp_exponent": sampling.dynatemp_exponent,
                       "mirostat": sampling.mirostat, "mirostat_tau": sampling.mirostat_tau,
                       "mirostat_eta": sampling.mirostat_eta,
                       "repeat_penalty": sampling.repeat_penalty, "repeat_last_n": sampling.repeat_last_n,
                       "presence_penalty": sampling.presence_penalty, "frequency_penalty": sampling.frequency_penalty,
                       "dry_multiplier": sampling.dry_multiplier, "dry_base": sampling.dry_base,
                       "dry_allowed_length": sampling.dry_allowed_length,
                       "dry_penalty_last_n": sampling.dry_penalty_last_n,
                       "stop": [], "stream": False},
        },
        "total_slots": slots,
        "model_path": config.model,
        "chat_template": config.chat_template,
        "modalities": {"vision": False, "audio": False},
        "build_info": f"specchat {version('specchat')}",
        "is_sleeping": False,
    }
