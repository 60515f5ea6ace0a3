"""The Vulkan backend (see `backend.py`): the registry entry point and public names."""

from pyggml.backend.vulkan.backend import (VulkanBackend, VulkanBuffer, VulkanBufferType,
                                           VulkanDevice, VulkanMemoryError, backend_reg, devices,
                                           open_device, unavailable_reason)
from pyggml.backend.vulkan.shaders import required_shaders

__all__ = ["VulkanBackend", "VulkanBuffer", "VulkanBufferType",
           "VulkanDevice", "VulkanMemoryError", "backend_reg", "devices", "open_device",
           "required_shaders", "unavailable_reason"]
