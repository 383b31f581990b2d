// SPDX-License-Identifier: Apache-2.0

package staging

// CanonicalRail is the rail of hca under railMap (a map that
// contract.ParseRailMap accepted): the mapped name, or hca itself when it is
// not mapped.
func CanonicalRail(railMap map[string]string, hca string) string {
	if rail, ok := railMap[hca]; ok {
		return rail
	}
	return hca
}
