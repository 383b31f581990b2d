package staging

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ParseRailMap parses MC_PXN_RAIL_MAP: one JSON object of raw HCA name →
// canonical rail name. HCA names are 1..MaxHCAName and rail names
// 1..MaxRailName bytes of [A-Za-z0-9_.-]. Duplicate keys, anything but string
// values, trailing data, more than MaxRailMapBytes of text and more than
// MaxRailMapEntries entries are errors. An empty string or an empty object
// is no map (nil).
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
		if err := checkRailName("HCA name", hca, MaxHCAName); err != nil {
			return nil, fmt.Errorf("rail map: %w", err)
		}
		if _, dup := m[hca]; dup {
			return nil, fmt.Errorf("rail map: duplicate HCA name %s", quoteValue(hca))
		}
		if len(m) == MaxRailMapEntries {
			return nil, fmt.Errorf("rail map has more than %d entries", MaxRailMapEntries)
		}
		if tok, err = dec.Token(); err != nil {
			return nil, syntaxError(err)
		}
		rail, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("rail map: HCA %s maps to %v, want a string", quoteValue(hca), tokenKind(tok))
		}
		if err := checkRailName("rail name", rail, MaxRailName); err != nil {
			return nil, fmt.Errorf("rail map: HCA %s: %w", quoteValue(hca), err)
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

// CanonicalRail is the rail of hca under railMap: the mapped name, or hca
// itself when it is not mapped.
func CanonicalRail(railMap map[string]string, hca string) string {
	if rail, ok := railMap[hca]; ok {
		return rail
	}
	return hca
}

func checkRailName(what, s string, limit int) error {
	if s == "" || len(s) > limit {
		return fmt.Errorf("%s %s: length %d not in 1..%d", what, quoteValue(s), len(s), limit)
	}
	if i := invalidNameByte(s); i >= 0 {
		return fmt.Errorf("%s %s: byte %d (%+q) not in [A-Za-z0-9_.-]", what, quoteValue(s), i, s[i])
	}
	return nil
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
