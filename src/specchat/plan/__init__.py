"""The memory plan: where a target, its draft and their caches go on a machine, from the models'
configs (or a local checkpoint's sizes) before anything loads. Its front door: the rest of specchat
imports these names from `specchat.plan`, never a module inside it."""

from specchat.plan.budget import MemoryPlan
from specchat.plan.demand import shape_of
from specchat.plan.experts import expert_share, experts_touched
from specchat.plan.machine import Machine, kept_for_page_cache
from specchat.plan.model import MeasuredModel, plan_measured
from specchat.plan.pair import contexts_for, draft_kinds, measure_pair, plan_pair, stores_4bit
from specchat.plan.placement import Rooms
from specchat.plan.request import Pair, PlanRequest, tree_sizes
from specchat.plan.text import describe_plan

__all__ = ["Machine", "MeasuredModel", "MemoryPlan", "Pair", "PlanRequest", "Rooms", "contexts_for", "describe_plan",
           "draft_kinds", "expert_share", "experts_touched", "kept_for_page_cache", "measure_pair", "plan_measured",
           "plan_pair", "shape_of", "stores_4bit", "tree_sizes"]
