// SPDX-License-Identifier: Apache-2.0

// The layout of the Mooncake structs PxnRdmaTransport shares with the engine,
// as the translation unit that expands PXN_MOONCAKE_DEFINE_LAYOUT sees them.
//
// Mooncake chooses these layouts with compile definitions (WITH_METRICS,
// USE_EVENT_DRIVEN_COMPLETION, ENABLE_MULTI_PROTOCOL, USE_EFA, ...) that its
// CMake sets as directory properties, not as usage requirements of the
// transfer_engine target: a file compiled outside Mooncake's tree sees other
// layouts than the engine it links with. The patched multi_transport.cpp
// exports the engine's view (pxn_mooncake_engine_layout), the transport its
// own (pxn_mooncake_transport_layout); PxnRdmaTransport::install refuses to
// start when they differ.
#ifndef PXN_MOONCAKE_PXN_LAYOUT_H
#define PXN_MOONCAKE_PXN_LAYOUT_H

#include <cstddef>
#include <cstdint>
#include <string>

#include "transfer_metadata.h"
#include "transport/rdma_transport/rdma_transport.h"
#include "transport/transport.h"

struct pxn_layout_field {
    const char *name;
    uint64_t value;
};

// Every size and offset the transport relies on. offsetof on Mooncake's
// structs (not standard-layout) is what GCC and Clang compute for them; the
// warning about it is silenced where the list is expanded.
#define PXN_MOONCAKE_LAYOUT_FIELDS(X)                              \
    X(sizeof(mooncake::Transport))                                 \
    X(sizeof(mooncake::RdmaTransport))                             \
    X(sizeof(mooncake::Transport::TransferRequest))                \
    X(offsetof(mooncake::Transport::TransferRequest, opcode))      \
    X(offsetof(mooncake::Transport::TransferRequest, source))      \
    X(offsetof(mooncake::Transport::TransferRequest, target_id))   \
    X(offsetof(mooncake::Transport::TransferRequest, target_offset)) \
    X(offsetof(mooncake::Transport::TransferRequest, length))      \
    X(sizeof(mooncake::Transport::Slice))                          \
    X(offsetof(mooncake::Transport::Slice, source_addr))           \
    X(offsetof(mooncake::Transport::Slice, length))                \
    X(offsetof(mooncake::Transport::Slice, opcode))                \
    X(offsetof(mooncake::Transport::Slice, target_id))             \
    X(offsetof(mooncake::Transport::Slice, peer_nic_path))         \
    X(offsetof(mooncake::Transport::Slice, source_location))       \
    X(offsetof(mooncake::Transport::Slice, status))                \
    X(offsetof(mooncake::Transport::Slice, task))                  \
    X(offsetof(mooncake::Transport::Slice, cleanup_callback))      \
    X(offsetof(mooncake::Transport::Slice, rdma.dest_addr))        \
    X(offsetof(mooncake::Transport::Slice, ts))                    \
    X(sizeof(mooncake::Transport::TransferTask))                   \
    X(offsetof(mooncake::Transport::TransferTask, slice_count))    \
    X(offsetof(mooncake::Transport::TransferTask, success_slice_count)) \
    X(offsetof(mooncake::Transport::TransferTask, failed_slice_count)) \
    X(offsetof(mooncake::Transport::TransferTask, transferred_bytes)) \
    X(offsetof(mooncake::Transport::TransferTask, is_finished))    \
    X(offsetof(mooncake::Transport::TransferTask, total_bytes))    \
    X(offsetof(mooncake::Transport::TransferTask, batch_id))       \
    X(offsetof(mooncake::Transport::TransferTask, request))        \
    X(offsetof(mooncake::Transport::TransferTask, request_count))  \
    X(offsetof(mooncake::Transport::TransferTask, slice_list))     \
    X(sizeof(mooncake::Transport::BatchDesc))                      \
    X(offsetof(mooncake::Transport::BatchDesc, id))                \
    X(offsetof(mooncake::Transport::BatchDesc, batch_size))        \
    X(offsetof(mooncake::Transport::BatchDesc, task_list))         \
    X(sizeof(mooncake::TransferMetadata::BufferDesc))              \
    X(offsetof(mooncake::TransferMetadata::BufferDesc, name))      \
    X(offsetof(mooncake::TransferMetadata::BufferDesc, addr))      \
    X(offsetof(mooncake::TransferMetadata::BufferDesc, length))    \
    X(offsetof(mooncake::TransferMetadata::BufferDesc, lkey))      \
    X(offsetof(mooncake::TransferMetadata::BufferDesc, rkey))      \
    X(sizeof(mooncake::TransferMetadata::SegmentDesc))             \
    X(offsetof(mooncake::TransferMetadata::SegmentDesc, name))     \
    X(offsetof(mooncake::TransferMetadata::SegmentDesc, buffers))

#define PXN_MOONCAKE_LAYOUT_ENTRY(expr) {#expr, static_cast<uint64_t>(expr)},

// Defines extern "C" size_t NAME(const pxn_layout_field **out): this
// translation unit's view, in a table of its own (internal linkage, so two
// files compiled under different definitions never share one).
#define PXN_MOONCAKE_DEFINE_LAYOUT(NAME)                                  \
    _Pragma("GCC diagnostic push")                                       \
    _Pragma("GCC diagnostic ignored \"-Winvalid-offsetof\"")             \
    static const pxn_layout_field NAME##_fields[] = {                    \
        PXN_MOONCAKE_LAYOUT_FIELDS(PXN_MOONCAKE_LAYOUT_ENTRY)};           \
    _Pragma("GCC diagnostic pop")                                        \
    extern "C" size_t NAME(const pxn_layout_field **out) {               \
        *out = NAME##_fields;                                            \
        return sizeof NAME##_fields / sizeof NAME##_fields[0];           \
    }

extern "C" size_t pxn_mooncake_engine_layout(const pxn_layout_field **out);
extern "C" size_t pxn_mooncake_transport_layout(const pxn_layout_field **out);

namespace mooncake {

// The first difference between two views, said as "NAME: A here, B there";
// empty when they agree.
inline std::string pxnLayoutMismatch(const pxn_layout_field *a, size_t na,
                                     const pxn_layout_field *b, size_t nb) {
    if (na != nb)
        return "layout tables differ in length: " + std::to_string(na) +
               " fields and " + std::to_string(nb);
    for (size_t i = 0; i < na; i++) {
        if (std::string(a[i].name) != b[i].name)
            return std::string("layout tables list ") + a[i].name + " and " +
                   b[i].name + " at index " + std::to_string(i);
        if (a[i].value != b[i].value)
            return std::string(a[i].name) + ": " + std::to_string(a[i].value) +
                   " and " + std::to_string(b[i].value);
    }
    return "";
}

}  // namespace mooncake

#endif
