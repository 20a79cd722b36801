"""One memory plan for the whole machine: every byte specchat will hold, on every tier, counted
before anything is loaded or downloaded.

The device holds the target's fixed parts (beside a GPU all but an untied input embedding), its
resident layers and the streaming ring; the draft's weights in the quantization it will use; both
KV caches, each at its own bytes per token, for the context plus the largest tree, once for each
conversation kept at once (serve's slots: each keeps its caches to reuse them); the largest
pass's activations (a target pass over the tree, or a draft step as wide: they never run at once);
the quantized kernels' workspace; and on a GPU a margin for the CUDA context. The host holds the
pinned RAM tier and staging as the allocator rounds them (`offload/pinned_chunks.py`), the draft's
weights while they load through RAM, RAM kept back for the OS, and that input embedding.

When the pair does not fit as asked, `auto` chooses what a user would (plan/choice.py): the draft
form with the shortest predicted iteration where each form's step was measured on this machine and
the links' speeds are known, else the one that streams the fewest bytes per pass (fewer resident
layers are the placement's own answer), then a smaller tree, then a smaller context. Where nothing
fits, one line names the tier, the bytes missing and the option that would make it fit. Pure
arithmetic, as `placement` is.
"""

from dataclasses import dataclass, replace

from specchat.errors import PlanRefusal
from specchat.machine_links import Links
from specchat.offload.direct_io import align_up
from specchat.offload.pinned_chunks import pinned_bytes, pinned_tier_bytes
from specchat.offload.placement import Placement, resident_bytes
from specchat.plan.choice import chosen
from specchat.plan.demand import ModelShape
from specchat.plan.draft_form import Draft
from specchat.plan.placement import MIN_SLOTS, ModelSizes, Request, Rooms, place
from specchat.transfer import gb

GIB = 2**30
# The CUDA context (~0.3-0.5 GB once created), cuBLAS workspaces and the caching allocator's
# fragmentation: kept free on a GPU whatever the plan.
CUDA_MARGIN = GIB
OS_RESERVE = 10**9  # RAM left to the OS and the page cache that checkpoint reads pass through
SMALLEST_CONTEXT = 1024  # auto shrinks a default context no further

FIXED = "fixed parts"  # the plan's line for the target's weights outside its decoder layers
DENSE_COPIES = "dense copies of the 4-bit linears for tree passes"  # quant/int4_dense.py's, where kept
EXPERT_CACHE = "the most-routed experts of streamed layers"  # offload/expert_cache.py's, where kept
DRAFT_EMBEDDING = "the draft's input embedding, looked up on the host"  # Draft.host_embedding


@dataclass(frozen=True)
class Item:
    """One line of the plan: `nbytes` of `what` on a tier ("device" or "host")."""

    tier: str
    what: str
    nbytes: int


@dataclass(frozen=True)
class Target:
    sizes: ModelSizes  # its decoder layers and fixed parts (headroom 0: the plan adds it)
    shape: ModelShape
    compact_fixed: int | None = None  # its fixed parts with the LM head in Q6_K (quant/q6k_linear.py), when it has one
    # its layers' sizes with their Q6_K linears and Q4_K scales as stored (its `fixed` unread: `sizes`' stands)
    compact_layers: ModelSizes | None = None
    host_embedding: int = 0  # its input embedding's bytes, held on the host (offload/host_embedding.py)

    def embedding_on_host(self, nbytes: int) -> "Target":
        """Itself with `nbytes` of input embedding held on the host, out of the device's fixed parts."""
        if not nbytes:
            return self
        compact = None if self.compact_fixed is None else self.compact_fixed - nbytes
        return replace(self, sizes=replace(self.sizes, fixed=self.sizes.fixed - nbytes), compact_fixed=compact,
                       host_embedding=nbytes)

    def forms(self) -> tuple[tuple["Target", bool], ...]:
        """Itself, then (when it has one) itself with its LM head in Q6_K: (target, compact head)."""
        if self.compact_fixed is None:
            return ((self, False),)
        compact = replace(self, sizes=replace(self.sizes, fixed=self.compact_fixed), compact_fixed=None)
        return (self, False), (compact, True)

    def layer_forms(self) -> tuple[tuple["Target", bool], ...]:
        """Itself, then (when it has them) itself with its layers' Q6_K linears and Q4_K scales as
        the GGUF stores them: (target, compact layers). The plan takes whichever streams fewer
        bytes, the first on a tie."""
        if self.compact_layers is None:
            return ((self, False),)
        sizes = replace(self.compact_layers, fixed=self.sizes.fixed, headroom=self.sizes.headroom)
        return (self, False), (replace(self, sizes=sizes, compact_layers=None), True)


