"""The data model every layer shares: the trace of one iteration and the plan made for it.

Plain frozen dataclasses, JSON on disk (docs/traces.md describes a trace and its file).
"""

from .check import PlanMismatchError, check_plan, expect_trace
from .conv import CONV_KERNELS, ConvParams, MicroBatch, conv_output_size, conv_temps
from .plan import ACTIONS, PLAN_SCHEMA, PLAN_VERSION, Action, Decision, Plan, PoolSlot
from .plan_file import read_plan, write_plan
from .hookpoints import Call, Mark, Saved
from .trace import KINDS, OWNER_KINDS, PHASES, READABLE_VERSIONS, SCHEMA, SCHEMA_VERSION, Layer, Op, Owner, Storage, Trace

__all__ = ["ACTIONS", "CONV_KERNELS", "Call", "Mark", "READABLE_VERSIONS", "Saved", "ConvParams", "KINDS", "PHASES", "PLAN_SCHEMA", "PLAN_VERSION", "SCHEMA",
           "SCHEMA_VERSION", "Action", "Decision", "Layer", "MicroBatch", "OWNER_KINDS", "Op", "Owner", "Plan", "PlanMismatchError",
           "PoolSlot", "Storage", "Trace", "check_plan", "conv_output_size", "conv_temps", "expect_trace", "read_plan",
           "write_plan"]
