// SPDX-License-Identifier: Apache-2.0

package fabric

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/pxn-project/pxn/pkg/memrange"
	"github.com/pxn-project/pxn/pkg/relay"
	"github.com/pxn-project/pxn/pkg/staging"
)

// maxDirectoryJSON bounds what LoadStaticDirectory reads.
const maxDirectoryJSON = 16 << 20

// StaticTarget is one target session of a StaticDirectory, as it appears in
// the directory's JSON form.
type StaticTarget struct {
	Session string `json:"session"`
	// Addr is the TCP address of the session's TargetServer, if it has one.
	Addr   string        `json:"addr,omitempty"`
	HCAs   []string      `json:"hcas"`
	Ranges []StaticRange `json:"ranges"`
}

// StaticRange is a registered range of a StaticTarget.
type StaticRange struct {
	Addr uint64 `json:"addr"`
	Len  uint64 `json:"len"`
}

// StaticDirectory is a relay.Directory over a fixed list of targets. Its JSON
// form, {"targets": [StaticTarget...]}, is what a bench parent hands to its
// children (a file or an environment variable) and what LoadStaticDirectory
// reads.
type StaticDirectory struct {
	list     []StaticTarget
	sessions map[string]staticSession
}

type staticSession struct {
	target relay.Target
	spans  memrange.Spans
}

type staticDirectoryJSON struct {
	Targets []StaticTarget `json:"targets"`
}

var _ relay.Directory = (*StaticDirectory)(nil)

// NewStaticDirectory checks targets and returns a directory of them. Every
// session is unique, non-empty and at most staging.MaxSession bytes, has at
// least one non-empty HCA name and at least one range, and its ranges are
// non-empty, addressable and disjoint.
func NewStaticDirectory(targets []StaticTarget) (*StaticDirectory, error) {
	d := &StaticDirectory{
		list:     make([]StaticTarget, 0, len(targets)),
		sessions: make(map[string]staticSession, len(targets)),
	}
	for i, t := range targets {
		if t.Session == "" || len(t.Session) > staging.MaxSession {
			return nil, fmt.Errorf("fabric: directory target %d: session name of %d bytes, want 1..%d", i, len(t.Session), staging.MaxSession)
		}
		if _, dup := d.sessions[t.Session]; dup {
			return nil, fmt.Errorf("fabric: directory target %d: session %q listed twice", i, t.Session)
		}
		if len(t.HCAs) == 0 {
			return nil, fmt.Errorf("fabric: directory target %q has no HCA", t.Session)
		}
		for _, hca := range t.HCAs {
			if hca == "" {
				return nil, fmt.Errorf("fabric: directory target %q has an empty HCA name", t.Session)
			}
		}
		if len(t.Ranges) == 0 {
			return nil, fmt.Errorf("fabric: directory target %q has no range", t.Session)
		}
		s := staticSession{target: relay.Target{HCAs: slices.Clone(t.HCAs), Ranges: make([]relay.Range, 0, len(t.Ranges))}}
		for _, r := range t.Ranges {
			if !memrange.ValidRange(r.Addr, r.Len) {
				return nil, fmt.Errorf("fabric: directory target %q: invalid range %#x+%d", t.Session, r.Addr, r.Len)
			}
			if s.spans.Overlaps(r.Addr, r.Len) {
				return nil, fmt.Errorf("fabric: directory target %q: range %#x+%d overlaps another", t.Session, r.Addr, r.Len)
			}
			s.spans = s.spans.Insert(memrange.Span{Start: r.Addr, Size: r.Len})
			s.target.Ranges = append(s.target.Ranges, relay.Range{Addr: r.Addr, Len: r.Len})
		}
		d.sessions[t.Session] = s
		d.list = append(d.list, StaticTarget{
			Session: t.Session,
			Addr:    t.Addr,
			HCAs:    slices.Clone(t.HCAs),
			Ranges:  slices.Clone(t.Ranges),
		})
	}
	return d, nil
}

// ReadStaticDirectory reads a directory's JSON form from the file at path.
func ReadStaticDirectory(path string) (*StaticDirectory, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return LoadStaticDirectory(f)
}

// LoadStaticDirectory reads a directory's JSON form. Unknown fields and
// trailing data are errors.
func LoadStaticDirectory(r io.Reader) (*StaticDirectory, error) {
	dec := json.NewDecoder(io.LimitReader(r, maxDirectoryJSON+1))
	dec.DisallowUnknownFields()
	var doc staticDirectoryJSON
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("fabric: decode static directory: %w", err)
	}
	if dec.InputOffset() > maxDirectoryJSON {
		return nil, fmt.Errorf("fabric: static directory exceeds %d bytes", maxDirectoryJSON)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("fabric: static directory has data after its JSON object")
	}
	return NewStaticDirectory(doc.Targets)
}

// MarshalJSON writes the form LoadStaticDirectory reads.
func (d *StaticDirectory) MarshalJSON() ([]byte, error) {
	return json.Marshal(staticDirectoryJSON{Targets: d.Targets()})
}

// Targets returns a copy of the directory's targets in their original order.
func (d *StaticDirectory) Targets() []StaticTarget {
	out := make([]StaticTarget, len(d.list))
	for i, t := range d.list {
		out[i] = StaticTarget{Session: t.Session, Addr: t.Addr, HCAs: slices.Clone(t.HCAs), Ranges: slices.Clone(t.Ranges)}
	}
	return out
}

// Addresses returns session → TCP address for the targets that have one, the
// form TCPHopOptions.Targets takes.
func (d *StaticDirectory) Addresses() map[string]string {
	out := make(map[string]string)
	for _, t := range d.list {
		if t.Addr != "" {
			out[t.Session] = t.Addr
		}
	}
	return out
}

// Resolve returns the HCAs and ranges of session; dst must lie in one of the
// ranges. The returned slices are shared and must not be modified.
func (d *StaticDirectory) Resolve(session string, dst uint64) (relay.Target, error) {
	s, ok := d.sessions[session]
	if !ok {
		return relay.Target{}, fmt.Errorf("%w: %q", ErrUnknownSession, session)
	}
	if s.spans.Find(dst, 1) < 0 {
		return relay.Target{}, fmt.Errorf("%w: session %q dst %#x", ErrOutOfRange, session, dst)
	}
	return s.target, nil
}