@dataclass(frozen=True)
class Ask:
    """What the run asks for (a `PlanRequest`, plan/request.py) as the arithmetic takes it once the
    model is measured: each tree with its kernels' workspace, the placement's share of the options
    (`request`). `contexts` and `drafts` are in order of preference (one each when the user fixed
    it, several when auto may choose)."""

    contexts: tuple[int, ...]
    drafts: tuple[Draft | None, ...]  # (None,): no draft
    tree_tokens: int  # the largest tree a pass scores
    workspace: int  # the quantized kernels' largest temporary (quant's stated bound)
    request: Request = Request()
    cuda: bool = False
    # (largest pass, the quantized kernels' workspace at it) auto may fall back to, in order, before a smaller context
    smaller_trees: tuple[tuple[int, int], ...] = ()
    links: Links = Links()  # the offload links' speeds, where known
    conversations: int = 1  # KV caches kept at once (serve's --slots)


@dataclass(frozen=True)
class MemoryPlan:
    placement: Placement
    context: int
    draft: Draft | None
    items: tuple[Item, ...]  # every byte, tier by tier
    rooms: Rooms  # what each tier offered, before the plan's margins
    notes: tuple[str, ...]  # what auto chose, and why
    tree_tokens: int  # the largest pass it made room for: a tree of tree_tokens - 1 nodes and its root
    compact_head: bool = False  # the target's LM head kept in Q6_K, expanded a chunk at a time each pass
    compact_layers: bool = False  # its layers' Q6_K linears and Q4_K scales as the GGUF stores them
    conversations: int = 1  # KV caches it keeps room for, one a conversation kept at once (serve's slots)

    def total(self, tier: str) -> int:
        return sum(item.nbytes for item in self.items if item.tier == tier)

    @property
    def dense_copies(self) -> int:
        """Bytes of the 4-bit linears' dense copies for wide inputs the plan keeps (its DENSE_COPIES item)."""
        return sum(item.nbytes for item in self.items if item.what == DENSE_COPIES)

    @property
    def embedding_on_host(self) -> bool:
        """Whether the target's input embedding is held on the host (offload/host_embedding.py)."""
        return any(item.tier == "host" and item.what.startswith(FIXED) for item in self.items)

    @property
    def draft_embedding_on_host(self) -> bool:
        """Whether the draft's input embedding is held on the host (Draft.host_embedding)."""
        return self.draft is not None and self.draft.host_embedding > 0

    def target_bytes(self) -> int:
        """The target's weights as planned: its fixed parts and every decoder layer, wherever it lives."""
        return sum(item.nbytes for item in self.items if item.what.startswith(FIXED)) + sum(self.placement.layers)


