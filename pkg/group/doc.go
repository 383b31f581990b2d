// SPDX-License-Identifier: Apache-2.0

// Package group is what PXN's two node plugins (the device plugin and the DRA
// driver) agree on about a group, the members of one job on a node: its key,
// its host folder and how that folder is checked, the environment and
// mount every member container gets, and the owner records that name the
// pods holding the folder, which the node agent reads.
package group
