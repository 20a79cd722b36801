"""What Ollama's clients read of a server before they chat: GET /api/tags (the models), POST
/api/show (one model's template, default parameters and capabilities: oterm fills its settings
and offers tools from these), GET /api/ps (the models running, with their context) and GET
/api/version. One model is served; what specchat does not know of it (size, digest) is left out."""

from importlib.metadata import version

from specchat.serve.endpoint import ServeConfig
from specchat.serve.ollama_request import check_ollama_model
from specchat.serve.schema import Strict


class ShowRequest(Strict):
    model: str = ""
    name: str = ""  # Ollama's older field for the model


def tags(config: ServeConfig, started: str) -> dict:
    return {"models": [listed(config) | {"modified_at": started}]}


def running(config: ServeConfig) -> dict:
    return {"models": [listed(config) | {"context_length": config.context}]}


def listed(config: ServeConfig) -> dict:
    return {"name": config.model, "model": config.model}


def shown(config: ServeConfig, request: ShowRequest, started: str) -> dict:
    """The served model's card; a 404 for any other."""
    check_ollama_model(request.model or request.name, config.model)
    return {"template": config.chat_template, "parameters": parameters(config),
            "modified_at": started, "capabilities": capabilities(config),
            "model_info": {}}  # Ollama's is its GGUF's metadata, which a served checkpoint need not have


def parameters(config: ServeConfig) -> str:
    """The sampling a request leaves out, as Ollama lists a Modelfile's parameters (a line each; no
    seed where each request draws its own, no cut or penalty where it changes nothing)."""
    sampling = config.sampling
    lines = [f"temperature {sampling.temperature}", f"top_p {sampling.top_p}"]
    lines += [f"top_k {sampling.top_k}"] if sampling.top_k else []
    lines += [f"min_p {sampling.min_p}"] if sampling.min_p else []
    lines += [f"typical_p {sampling.typical_p}"] if sampling.typical_p < 1 else []
    lines += [f"mirostat {sampling.mirostat}", f"mirostat_tau {sampling.mirostat_tau}",
              f"mirostat_eta {sampling.mirostat_eta}"] if sampling.mirostat else []
    lines += [f"repeat_penalty {sampling.repeat_penalty}"] if sampling.repeat_penalty != 1 else []
    lines += [f"presence_penalty {sampling.presence_penalty}"] if sampling.presence_penalty else []
    lines += [f"frequency_penalty {sampling.frequency_penalty}"] if sampling.frequency_penalty else []
    lines += [f"repeat_last_n {sampling.repeat_last_n}"] if sampling.penalizes else []
    lines += [] if sampling.seed is None else [f"seed {sampling.seed}"]
    return "\n".join([*lines, f"num_ctx {config.context}"])


def capabilities(config: ServeConfig) -> list[str]:
    """completion always; tools where the chat template declares them; insert (a `suffix`) where
    the tokenizer has fill-in-the-middle tokens."""
    offered = ["completion"]
    if "tools" in config.chat_template:
        offered.append("tools")
    if config.fim is not None:
        offered.append("insert")
    return offered


def server_version() -> dict:
    return {"version": version("specchat")}