def plan_memory(target: Target, ask: Ask, rooms: Rooms) -> MemoryPlan:
    """The plan for the first context (in `ask`'s order) and, within it, the first largest tree
    at which some draft fits, with the draft form `chosen` prefers there; one-line PlanRefusal when
    none does. A smaller tree comes before a smaller context: --budget auto grows trees of tens to
    a few hundred tokens (docs/benchmarks.md), far below its cap, while the context bounds a chat.
    Where the target's layers hold Q6_K linears, their compact form is weighed like a draft: the
    plan that streams fewer bytes wins (the dense one when nothing streams)."""
    trees = ((ask.tree_tokens, ask.workspace), *ask.smaller_trees)
    failures: dict[Draft | None, PlanRefusal] = {}  # by draft, from the last (smallest) form, tree and context tried
    for context in ask.contexts:
        for form, compact in target.forms():
            for tree, workspace in trees:
                sized = replace(ask, tree_tokens=tree, workspace=workspace)
                plans = []
                for layered, compact_layers in form.layer_forms():
                    for draft in ask.drafts:
                        try:
                            plans.append(replace(plan_one(layered, sized, rooms, context, draft), compact_head=compact,
                                                 compact_layers=compact_layers))
                        except PlanRefusal as error:
                            failures[draft] = error  # another form, draft, tree or context may fit
                if plans:
                    return chosen(ask, plans)
    smallest = target.forms()[-1][0].layer_forms()[-1][0]
    raise refusal(smallest, replace(ask, tree_tokens=trees[-1][0], workspace=trees[-1][1]), rooms, failures)


def plan_one(target: Target, ask: Ask, rooms: Rooms, context: int, draft: Draft | None) -> MemoryPlan:
    device, host = demands(target, ask, context, draft)
    fixed = fixed_items(target)
    host = [*(item for item in fixed if item.tier == "host"), *host]
    reserved = target.sizes.fixed + sum(item.nbytes for item in device)
    check_device(target, ask, rooms, [Item("device", FIXED, target.sizes.fixed), *device])
    host_left = None if rooms.host is None else rooms.host - sum(item.nbytes for item in host)
    if host_left is not None and host_left < 0:
        raise PlanRefusal(f"{rooms.host_name} is {gb(-host_left)} short of what loading and the OS need "
                          f"({', '.join(item.what for item in host)})", "host", -host_left)
    sizes = replace(target.sizes, headroom=reserved - target.sizes.fixed)
    placement = place(sizes, replace(rooms, host=host_left), ask.request)
    items = (*(item for item in fixed if item.tier == "device"), *device, *layer_items(placement, rooms), *host)
    return MemoryPlan(placement, context, draft, items, rooms, (), ask.tree_tokens, conversations=ask.conversations)


def fixed_items(target: Target) -> tuple[Item, ...]:
    """The target's weights outside its layers: on the device, and its input embedding on the host
    where it is held there."""
    if not target.host_embedding:
        return (Item("device", f"{FIXED} (embeddings, final norm, LM head)", target.sizes.fixed),)
    return (Item("device", f"{FIXED} (final norm, LM head)", target.sizes.fixed),
            Item("host", f"{FIXED}: the input embedding", target.host_embedding))


def check_device(target: Target, ask: Ask, rooms: Rooms, device: list[Item]) -> None:
    """The device must hold everything but the layers, and the smallest ring beside it (or every
    layer, when all are asked to be resident); else one line: how much is missing, and for what."""
    layers = target.sizes.layers
    resident = ask.request.resident_layers or 0
    ring = 0 if resident >= len(layers) else MIN_SLOTS * align_up(max(layers))
    need = sum(item.nbytes for item in device) + resident_bytes(layers, resident, target.sizes.heads) + ring
    if need > rooms.device:
        largest = sorted(device, key=lambda item: -item.nbytes)[:4]
        parts = ", ".join(f"{item.what} {gb(item.nbytes)}" for item in largest)
        what = f"{resident} resident layers" if resident else "the smallest streaming ring"
        raise PlanRefusal(f"{rooms.device_name} is {gb(need - rooms.device)} short: {gb(need)} are needed for "
                          f"{what} beside {parts} and the rest", "device", need - rooms.device)


