"""Where tensors go: offload configs (schema and YAML: `config`), the plan they make (`plan`),
rule resolution (`rules`), the devices a config brings (`devices`), llama.cpp's flags as configs
and back (`flags`) and the plan applied to a graph at run time (`pinning`). The device catalog
is pyggml.backend.catalog's (re-exported here)."""

from pyggml.backend.catalog import CPU, DeviceCatalog, DeviceInfo, VirtualSpec
from pyggml.offload.config import KINDS
from pyggml.offload.flags import config_from_flags, llama_flags, plan_from_args, shell_join
from pyggml.offload.pinning import pin_phase_ops
from pyggml.offload.plan import (OffloadPlan, Placement, RuleReport, is_expert, layer_of,
                                 tensor_kind)
from pyggml.offload.rules import plan_from_config

__all__ = ["CPU", "KINDS", "DeviceCatalog", "DeviceInfo", "OffloadPlan", "Placement",
           "RuleReport", "VirtualSpec", "config_from_flags", "is_expert", "layer_of",
           "llama_flags", "pin_phase_ops", "plan_from_args", "plan_from_config", "shell_join",
           "tensor_kind"]
