/* FNV-1a 64: the content hash ggml's RPC protocol names cached tensors by (rpc-server -c looks up
 * <cache dir>/<hash as %016llx>). Byte-serial by definition, hence C: Python would take seconds
 * per megabyte. */
#include "pyggml.h"

uint64_t pg_fnv1a64(const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
