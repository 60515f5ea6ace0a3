"""Remote devices over ggml's RPC protocol (llama.cpp's rpc-server); see `backend.py`.

    from pyggml.backend import rpc
    rpc.register_endpoints(["192.168.1.20:50052"])     # devices RPC[192.168.1.20:50052], ...

or set PYGGML_RPC=host:port[,host:port] before the default registry is first used.
"""

from pyggml.backend.rpc.backend import (ENV_ENDPOINTS, ENV_HASH_MIN, ENV_TIMEOUT, RpcBackend,
                                        RpcBuffer, RpcBufferType, RpcDevice, RpcReg,
                                        backend_reg, connect, connected_endpoints, device_name,
                                        parse_endpoints, register_endpoints, rpc_regs,
                                        unregister_endpoints, why_unsupported)
from pyggml.backend.rpc.protocol import PROTO_VERSION, Connection, RpcError, TrafficStats

__all__ = ["ENV_ENDPOINTS", "ENV_HASH_MIN", "ENV_TIMEOUT", "PROTO_VERSION", "Connection",
           "RpcBackend", "RpcBuffer", "RpcBufferType", "RpcDevice", "RpcError", "RpcReg",
           "TrafficStats", "backend_reg", "connect", "connected_endpoints", "device_name",
           "parse_endpoints", "register_endpoints", "rpc_regs", "unregister_endpoints",
           "why_unsupported"]
