// SPDX-License-Identifier: Apache-2.0

// Package dra is PXN's Dynamic Resource Allocation driver, pxn.io: it
// publishes one shareable relay device per node, with the node's rails as
// attributes, and one rail device per railed HCA, with its PCIe root, rail
// and port health as attributes, and prepares each ResourceClaim allocated to it as one group,
// a host group folder, an owner record naming the claim and its pods, and a
// CDI spec that gives every container of the claim the engine's environment
// and that folder. See docs/dra.md.
package dra
