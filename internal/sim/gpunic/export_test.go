// SPDX-License-Identifier: Apache-2.0

package gpunic

// Launches is how many GPU operations n has started.
func Launches(n *NIC) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.launches
}
