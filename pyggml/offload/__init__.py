"""Where tensors go: offload configs (schema and YAML: `config`), rule resolution into an
`OffloadPlan` (`rules`), and llama.cpp's flags translated to configs."""

from pyggml.offload.rules import (CPU, KINDS, DeviceCatalog, DeviceInfo, OffloadPlan, Placement,
                                  RuleReport, RunSettings, config_from_flags, layer_of,
                                  llama_flags, pin_phase_ops, plan_from_args, plan_from_config,
                                  shell_join, tensor_kind, VirtualSpec)

__all__ = ["CPU", "KINDS", "DeviceCatalog", "DeviceInfo", "OffloadPlan", "Placement",
           "RuleReport", "RunSettings", "config_from_flags", "layer_of", "llama_flags",
           "pin_phase_ops", "plan_from_args", "plan_from_config", "shell_join", "tensor_kind", "VirtualSpec"]
