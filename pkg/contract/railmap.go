// SPDX-License-Identifier: Apache-2.0

package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// ParseRailMap parses an EnvRailMap value: one JSON object of raw HCA name
// to rail name. Every key must pass ValidateHCAName and every value
// ValidateRailName. Duplicate keys, anything but string values, trailing
// data, more than MaxRailMapBytes of text and more than MaxRailMapEntries
// entries are errors, each naming the offending value. An empty string or
// an empty object is no map (nil).
func ParseRailMap(s string) (map[string]string, error) {
	if len(s) > MaxRailMapBytes {
		return nil, fmt.Errorf("rail map of %d bytes exceeds %d", len(s), MaxRailMapBytes)
	}
	if strings.Trim(s, " \t\r\n") == "" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	if tok, err := dec.Token(); err != nil {
		return nil, syntaxError(err)
	} else if tok != json.Delim('{') {
		return nil, fmt.Errorf("rail map is not a JSON object (starts with %v)", tokenKind(tok))
	}
	var m map[string]string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxError(err)
		}
		hca, _ := tok.(string)
		if err := ValidateHCAName(hca); err != nil {
			return nil, fmt.Errorf("rail map: HCA name %s: %w", Quote(hca), err)
		}
		if _, dup := m[hca]; dup {
			return nil, fmt.Errorf("rail map: duplicate HCA name %s", Quote(hca))
		}
		if len(m) == MaxRailMapEntries {
			return nil, fmt.Errorf("rail map has more than %d entries", MaxRailMapEntries)
		}
		if tok, err = dec.Token(); err != nil {
			return nil, syntaxError(err)
		}
		rail, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("rail map: HCA %s maps to %v, want a string", Quote(hca), tokenKind(tok))
		}
		if err := ValidateRailName(rail); err != nil {
			return nil, fmt.Errorf("rail map: HCA %s: rail name %s: %w", Quote(hca), Quote(rail), err)
		}
		if m == nil {
			m = make(map[string]string)
		}
		m[hca] = rail
	}
	if _, err := dec.Token(); err != nil {
		return nil, syntaxError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("rail map: data after the JSON object")
	}
	return m, nil
}

// EncodeRailMap is the EnvRailMap value of m: compact JSON with sorted keys,
// "{}" for an empty or nil map. It refuses what ParseRailMap would refuse, so
// that whatever it returns the engine accepts and reads back as m.
func EncodeRailMap(m map[string]string) (string, error) {
	if len(m) > MaxRailMapEntries {
		return "", fmt.Errorf("rail map has %d entries, more than %d", len(m), MaxRailMapEntries)
	}
	hcas := make([]string, 0, len(m))
	for hca, rail := range m {
		if err := ValidateHCAName(hca); err != nil {
			return "", fmt.Errorf("rail map: HCA name %s: %w", Quote(hca), err)
		}
		if err := ValidateRailName(rail); err != nil {
			return "", fmt.Errorf("rail map: HCA %s: rail name %s: %w", Quote(hca), Quote(rail), err)
		}
		hcas = append(hcas, hca)
	}
	sort.Strings(hcas)
	var b strings.Builder
	b.WriteByte('{')
	for i, hca := range hcas {
		if i > 0 {
			b.WriteByte(',')
		}
		// The name rules leave nothing that JSON escapes.
		b.WriteByte('"')
		b.WriteString(hca)
		b.WriteString(`":"`)
		b.WriteString(m[hca])
		b.WriteByte('"')
	}
	b.WriteByte('}')
	if b.Len() > MaxRailMapBytes {
		return "", fmt.Errorf("rail map of %d bytes exceeds %d", b.Len(), MaxRailMapBytes)
	}
	return b.String(), nil
}

// maxQuoted is how much of an offending value an error message repeats.
const maxQuoted = 64

// Quote is v as an error message repeats it: Go-quoted, and cut after 64
// bytes with the full length said.
func Quote(v string) string {
	if len(v) <= maxQuoted {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%s... (%d bytes)", strconv.Quote(v[:maxQuoted]), len(v))
}

func syntaxError(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("rail map: invalid JSON: %w", err)
}

func tokenKind(tok json.Token) string {
	switch tok.(type) {
	case json.Delim:
		if tok == json.Delim('{') {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}
