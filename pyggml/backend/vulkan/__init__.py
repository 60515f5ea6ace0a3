"""The Vulkan backend (see `backend.py`): the registry entry point and public names."""

from pyggml.backend.vulkan.backend import (REQUIRED_SHADERS, VulkanBackend, VulkanBuffer,
                                           VulkanBufferType, VulkanDevice, VulkanMemoryError,
                                           backend_reg, devices, open_device,
                                           unavailable_reason)

__all__ = ["REQUIRED_SHADERS", "VulkanBackend", "VulkanBuffer", "VulkanBufferType",
           "VulkanDevice", "VulkanMemoryError", "backend_reg", "devices", "open_device",
           "unavailable_reason"]
