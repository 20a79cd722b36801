"""What `gpu_check.sh --scale` builds and measures: the paper's sizes on a GPU (a Llama-2-70B-GPTQ-
shaped target, a Llama-2-7B-shaped draft), or the same code over shrunk widths for `--dry-run`, which
runs on any device (the CPU suite runs it, so that the scale check cannot rot between GPU runs)."""

from dataclasses import dataclass, field, replace

TARGET_ALIAS = "llama-2-70b-gptq"  # 4-bit GPTQ, act-order, group -1 (models/configs/)
DRAFT_ALIAS = "llama-2-7b"
DRAFT_SCALED_LAYERS = 32  # the draft's step time is reported for a whole Llama-2-7B (scaled where fewer are built)


@dataclass(frozen=True)
class ScaleSizes:
    layers: int  # target decoder layers built, of the alias's 80: a ring of SLOTS is smaller than a pass
    cached: int  # tokens in the cache before every measured pass
    trees: tuple[int, ...]  # tree sizes of the target's passes; the verdict compares the last with the first
    linear_rows: tuple[int, ...]  # input rows of the per-linear table
    draft_layers: int
    draft_widths: tuple[int, ...]
    gemm_rows: tuple[int, ...]  # input rows at which int4_gemm's blocks are swept (gpu_checks/scale_gemm.py)
    target_shrink: dict = field(default_factory=dict)  # config overrides: empty at the paper's sizes
    draft_shrink: dict = field(default_factory=dict)
    moe_shrink: dict = field(default_factory=dict)  # the MoE target's (gpu_checks/scale_moe.py)

    @property
    def dry_run(self) -> bool:
        return bool(self.target_shrink)


SLOTS = 2
PARTS = ("passes", "linears", "draft", "moe", "gemm", "profile")  # what --scale measures, in order; --parts picks some
# the draft whole: a step's fixed costs (the tree's mask and positions moved to the device, a graph's
# replay) scaled from 2 of 32 layers counted 16 times, and the H200's captured step read 11-19 ms at 1-256 tokens
FULL = ScaleSizes(layers=4, cached=512, trees=(1, 64, 256, 1024, 2048), linear_rows=(1, 16, 256, 1024, 2048),
                  draft_layers=DRAFT_SCALED_LAYERS, draft_widths=(1, 16, 64, 256, 512, 1024), gemm_rows=(1, 16, 64, 256))
# hidden 256 in heads of 64 (one KV head: the alias's grouped attention), so that every linear's
# outputs are whole tiles of the CPU's int4 layout (64 rows)
DRY = ScaleSizes(layers=3, cached=32, trees=(1, 16, 64), linear_rows=(1, 16, 64), draft_layers=2,
                 draft_widths=(1, 16, 64), gemm_rows=(1, 16),
                 target_shrink={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
                                "num_key_value_heads": 1, "vocab_size": 512},
                 draft_shrink={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
                               "num_key_value_heads": 4, "vocab_size": 512},
                 moe_shrink={"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
                             "num_key_value_heads": 1, "vocab_size": 512})


def scale_sizes(dry_run: bool, layers: int | None) -> ScaleSizes:
    """FULL or DRY, with `layers` target layers where given."""
    sizes = DRY if dry_run else FULL
    return sizes if layers is None else replace(sizes, layers=layers)
