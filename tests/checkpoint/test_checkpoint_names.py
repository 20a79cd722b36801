"""checkpoint/names.py: a checkpoint's tensor names as transformers 5's model names its modules,
from the family its config.json declares."""

import json

import pytest

from specchat.checkpoint.names import model_names, model_type
from specchat.errors import SpecchatError

MIXTRAL_STORED = ["model.layers.0.block_sparse_moe.gate.weight",
                  "model.layers.0.block_sparse_moe.experts.3.w1.qweight",
                  "model.layers.0.block_sparse_moe.experts.3.w3.scales",
                  "model.layers.1.block_sparse_moe.experts.12.w2.g_idx",
                  "model.layers.0.self_attn.q_proj.qweight", "lm_head.weight"]


def test_a_mixtral_checkpoints_moe_blocks_and_expert_linears_take_the_models_names():
    assert model_names("mixtral", MIXTRAL_STORED) == {
        "model.layers.0.mlp.gate.weight": MIXTRAL_STORED[0],
        "model.layers.0.mlp.experts.3.gate_proj.qweight": MIXTRAL_STORED[1],
        "model.layers.0.mlp.experts.3.up_proj.scales": MIXTRAL_STORED[2],
        "model.layers.1.mlp.experts.12.down_proj.g_idx": MIXTRAL_STORED[3],
        "model.layers.0.self_attn.q_proj.qweight": MIXTRAL_STORED[4],  # no MoE name: as stored
        "lm_head.weight": MIXTRAL_STORED[5],
    }


@pytest.mark.parametrize("family", ["qwen3_moe", "llama", None])
def test_other_families_keep_the_names_they_store(family):
    assert model_names(family, MIXTRAL_STORED) == {name: name for name in MIXTRAL_STORED}


def test_a_checkpoint_naming_one_tensor_twice_is_refused_in_one_line():
    names = ["model.layers.0.block_sparse_moe.gate.weight", "model.layers.0.mlp.gate.weight"]
    with pytest.raises(SpecchatError, match="holds both 'model.layers.0.block_sparse_moe.gate.weight' and "
                                            "'model.layers.0.mlp.gate.weight', which name one tensor") as refused:
        model_names("mixtral", names)
    assert "\n" not in str(refused.value)


def test_the_family_is_the_model_type_its_config_declares(tmp_path):
    assert model_type(tmp_path) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral", "hidden_size": 8}))
    assert model_type(tmp_path) == "mixtral"
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    assert model_type(tmp_path) is None