def demands(target: Target, ask: Ask, context: int, draft: Draft | None) -> tuple[list[Item], list[Item]]:
    """Everything but the target's fixed parts and layers: (device items, host items)."""
    tokens = context + ask.tree_tokens
    passes = [target.shape.pass_bytes(context, ask.tree_tokens)]
    device = [kv_item("target", target.shape, tokens, ask.conversations)]
    host = []
    if draft is not None:
        device += [Item("device", f"draft weights ({draft.quant})", draft.weights),
                   kv_item("draft", draft.shape, tokens, ask.conversations)]
        passes.append(draft.shape.pass_bytes(context, ask.tree_tokens))
        if draft.host_embedding:
            host.append(Item("host", DRAFT_EMBEDDING, draft.host_embedding))
        if ask.cuda and draft.load_bytes:
            host.append(Item("host", "draft weights while they load", draft.load_bytes))
        elif draft.prepare_bytes:
            # the ring, placed before the draft loads, must leave room for its layer in preparation
            device.append(Item("device", f"the draft's layer while it turns {draft.quant}", draft.prepare_bytes))
    device.append(Item("device", f"largest pass ({ask.tree_tokens}-token tree)", max(passes)))
    workspace = max(ask.workspace, draft.workspace if draft is not None else 0)  # one product runs at a time
    if workspace:
        device.append(Item("device", "quantized kernels' workspace", workspace))
    if ask.cuda:
        device.append(Item("device", "CUDA context and allocator margin", CUDA_MARGIN))
        host.append(Item("host", "kept for the OS", OS_RESERVE))
    return device, host


def kv_item(model: str, shape: ModelShape, tokens: int, conversations: int) -> Item:
    """A model's KV caches of `tokens` each, one a conversation kept at once."""
    if conversations == 1:
        return Item("device", f"{model} KV cache ({tokens} tokens)", shape.kv_bytes(tokens))
    return Item("device", f"{model} KV caches ({conversations} conversations of {tokens} tokens)",
                conversations * shape.kv_bytes(tokens))


def layer_items(placement: Placement, rooms: Rooms) -> list[Item]:
    """The decoder layers' bytes on each tier, and the ring's."""
    items = [Item("device", f"{placement.resident} resident decoder layers", placement.resident_bytes)]
    if placement.slots:
        items.append(Item("device", f"ring of {placement.slots} slots", placement.slots * placement.slot_bytes))
    if rooms.host is None:  # a CPU: its RAM is the device, the ram tier's layers are resident ones
        return items
    if placement.ram:
        pinned = pinned_tier_bytes([placement.layers[i] for i in placement.ram_layers])
        items.append(Item("host", f"{placement.ram} decoder layers in pinned RAM", pinned))
    if placement.disk:
        items.append(Item("host", f"{placement.slots} pinned staging buffers for disk reads",
                          placement.slots * pinned_bytes(placement.slot_bytes)))
    return items


def refusal(target: Target, ask: Ask, rooms: Rooms, failures: dict[Draft | None, PlanRefusal]) -> PlanRefusal:
    """Why even the smallest draft at the smallest context does not fit (`failures`: each draft's
    refusal there), and the option that would."""
    smallest = min(ask.drafts, key=lambda draft: 0 if draft is None else draft.weights)
    error = failures[smallest]
    hint = fitting_option(target, ask, rooms) or (
        "a smaller draft would fit, or none (--engine autoregressive)"
        if smallest is not None and fits_without_draft(target, ask, rooms) else None)
    return PlanRefusal(error.reason, error.tier, error.missing, hint or error.fits)


def fits_without_draft(target: Target, ask: Ask, rooms: Rooms) -> bool:
    try:
        plan_one(target, ask, rooms, ask.contexts[-1], None)
    except PlanRefusal:
        return False
    return True


def fitting_option(target: Target, ask: Ask, rooms: Rooms) -> str | None:
    """The largest context below those tried that fits with the smallest draft (when it is at least
    SMALLEST_CONTEXT / 4), else None."""
    drafts = sorted(ask.drafts, key=lambda draft: 0 if draft is None else draft.weights)
    low, high = 0, ask.contexts[-1] - 1
    while low < high:  # the largest context below the ones tried at which the smallest draft fits
        middle = (low + high + 1) // 2
        try:
            plan_one(target, ask, rooms, middle, drafts[0])
            low = middle
        except PlanRefusal:
            high = middle - 1
    if low < SMALLEST_CONTEXT // 4:
        return None
    quant = "" if drafts[0] is None or len(ask.drafts) == 1 else f" with the draft in {drafts[0].form}"
    return f"--context {low}{quant} would fit"
