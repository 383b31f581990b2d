// SPDX-License-Identifier: Apache-2.0

// The shared structs as a file compiled with WITH_METRICS turned the other way
// sees them: what a transport built outside Mooncake's tree, without the
// engine's definitions, would see. layout_test checks that the comparison
// catches it. Only sizes and offsets are taken here; no code of the skewed
// structs is emitted.
#ifdef WITH_METRICS
#undef WITH_METRICS
#else
#define WITH_METRICS 1
#endif

#include "pxn_layout.h"

PXN_MOONCAKE_DEFINE_LAYOUT(pxn_mooncake_skewed_layout)
