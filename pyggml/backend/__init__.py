"""Backends: where tensors live and ops run. `base` holds the interfaces (Registry → Device →
BufferType → Buffer, Backend); each device kind is one module (`cpu`, later `vulkan`)."""
