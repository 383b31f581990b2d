// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"errors"
	"fmt"
)

// The name rules. Every rail name a rail strategy can produce fits
// RailNamePattern: pci-order's rail0.., subnet's IPv4 CIDR (10.1.0.0/24, at
// most 18 bytes), IPv6 CIDR (fd00:1:2:3::/64, at most 43 bytes) and
// InfiniBand GID subnet prefix (fe80:0000:0000:0000, 19 bytes). MaxRailName
// and MaxHCAName are the sizes of the rail and HCA fields of the registry's
// control-file header (docs/abi.md), where each rank publishes its own rail
// and HCA; the engine refuses a rail map naming anything longer. Patterns are
// in the RE2/ECMAScript subset that Go, the CRD's OpenAPI schema and the
// chart's JSON schema all read the same way.
const (
	MaxRailName     = 48
	RailNameChars   = "A-Za-z0-9_.:/-"
	RailNamePattern = `^[A-Za-z0-9_.:/-]{1,48}$`

	MaxHCAName     = 56
	HCANameChars   = "A-Za-z0-9_.-"
	HCANamePattern = `^[A-Za-z0-9_.-]{1,56}$`

	// A group id is one path element of the registry folder's name, so "."
	// and ".." are refused besides the pattern.
	MaxGroupID     = 64
	GroupIDChars   = "A-Za-z0-9_.-"
	GroupIDPattern = `^[A-Za-z0-9_.-]{1,64}$`
)

// ValidateRailName checks a rail name against RailNamePattern. The error
// says what is wrong but not the name; the caller adds it.
func ValidateRailName(s string) error {
	return checkName(s, MaxRailName, RailNameChars, true)
}

// ValidateHCAName checks an HCA name against HCANamePattern. The error says
// what is wrong but not the name; the caller adds it.
func ValidateHCAName(s string) error {
	return checkName(s, MaxHCAName, HCANameChars, false)
}

// ValidateGroupID checks a group id: GroupIDPattern, and neither "." nor
// "..". The error says what is wrong but not the id; the caller adds it.
func ValidateGroupID(id string) error {
	if id == "." || id == ".." {
		return errors.New(`"." and ".." are not group ids`)
	}
	return checkName(id, MaxGroupID, GroupIDChars, false)
}

func checkName(s string, limit int, chars string, railChars bool) error {
	if s == "" || len(s) > limit {
		return fmt.Errorf("length %d not in 1..%d", len(s), limit)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-' ||
			railChars && (c == ':' || c == '/') {
			continue
		}
		return fmt.Errorf("byte %d (%+q) not in [%s]", i, c, chars)
	}
	return nil
}
