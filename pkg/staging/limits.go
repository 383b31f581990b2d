// SPDX-License-Identifier: Apache-2.0

package staging

import "github.com/pxn-project/pxn/pkg/contract"

// The contract's limits are the ABI's sizes: the registry header's rail and
// HCA fields, the slot (the first Piece's cap) and the parts of a slot (a
// failing line is a negative array length).
var (
	_ [contract.MaxRailName - len(Header{}.Rail)]struct{}
	_ [len(Header{}.Rail) - contract.MaxRailName]struct{}
	_ [contract.MaxHCAName - len(Header{}.HCA)]struct{}
	_ [len(Header{}.HCA) - contract.MaxHCAName]struct{}
	_ [contract.MaxFirstPieceKiB<<10 - SlotSize]struct{}
	_ [SlotSize - contract.MaxFirstPieceKiB<<10]struct{}
	_ [contract.MaxSlotParts - MaxParts]struct{}
	_ [MaxParts - contract.MaxSlotParts]struct{}
)
