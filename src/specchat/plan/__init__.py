"""The memory plan: where a target, its draft and their caches go on a machine, from the models'
configs (or a local checkpoint's sizes) before anything loads. Its front door: the rest of specchat
imports these names from `specchat.plan`, never a module inside it.

A run's options become the plan's request in one place, `request_for(options, machine, ...)`, for
`run` and `doctor` alike; `plan_pair` plans that request on a machine, and the same request is
`measure_pair`ed once and `plan_measured` under many machines' rooms (doctor's smallest memory limit)."""

from specchat.plan.budget import MemoryPlan
from specchat.plan.choice import drafting_s
from specchat.plan.conversations import AUTO_SLOTS
from specchat.plan.demand import shape_of
from specchat.plan.experts import expert_share, experts_touched
from specchat.plan.machine import Machine, kept_for_page_cache
from specchat.plan.model import MeasuredModel, plan_measured
from specchat.plan.options import (draft_quant_for, offload_directory, quantized_weights, request_for,
                                   resolve_weights)
from specchat.plan.pair import contexts_for, measure_pair, plan_pair, stores_4bit
from specchat.plan.placement import Rooms
from specchat.plan.request import Pair, PlanRequest
from specchat.plan.text import describe_plan

__all__ = ["AUTO_SLOTS", "Machine", "MeasuredModel", "MemoryPlan", "Pair", "PlanRequest", "Rooms", "contexts_for",
           "describe_plan", "draft_quant_for", "drafting_s", "expert_share", "experts_touched", "kept_for_page_cache",
           "measure_pair", "offload_directory", "plan_measured", "plan_pair", "quantized_weights", "request_for",
           "resolve_weights", "shape_of", "stores_4bit"]
